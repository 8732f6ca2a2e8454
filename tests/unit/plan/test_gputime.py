"""The re-plan's GPU seconds per request fitted to NVML's utilisation, and the sampler's window
(serve_app.plan.gputime); which GPUs a report's replicas have on this host (fromrunning)."""

from __future__ import annotations

import copy
import os
import time
from typing import Any

import psutil
import pytest

from serve_app.plan import live
from serve_app.plan.fromrunning import local_gpus
from serve_app.plan.gputime import GpuSampler, fit_to_nvml
from serve_app.plan.targets import ModelTarget
from tests.unit.plan.test_live import PROV, h200_report, h200_window


def _gpu_entry() -> dict[str, Any]:
    """The H200 replica's live entry: 4,848 requests over its model thread's 4.277 busy s."""
    r = h200_report()
    t = live.Traffic(requests=4848, how="counted", p99_s=0.1, p99_how="the metrics' p99")
    target = ModelTarget(p99_target_s=0.1, load_rps=800, max_replicas=8)
    return live.live_model_entry(h200_window(r), t, live.gpu_memory_live([r]), target, 1.0, PROV)


def test_the_busy_time_is_scaled_down_to_what_nvml_saw() -> None:
    a, b = _gpu_entry(), _gpu_entry()
    cpu = copy.deepcopy(a)
    cpu["candidates"][0]["gpu_s_per_request"] = 0.0  # a CPU application beside them
    before = a["candidates"][0]["gpu_s_per_request"]
    models = {"a": a, "b": b, "cpu": cpu}
    # The model threads were busy 3 + 1 s; NVML saw the GPU busy 1 s of the window.
    note = fit_to_nvml(models, {"a": 3.0, "b": 1.0, "cpu": 2.0}, 1.0)
    assert note is not None and "0.2500" in note
    assert a["candidates"][0]["gpu_s_per_request"] == pytest.approx(before / 4)
    assert b["candidates"][0]["gpu_s_per_request"] == pytest.approx(before / 4)
    assert cpu["candidates"][0]["gpu_s_per_request"] == 0.0
    assert "times 0.2500: NVML's utilisation" in a["sources"]["gpu_s_per_request"]
    assert "times" not in cpu["sources"]["gpu_s_per_request"]


def test_never_up_and_nothing_without_a_reading() -> None:
    e = _gpu_entry()
    before = e["candidates"][0]["gpu_s_per_request"]
    assert fit_to_nvml({"a": e}, {"a": 1.0}, 5.0) is not None  # busier than the threads
    assert e["candidates"][0]["gpu_s_per_request"] == pytest.approx(before)
    assert fit_to_nvml({"a": e}, {"a": 1.0}, None) is None
    assert fit_to_nvml({"a": e}, {"a": 0.0}, 1.0) is None


def test_the_sampler_window_means_each_gpus_samples() -> None:
    s = GpuSampler(["GPU-a", "GPU-b"])
    s.samples = {"GPU-a": [(1.0, 50), (2.0, 100), (9.0, 0)], "GPU-b": [(1.5, 20)]}
    assert s.busy_s(0.0, 4.0) == pytest.approx(0.75 * 4 + 0.2 * 4)
    assert s.busy_s(3.0, 4.0) is None  # a GPU without a sample in the window
    assert GpuSampler([]).busy_s(0.0, 1.0) is None


def test_without_nvml_utilisation_the_sampler_reads_nothing(monkeypatch: Any) -> None:
    from serve_app.gpu import nvml

    def unsupported(uuid: str) -> Any:
        return nvml.NvmlError(nvml.NvmlErrorKind.NOT_SUPPORTED, "none here")

    monkeypatch.setattr(nvml, "utilization_and_name", unsupported)
    with GpuSampler(["GPU-a"]) as s:
        begin = time.perf_counter()
        time.sleep(0.3)
    assert s.busy_s(begin, time.perf_counter()) is None


def test_local_gpus_only_where_every_replica_runs_here() -> None:
    me = {"pid": os.getpid(), "process_started_at_s": psutil.Process().create_time()}
    report = {"replicas": [me | {"gpu_mode": "cuda"}], "gpus": [{"uuid": "GPU-x"}, {}]}
    assert local_gpus(report) == ["GPU-x"]
    elsewhere = {"pid": 1, "process_started_at_s": 0.0, "gpu_mode": "cuda"}
    assert local_gpus(report | {"replicas": [me | {"gpu_mode": "cuda"}, elsewhere]}) == []
    assert local_gpus(report | {"replicas": [me | {"gpu_mode": "cpu"}]}) == []
