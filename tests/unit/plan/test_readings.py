"""Readings of serve-app plan --measure turned into the measurements file's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from serve_app.plan.measurements import Measurements, budget_bytes, to_problem
from serve_app.plan.readings import (
    CandidateReading,
    LoopReading,
    MemoryFigures,
    calibration_probes,
    cpu_memory,
    gpu_memory,
    measurements_doc,
    model_entry,
    percentile,
    startup_left,
    with_serving_peaks,
)
from serve_app.plan.targets import ModelTarget

MIB = 1 << 20
PROV = "measured by serve-app plan --measure at abc1234 on host/NVIDIA H200"


def loop(requests: int, window_s: float = 10.0, **kw: Any) -> LoopReading:
    base: dict[str, Any] = dict(
        concurrency=4,
        requests=requests,
        errors=0,
        window_s=window_s,
        p50_s=0.01,
        p99_s=0.02,
        replica_cpu_s=requests * 0.002,
        batch_busy_s=requests * 0.001,
        gpu_busy_s=requests * 0.0005,
        client_cpu_fraction=0.3,
        ingress_cpu_s=requests * 0.0004,
        ingress_cpu_s_by_kind={"haproxy": requests * 0.0004},
        ingress_processes_by_kind={"haproxy": 1, "ray-proxy": 1},
    )
    return LoopReading(**(base | kw))


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 99) == 99.0 and percentile(values, 50) == 50.0
    assert percentile([0.5], 99) == 0.5 and percentile([], 99) is None
    assert percentile([3.0, 1.0, 2.0], 100) == 3.0


def test_gpu_memory_splits_calibrations_peaks() -> None:
    # Start-up: 700 MiB context, 128 MiB weights, a 300 MiB graph pool; calibration's peaks
    # (reserved + the overhead then, 650 MiB) at 1, 2, 4.
    first = {
        "non_torch_overhead_bytes": 690 * MIB,
        "reserved_bytes": 428 * MIB,
        "cuda_graph_pool_bytes": 300 * MIB,
    }
    last = {
        "non_torch_overhead_bytes": 720 * MIB,
        "reserved_bytes": 900 * MIB,
        "cuda_graph_pool_bytes": 340 * MIB,
    }
    probes = {
        1: (650 + 300 + 128 + 2) * MIB,
        2: (650 + 300 + 128 + 4) * MIB,
        4: (650 + 300 + 128 + 9) * MIB,
    }
    m = gpu_memory(first, last, probes, overhead_then_bytes=650 * MIB)
    assert m.context_bytes == 720 * MIB  # the larger, after the loads
    assert m.graph_pool_bytes == 340 * MIB
    assert m.weights_bytes == 128 * MIB  # reserved after start-up less the pool then
    assert m.activation_peak_bytes == {1: 2 * MIB, 2: 4 * MIB, 4: 9 * MIB}
    # The four parts hold each measured peak, plus what overhead and pool grew by after it.
    for n, peak in probes.items():
        parts = m.context_bytes + m.weights_bytes + m.graph_pool_bytes
        grown = (720 - 650) * MIB + (340 - 300) * MIB
        assert parts + m.activation_peak_bytes[n] == peak + grown


def test_gpu_memory_never_makes_an_activation_negative() -> None:
    # Warm-up left 50 MiB cached after start-up: reserved over-counts the weights, and the
    # smallest probe bounds them.
    first = {"non_torch_overhead_bytes": 500 * MIB, "reserved_bytes": 180 * MIB}
    last = {"non_torch_overhead_bytes": 500 * MIB}
    probes = {8: (500 + 130) * MIB, 16: (500 + 140) * MIB}
    m = gpu_memory(first, last, probes, 500 * MIB)
    assert m.weights_bytes == 130 * MIB and m.graph_pool_bytes == 0
    assert m.activation_peak_bytes == {8: 0, 16: 10 * MIB}
    with pytest.raises(ValueError, match="no calibration probe"):
        gpu_memory(first, last, {}, 0)


def test_calibration_probes_reads_the_newest_matching_entry(tmp_path: Path) -> None:
    def entry(name: str, model: str, cap: int, at: float, probes: list[list[Any]]) -> None:
        doc = {
            "format": 1,
            "key": {"model_name": model, "cap_bytes": cap},
            "written_at_s": at,
            "result": {"overhead_bytes": 7, "probes": probes},
        }
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))

    entry("a", "m", 100, 1.0, [[1, 10]])
    entry("b", "m", 100, 2.0, [[1, 11], [2, 12], [4, None]])
    entry("c", "other", 100, 3.0, [[1, 99]])
    entry("d", "m", 200, 4.0, [[1, 99]])
    (tmp_path / "junk.json").write_text("{not json")
    got = calibration_probes(tmp_path, {"model_name": "m", "cap_bytes": 100})
    assert got is not None
    probes, overhead, path = got
    assert probes == {1: 11, 2: 12} and overhead == 7 and path.name == "b.json"
    assert calibration_probes(tmp_path, {"model_name": "m", "cap_bytes": 300}) is None
    assert calibration_probes(tmp_path, {"model_name": "m", "dtype": "float16"}) is None
    assert calibration_probes(tmp_path / "none", {"model_name": "m"}) is None


def test_a_gpu_model_entry_validates_and_cites_the_run() -> None:
    memory = gpu_memory(
        {"non_torch_overhead_bytes": 500 * MIB, "reserved_bytes": 100 * MIB},
        {"non_torch_overhead_bytes": 500 * MIB},
        {16: 610 * MIB, 32: 620 * MIB},
        500 * MIB,
    )
    readings = [
        CandidateReading(32, loop(6000), loop(100, p99_s=0.015)),
        CandidateReading(16, loop(4000, replica_cpu_s=4.0), loop(100, p99_s=0.012)),
    ]
    target = ModelTarget(p99_target_s=0.1, load_rps=300, max_replicas=4)
    e = model_entry(memory, readings, target, 1.0, on_gpu=True, provenance=PROV)
    assert [c["batch_size"] for c in e["candidates"]] == [32, 16]
    assert e["candidates"][0]["throughput_rps"] == 600.0
    assert e["candidates"][1]["p99_idle_s"] == 0.012
    assert e["candidates"][0]["gpu_s_per_request"] == pytest.approx(0.0005)  # NVML's
    assert e["cpu_s_per_request"] == pytest.approx(0.001)  # the least: 4 s / 4000
    assert e["ingress_cpu_s_per_request"] == pytest.approx(0.0004)
    assert "haproxy, ray-proxy" in e["sources"]["ingress_cpu_s_per_request"]
    assert e["activation_peak_bytes"] == {"16": 10 * MIB, "32": 20 * MIB}
    assert e["load_rps"] == 300 and e["max_replicas"] == 4 and e["p99_target_s"] == 0.1
    for field in ("context_bytes", "weights_bytes", "throughput_rps", "cpu_s_per_request"):
        assert e["sources"][field].startswith(PROV + ": ")
    assert e["sources"]["ingress_cpu_s_per_request"].startswith(PROV + ": ")
    doc = measurements_doc(
        models={"embeddings": e},
        gpu={"name": "NVIDIA H200", "total_bytes": 150754820096, "cores": 16, "count": 1},
        margin_fraction=0.1,
        reserve={"memory_bytes": 0, "cores": 4, "gpu_time": 0.05},
        notes=["n"],
    )
    m = Measurements.model_validate(json.loads(json.dumps(doc)))
    spec = m.models["embeddings"]
    assert budget_bytes(spec, 32, 0.0) == 620 * MIB  # calibration's peak at 32 exactly
    (ask,) = to_problem(m).models
    assert {c.batch_size for c in ask.candidates} == {16, 32}
    assert ask.ingress_cpu_s_per_request == pytest.approx(0.0004)


def test_without_nvml_the_model_threads_busy_time_stands_in() -> None:
    memory = gpu_memory(
        {"non_torch_overhead_bytes": 0, "reserved_bytes": 0},
        {"non_torch_overhead_bytes": 0},
        {8: MIB},
        0,
    )
    readings = [CandidateReading(8, loop(1000, gpu_busy_s=None), loop(10))]
    e = model_entry(memory, readings, ModelTarget(p99_target_s=1), 1.0, True, PROV)
    assert e["candidates"][0]["gpu_s_per_request"] == pytest.approx(0.001)
    assert "upper bound" in e["sources"]["gpu_s_per_request"]
    assert "load_rps" not in e and e["weight"] == 1.0


def test_a_cpu_model_entry_says_what_it_did_not_measure() -> None:
    readings = [CandidateReading(8, loop(500), loop(20)), CandidateReading(4, loop(400), loop(20))]
    e = model_entry(cpu_memory(400 * MIB), readings, ModelTarget(p99_target_s=2), 0.5, False, PROV)
    assert e["weights_bytes"] == 400 * MIB and e["context_bytes"] == 0
    assert e["activation_peak_bytes"] == {"4": 0, "8": 0}
    assert all(c["gpu_s_per_request"] == 0.0 for c in e["candidates"])
    assert e["sources"]["gpu_s_per_request"].endswith("no GPU: 0")
    assert "RSS" in e["sources"]["weights_bytes"]


def test_a_window_with_no_answer_is_refused() -> None:
    readings = [CandidateReading(8, loop(0), loop(20))]
    with pytest.raises(ValueError, match=r"batch sizes \[8\]"):
        model_entry(cpu_memory(MIB), readings, ModelTarget(p99_target_s=2), 1.0, False, PROV)
    idle_none = [CandidateReading(8, loop(10), loop(0, p99_s=None))]
    with pytest.raises(ValueError, match="no request was answered"):
        model_entry(cpu_memory(MIB), idle_none, ModelTarget(p99_target_s=2), 1.0, False, PROV)


def test_the_ingress_cost_is_the_least_per_request_and_a_window_without_it_is_refused() -> None:
    readings = [
        CandidateReading(8, loop(500, ingress_cpu_s=0.5), loop(20)),  # 1 ms a request
        CandidateReading(4, loop(400, ingress_cpu_s=0.2), loop(20)),  # 0.5 ms: the least
    ]
    e = model_entry(cpu_memory(MIB), readings, ModelTarget(p99_target_s=2), 1.0, False, PROV)
    assert e["ingress_cpu_s_per_request"] == pytest.approx(0.0005)
    blind = [readings[0], CandidateReading(4, loop(400, ingress_processes_by_kind={}), loop(20))]
    with pytest.raises(ValueError, match=r"no ingress process .* at batch sizes \[4\]"):
        model_entry(cpu_memory(MIB), blind, ModelTarget(p99_target_s=2), 1.0, False, PROV)


def test_serving_peaks_raise_an_activation_peak_that_calibration_underestimated() -> None:
    memory = MemoryFigures(
        context_bytes=800 * MIB,
        weights_bytes=130 * MIB,
        graph_pool_bytes=130 * MIB,
        activation_peak_bytes={64: 100 * MIB, 128: 200 * MIB, 256: 400 * MIB},
        how={"activation_peak_bytes": "calibration"},
    )
    fixed = 1060 * MIB
    readings = [
        # At 256 the replica held 1,500 MiB while it served: 440 MiB of activations, not 400.
        CandidateReading(256, loop(100, replica_nvml_peak_bytes=1500 * MIB), loop(10)),
        # At 128 NVML saw less than calibration's figure: calibration's stands.
        CandidateReading(128, loop(100, replica_nvml_peak_bytes=fixed + 150 * MIB), loop(10)),
        # At 64 the idle window's sample is the higher one; no NVML at all is no change.
        CandidateReading(
            64,
            loop(100, replica_nvml_peak_bytes=fixed + 90 * MIB),
            loop(10, replica_nvml_peak_bytes=fixed + 120 * MIB),
        ),
    ]
    got = with_serving_peaks(memory, readings)
    assert got.activation_peak_bytes == {64: 120 * MIB, 128: 200 * MIB, 256: 440 * MIB}
    assert "raised to NVML's peak" in got.how["activation_peak_bytes"]
    assert "[64, 256]" in got.how["activation_peak_bytes"]
    assert got.context_bytes == memory.context_bytes and got.weights_bytes == memory.weights_bytes
    # Nothing above calibration (or no NVML reading): the figures are returned as they were.
    assert with_serving_peaks(memory, [CandidateReading(64, loop(5), loop(5))]) is memory


def test_startup_left_names_each_replica_with_graphs_or_warm_up_batches_to_go() -> None:
    replicas = [
        {"application": "images", "replica_id": "a", "cuda_graphs_pending": 6},
        {"application": "images", "replica_id": "b", "cuda_graphs_pending": 0},
        {"application": "text", "replica_id": "c", "warmup_pending": 2},
        {"application": "text", "replica_id": "d"},  # a CPU replica reports neither
    ]
    assert startup_left(replicas) == [
        "images/a (6 graphs, 0 warm-up batches)",
        "text/c (0 graphs, 2 warm-up batches)",
    ]
    assert startup_left([]) == []
