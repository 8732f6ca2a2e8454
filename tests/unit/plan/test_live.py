"""A running server's reports turned into measurements (serve_app.plan.live and the pure part of
serve_app.plan.fromrunning), on reports a real server wrote: an H200 replica's report
(committed by plan --measure) and two reads of a CPU server's GET /v1/memory and Ray's metrics
4 s apart (captured from tests/integration/test_plan_from_running.py's server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from serve_app.errors import ConfigError
from serve_app.gpu.budget import GRAPH_MIN_ROOM_BYTES
from serve_app.plan import live
from serve_app.plan.fromrunning import build_measurements
from serve_app.plan.hostprocs import HostFacts, Threads, server_cores, thread_seconds
from serve_app.plan.measurements import Measurements, budget_bytes
from serve_app.plan.scrape import decisions, mean_items, parse, request_window
from serve_app.plan.solver import TAIL
from serve_app.plan.targets import ModelTarget, Targets

ROOT = Path(__file__).resolve().parents[3]
H200_READINGS = ROOT / "benchmarks/results/planmeasure/rag-stack-h200-4653ea1/readings.json"
CPU_WINDOW = ROOT / "tests" / "fixtures" / "live_cpu_window.json"
URL = "http://127.0.0.1:8000"
PROV = f"read from the running server at {URL}"


def h200_report() -> dict[str, Any]:
    report: dict[str, Any] = json.loads(H200_READINGS.read_text())["models"]["embeddings"]["report"]
    return report


def cpu_window() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(CPU_WINDOW.read_text())
    return doc


def h200_window(report: dict[str, Any]) -> live.AppWindow:
    """The H200 replica over plan --measure's saturated window at its cap of 256 (readings.json:
    4,848 requests of 16 texts in 6 s, the model thread busy 4.277 s; batches: the items over
    the report's mean batch, 126,208 / 1,814)."""
    items = 4848 * 16
    return live.AppWindow(
        name="embeddings",
        replicas=[report],
        paired=1,
        seconds=6.0,
        batches=round(items / (126208 / 1814)),
        items=items,
        busy_s=4.276875,
        refused=0,
        largest_batch=256,
        cap=256,
    )


def test_gpu_memory_from_a_real_h200_report() -> None:
    r = h200_report()
    m = live.gpu_memory_live([r])
    assert m.context_bytes == r["non_torch_overhead_bytes"] == 882_900_992
    assert m.graph_pool_bytes == r["cuda_graph_pool_bytes"] == 136_314_880
    # torch's allocated bytes between batches (154 MB), under reserved less the pool (180 MB)
    assert m.weights_bytes == r["allocated_bytes"] == 154_422_784
    # Serving's peak reserved (317 MB) leaves 26 MB of activations; calibration's worst case at
    # the cap in force (256) needed more, so it holds: the parts add up to calibration's peak.
    parts = m.context_bytes + m.weights_bytes + m.graph_pool_bytes
    assert parts + m.activation_peak_bytes[256] == r["calibration_peak_bytes"]
    assert parts + m.activation_peak_bytes[256] >= r["nvml_process_bytes"]
    assert "calibration's peak" in m.how["activation_peak_bytes"]
    # A cap other than calibration's: the peak seen only, which is what NVML saw (context +
    # peak reserved = 1,199,570,944 bytes, NVML's figure to the byte).
    other = live.gpu_memory_live([r | {"max_batch_size": 128}])
    assert parts + other.activation_peak_bytes[128] == r["nvml_process_bytes"]
    assert "raised" not in other.how["activation_peak_bytes"]
    # NVML seeing more than torch's peak and the context raises it.
    more = live.gpu_memory_live([r | {"max_batch_size": 128, "nvml_process_bytes": 2 << 30}])
    assert parts + more.activation_peak_bytes[128] == 2 << 30
    assert "raised to NVML's process bytes" in more.how["activation_peak_bytes"]


def test_the_gpu_total_is_the_one_the_share_was_taken_of() -> None:
    r = h200_report()
    doc = {"gpus": [{"uuid": r["gpu_uuid"], "total_bytes": 150_754_820_096}]}
    gpu, how = live.gpu_entry(doc, [r], cores_per_gpu=16.0)
    assert gpu["total_bytes"] == 150_109_880_320  # CUDA's total (NVML's less the driver's)
    assert gpu["count"] == 1 and gpu["cores"] == 16.0 and "budget_bytes / num_gpus" in how
    with pytest.raises(ValueError, match="--cores-per-gpu"):
        live.gpu_entry(doc, [r], cores_per_gpu=None)


def test_a_gpu_entry_estimates_saturation_from_the_busy_fraction() -> None:
    r = h200_report()
    w = h200_window(r)
    t = live.Traffic(requests=4848, how="counted", p99_s=0.1, p99_how="the metrics' p99")
    target = ModelTarget(p99_target_s=0.1, load_rps=800, max_replicas=8)
    e = live.live_model_entry(w, t, live.gpu_memory_live([r]), target, 1.0, PROV)
    (cand,) = e["candidates"]
    # 4,848 requests over 4.277 busy seconds: what the replica would carry busy all the time.
    assert cand["throughput_rps"] == pytest.approx(4848 / 4.276875)
    # The p99 seen at the rate seen, less the solver's tail there: the plan predicts 0.1 s.
    rate = 4848 / w.seconds
    tail_s = TAIL / (cand["throughput_rps"] - rate)
    assert cand["batch_size"] == 256 and cand["p99_idle_s"] == pytest.approx(0.1 - tail_s)
    assert "less the solver's tail" in e["sources"]["p99_idle_s"]
    assert cand["gpu_s_per_request"] == pytest.approx(4.276875 / 4848)
    # Not read on this host: the CPU figure is an assumption that binds no lower.
    assert "ASSUMPTION" in e["sources"]["cpu_s_per_request"]
    assert e["cpu_s_per_request"] == pytest.approx(1.0 / cand["throughput_rps"])
    for field in ("context_bytes", "weights_bytes", "throughput_rps", "p99_idle_s"):
        assert e["sources"][field].startswith(PROV), field
    assert "estimate from live traffic" in e["sources"]["throughput_rps"]
    gpu, _ = live.gpu_entry({}, [r], 16.0)
    doc = live.measurements_live(
        models={"embeddings": e}, gpu=gpu, mps=False, margin_fraction=0.1, reserve={}, notes=[]
    )
    spec = Measurements.model_validate(doc).models["embeddings"]
    parts = spec.context_bytes + spec.weights_bytes + spec.graph_pool_bytes
    assert parts + spec.activation_peak_bytes[256] == r["calibration_peak_bytes"]
    # Measured with graphs: the budget also leaves them the room a replica needs to capture.
    room = spec.context_bytes + spec.weights_bytes + GRAPH_MIN_ROOM_BYTES
    assert budget_bytes(spec, 256, 0.0) == max(r["calibration_peak_bytes"], room)


def test_no_p99_read_is_an_assumption_of_two_batch_times() -> None:
    w = h200_window(h200_report())
    t = live.Traffic(requests=4848, how="estimated")
    e = live.live_model_entry(
        w, t, live.gpu_memory_live(w.replicas), ModelTarget(p99_target_s=0.1), 1.0, PROV
    )
    assert e["candidates"][0]["p99_idle_s"] == pytest.approx(2 * w.busy_s / w.batches)
    assert "ASSUMPTION: no p99 read" in e["sources"]["p99_idle_s"]


def test_a_busier_thread_than_the_model_bounds_the_rate() -> None:
    """The H200 window's model thread was busy 0.713 of it; a thread of the process (an event
    loop) at 0.9 saturates first: the rate is over its busy seconds, and the source says so."""
    r = h200_report()
    w = h200_window(r)
    target = ModelTarget(p99_target_s=0.1)
    for thread, bound in ((0.9, True), (0.5, False), (None, False)):
        t = live.Traffic(
            requests=4848,
            how="counted",
            busiest_thread_fraction=thread,
            busiest_thread_name="ServeReplica:em",
        )
        busy_s, by_thread = live.bound_busy_s(w, t)
        assert by_thread is bound
        e = live.live_model_entry(w, t, live.gpu_memory_live([r]), target, 1.0, PROV)
        source = e["sources"]["throughput_rps"]
        if bound:
            assert busy_s == pytest.approx(0.9 * 6.0)
            assert e["candidates"][0]["throughput_rps"] == pytest.approx(4848 / (0.9 * 6.0))
            assert "busiest thread (ServeReplica:em: 0.900" in source
        else:
            assert busy_s == w.busy_s
            assert e["candidates"][0]["throughput_rps"] == pytest.approx(4848 / w.busy_s)
            assert ("busiest other thread 0.500" in source) is (thread is not None)
            assert ("threads not read" in source) is (thread is None)
        # The GPU's share per request stays the model thread's.
        assert e["candidates"][0]["gpu_s_per_request"] == pytest.approx(w.busy_s / 4848)


def test_threads_busiest_is_the_mean_of_each_process_top_thread() -> None:
    a, b = ("r1", 101), ("r2", 102)
    threads = Threads(
        before={a: {1: 10.0, 2: 5.0}, b: {7: 1.0, 8: 0.0}},
        # thread 3 started inside the window: not judged; r3 was not read before
        after={a: {1: 11.8, 2: 5.5, 3: 9.0}, b: {7: 1.4, 8: 1.0}, ("r3", 103): {9: 50.0}},
        window_s=2.0,
    )
    fraction, _ = threads.busiest([a, b, ("r3", 103)]) or (None, "")
    assert fraction == pytest.approx((1.8 / 2.0 + 1.0 / 2.0) / 2)
    assert threads.busiest([("r3", 103)]) is None
    assert Threads().busiest([a]) is None


def test_thread_seconds_reads_this_process_threads() -> None:
    """A real thread that burns CPU is this process's busiest over the window, by name."""
    import os
    import threading
    import time

    import psutil

    me = psutil.Process()
    rep = {"replica_id": "me", "pid": os.getpid(), "process_started_at_s": me.create_time()}
    key = ("me", os.getpid())
    stop = threading.Event()

    def burn() -> None:
        while not stop.is_set():
            sum(range(1000))

    worker = threading.Thread(target=burn, name="burner")
    worker.start()
    try:
        time.sleep(0.05)
        before, t0 = thread_seconds([rep]), time.monotonic()
        time.sleep(0.5)
        after = thread_seconds([rep])
        window = Threads(before, after, time.monotonic() - t0)
    finally:
        stop.set()
        worker.join()
    assert worker.native_id in before[key] and worker.native_id in after[key]
    fraction, _ = window.busiest([key]) or (0.0, "")
    burned = after[key][worker.native_id] - before[key][worker.native_id]
    assert burned > 0.05 and fraction >= burned / window.window_s - 1e-9


def test_the_servers_cores_are_its_replicas_affinity_not_this_process() -> None:
    import os

    import psutil

    class Pinned:
        def __init__(self, cores: list[int] | None) -> None:
            self.cores = cores

        def cpu_affinity(self) -> list[int]:
            if self.cores is None:
                raise psutil.AccessDenied(1)
            return self.cores

    assert server_cores([Pinned([0, 1]), Pinned([1, 2]), None, Pinned(None)]) == {0, 1, 2}
    assert server_cores([psutil.Process()]) == set(os.sched_getaffinity(0))
    assert server_cores([None, Pinned(None)]) == set(os.sched_getaffinity(0))  # none readable


def test_too_little_traffic_is_refused_naming_what_was_seen() -> None:
    w = h200_window(h200_report())
    quiet = live.AppWindow(**{**w.__dict__, "batches": 3, "busy_s": 0.01})
    with pytest.raises(live.NotEnoughTraffic, match="3 batches, 40 requests") as exc:
        live.saturation_rps(quiet, live.Traffic(requests=40, how="counted"))
    assert "lengthen --window-s" in str(exc.value)


def test_a_cpu_window_of_a_real_server_becomes_measurements() -> None:
    raw = cpu_window()
    (app,) = raw["config"]["applications"]
    name = app["name"]
    w = live.app_window(
        name, live.by_application(raw["first"])[name], live.by_application(raw["last"])[name]
    )
    assert w.paired == 1 and w.batches >= live.MIN_BATCHES and w.busy_s > 0
    assert w.items == sum(w.items_by_replica.values())
    texts = (raw["metrics_first"], raw["metrics_last"])
    rw = request_window(parse(texts[0]), parse(texts[1]), name)
    assert rw.p99_s is not None and rw.p99_s <= 10
    per_request = mean_items(parse(texts[1]), name)
    assert per_request == 4.0  # the integration test's requests carry 4 texts each
    requests = w.items / per_request
    (rep,) = raw["last"]["replicas"]
    key = (rep["replica_id"], rep["pid"])
    host = HostFacts(
        cpu_before={key: 10.0},
        cpu_after={key: 12.5},
        rss_bytes={key: 300 << 20},
        all_local=True,
        memory_bytes=8 << 30,
        cores=2.0,
    )
    targets = Targets.model_validate({"models": {name: {"p99_target_s": 2.0, "load_rps": 3}}})
    doc, windows = build_measurements(
        raw["config"], targets, raw["first"], raw["last"], texts, host, url=URL, window_s=4.0
    )
    spec = Measurements.model_validate(doc).models[name]
    (cand,) = spec.candidates
    assert cand.batch_size == rep["max_batch_size"] and cand.gpu_s_per_request == 0
    assert cand.throughput_rps == pytest.approx(requests / w.busy_s)
    assert rw.p99_s is not None and cand.p99_idle_s <= rw.p99_s  # less the tail at the rate seen
    assert spec.cpu_s_per_request == pytest.approx(2.5 / requests)
    assert "4.00 items a request" in spec.sources["throughput_rps"]
    assert spec.weights_bytes == 300 << 20 and spec.context_bytes == 0
    assert doc["gpus"] == [
        {"name": "CPU (no GPU): host memory", "total_bytes": 8 << 30, "cores": 2.0}
    ]
    assert windows[name].batches == w.batches
    # Without the metrics: the requests from the items over the targets' items per request.
    doc, _ = build_measurements(
        raw["config"], targets, raw["first"], raw["last"], None, host, url=URL, window_s=4.0
    )
    source = doc["models"][name]["sources"]
    assert "16 items a request" in source["throughput_rps"]
    assert "ASSUMPTION" in source["p99_idle_s"]


def test_the_same_read_twice_has_no_traffic_to_estimate_from() -> None:
    raw = cpu_window()
    name = raw["config"]["applications"][0]["name"]
    targets = Targets.model_validate({"models": {name: {"p99_target_s": 2.0}}})
    host = HostFacts({}, {}, {}, True, 8 << 30, 2.0)
    with pytest.raises(ConfigError, match=f"application {name}: too little traffic"):
        build_measurements(
            raw["config"], targets, raw["last"], raw["last"], None, host, url=URL, window_s=4.0
        )


def test_metrics_p99_is_interpolated_within_its_bucket() -> None:
    def expo(counts: dict[str, int], total: int, items: int = 0) -> str:
        lines = ["# TYPE ray_serve_app_request_seconds_bucket gauge"]
        for le, n in counts.items():
            tags = f'application="a",replica="r1",le="{le}"'
            lines.append(f"ray_serve_app_request_seconds_bucket{{{tags}}} {n}")
        lines.append("# TYPE ray_serve_app_request_seconds_count gauge")
        lines.append(f'ray_serve_app_request_seconds_count{{application="a"}} {total}')
        lines.append("# TYPE ray_serve_app_request_items_sum gauge")
        lines.append(f'ray_serve_app_request_items_sum{{application="a"}} {items}')
        lines.append("# TYPE ray_serve_app_request_items_count gauge")
        lines.append(f'ray_serve_app_request_items_count{{application="a"}} {total}')
        lines.append("# TYPE ray_serve_app_autoscale_decisions_total counter")
        tags = 'application="a",deployment="d",decision="up",reason="scale_up"'
        lines.append(f"ray_serve_app_autoscale_decisions_total{{{tags}}} 2")
        return "\n".join(lines) + "\n"

    before = parse(expo({"0.01": 10, "0.1": 10, "+Inf": 10}, 10))
    after = parse(expo({"0.01": 100, "0.1": 109, "+Inf": 110}, 110, items=440))
    rw = request_window(before, after, "a")
    # 100 requests between the scrapes, 90 under 10 ms, 99 under 100 ms: the 99th is the 9th
    # of the 9 in (0.01, 0.1], so at its top, as histogram_quantile reads it.
    assert rw.requests == 100 and rw.p99_s == pytest.approx(0.1)
    assert "between the scrapes" in rw.p99_note and "interpolated" in rw.p99_note
    slow = parse(expo({"0.01": 100, "0.1": 100, "+Inf": 110}, 110))
    assert request_window(before, slow, "a").p99_s == 0.1  # past the last bound: said
    assert "above the largest bucket" in request_window(before, slow, "a").p99_note
    # Ray's endpoint not refreshed in the window, or without the series at first: the p99 of
    # the requests so far (110: rank 108.9, the 8.9th of the 9 in the bucket), said.
    stale = request_window(after, after, "a")
    assert (
        stale.p99_s == pytest.approx(0.01 + 0.09 * 8.9 / 9)
        and "had not refreshed" in stale.p99_note
    )
    fresh = request_window([], after, "a")
    assert fresh.p99_s == stale.p99_s and "had none at the first scrape" in fresh.p99_note
    # 200 requests, 150 under 0.1 s, all under 1 s: rank 198 is the 48th of the 50 in (0.1, 1].
    zero = parse(expo({"0.01": 10, "0.1": 10, "1": 10, "+Inf": 10}, 10))
    mid = parse(expo({"0.01": 10, "0.1": 160, "1": 210, "+Inf": 210}, 210))
    assert request_window(zero, mid, "a").p99_s == pytest.approx(0.1 + 0.9 * 48 / 50)
    assert request_window([], [], "a").p99_s is None
    assert mean_items(after, "a") == 4.0 and mean_items(before, "a") is None
    assert decisions(after, "a") == {"up/scale_up": 2.0}


def test_the_command_refuses_a_missing_targets_file_and_a_short_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from serve_app.ops.cli import main

    raw = cpu_window()
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(raw["config"]))  # JSON is YAML
    argv = ["plan", str(config), "--from-running", URL, "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert "--from-running needs --targets FILE" in capsys.readouterr().err
    targets = tmp_path / "targets.yaml"
    targets.write_text(json.dumps({"models": {"fromrun": {"p99_target_s": 1.0}}}))
    assert main([*argv, "--targets", str(targets), "--window-s", "0.5"]) == 2
    assert "--window-s 0.5: at least 1 s" in capsys.readouterr().err
