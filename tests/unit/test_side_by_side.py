"""The pure parts of load_tests.side_by_side and load_tests.render_benchmarks: which rate points
count as sustained, the sweep plan, ratios, memory peaks, cluster plan, merging, markdown."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import pytest

from load_tests import bench
from load_tests import side_by_side as sbs
from load_tests.render_benchmarks import render_markdown


def summary(
    rate: float,
    thru: float | None = None,
    p99: float | None = 0.05,
    p50: float = 0.01,
    error_rate: float = 0.0,
    requests: int = 100,
    **extra: Any,
) -> dict[str, Any]:
    thru = rate if thru is None else thru
    latency = None if p99 is None else {"p50": p50, "p99": p99}
    return {
        "offered_rate_per_s": rate,
        "scheduled_rate_per_s": rate,
        "throughput_per_s": thru,
        "requests": requests,
        "ok": int(requests * (1 - error_rate)),
        "error_rate": error_rate,
        "latency_s": latency,
        **extra,
    }


# --------------------------------------------------------------------------- point_passes


def test_point_passes_under_target() -> None:
    assert sbs.point_passes(summary(100, p99=0.099), 0.1)


def test_point_fails_over_target() -> None:
    assert not sbs.point_passes(summary(100, p99=0.1001), 0.1)


def test_point_at_target_exactly_passes() -> None:
    assert sbs.point_passes(summary(100, p99=0.1), 0.1)


def test_point_fails_on_errors_over_limit() -> None:
    assert sbs.point_passes(summary(100, error_rate=0.01), 0.1, max_error_rate=0.01)
    assert not sbs.point_passes(summary(100, error_rate=0.011), 0.1, max_error_rate=0.01)


def test_point_fails_when_throughput_falls_behind() -> None:
    # 79/s completed of 100/s scheduled: under the 80% floor even with a good p99.
    assert not sbs.point_passes(summary(100, thru=79.0), 0.1)
    assert sbs.point_passes(summary(100, thru=80.0), 0.1)


def test_point_fails_without_requests_or_latency() -> None:
    assert not sbs.point_passes(summary(100, requests=0), 0.1)
    assert not sbs.point_passes(summary(100, p99=None), 0.1)


def test_point_passes_on_real_bench_summary() -> None:
    records = [bench.Record(i * 0.01, 0.02, 200, None, 0.0) for i in range(100)]
    s = asdict(bench.summarise(records, 100.0, 1.0))
    assert sbs.point_passes(s, 0.05)
    assert not sbs.point_passes(s, 0.01)


# --------------------------------------------------------------------------- best / point_at


def test_best_sustained_picks_highest_passing_throughput() -> None:
    points = [
        summary(100, p99=0.01),
        summary(200, thru=199.0, p99=0.02, p50=0.005),
        summary(400, thru=390.0, p99=0.5),  # over target
        summary(283, thru=280.0, p99=0.09, p50=0.03),
    ]
    best = sbs.best_sustained(points, 0.1)
    assert best == {
        "throughput_per_s": 280.0,
        "offered_rate_per_s": 283.0,
        "p50_s": 0.03,
        "p99_s": 0.09,
        "error_rate": 0.0,
    }


def test_best_sustained_none_when_nothing_passes() -> None:
    assert sbs.best_sustained([summary(100, p99=1.0)], 0.1) is None
    assert sbs.best_sustained([], 0.1) is None


def test_point_at_finds_rate_within_one_percent() -> None:
    points = [summary(100.5, p99=0.07, p50=0.02), summary(200)]
    got = sbs.point_at(points, 100.0)
    assert got is not None and got["p99_s"] == 0.07 and got["p50_s"] == 0.02
    assert sbs.point_at(points, 150.0) is None


# --------------------------------------------------------------------------- the sweep plan


def run_plan(capacity: float, **kw: Any) -> list[float]:
    """The rates next_rate visits against a server that passes below `capacity`."""
    history: list[tuple[float, bool]] = []
    while (rate := sbs.next_rate(history, **kw)) is not None:
        history.append((rate, rate <= capacity))
        assert len(history) < 50
    return [r for r, _ in history]


def test_sweep_doubles_until_failure_then_refines_once() -> None:
    assert run_plan(500, start=100, factor=2, refine=1) == [100, 200, 400, 800, 566]


def test_sweep_without_refine_stops_at_first_failure() -> None:
    assert run_plan(500, start=100, factor=2, refine=0) == [100, 200, 400, 800]


def test_sweep_two_refines_bisect_toward_capacity() -> None:
    # 400 pass, 800 fail -> 566 fail -> sqrt(400*566)=476 pass.
    assert run_plan(500, start=100, factor=2, refine=2) == [100, 200, 400, 800, 566, 476]


def test_sweep_ends_at_max_rate() -> None:
    assert run_plan(1e9, start=100, factor=4, max_rate=1000, refine=1) == [100, 400, 1000]


def test_sweep_first_point_failing_probes_lower_once() -> None:
    assert run_plan(10, start=100, factor=2, refine=1) == [100, 25]
    assert run_plan(10, start=100, factor=2, refine=0) == [100]


class ScriptedLoad:
    """A LoadClient stand-in: each rate's runs pass or fail (p99) as scripted, in order."""

    def __init__(self, outcomes: dict[float, list[bool]]) -> None:
        self.outcomes = {r: list(v) for r, v in outcomes.items()}
        self.calls: list[float] = []

    def point(self, requests: Any, rate: float, *args: Any) -> dict[str, Any]:
        self.calls.append(rate)
        runs = self.outcomes.get(rate, [rate <= 400])
        ok = runs.pop(0) if len(runs) > 1 else runs[0]
        return summary(rate, p99=0.05 if ok else 0.5)


SWEEP_CFG = {
    "warmup_s": 0.0,
    "duration_s": 0.0,
    "moderate_rate": 100.0,
    "rate_factor": 2.0,
    "max_rate": 1e9,
    "refine": 1,
    "max_error_rate": 0.01,
    "pause_after_fail_s": 0.0,
    "seed": 0,
}


def run_sweep(load: ScriptedLoad, retries: int) -> list[dict[str, Any]]:
    cfg = {**SWEEP_CFG, "retries": retries}
    return sbs.sweep(load, [], cfg, p99_target_s=0.1, deadline=time.time() + 60, label="t")


def test_a_failing_rate_is_run_again_and_a_passing_rerun_counts() -> None:
    # 200/s stalls once, then passes: the sweep goes on up to the real limit (400).
    load = ScriptedLoad({200.0: [False, True]})
    points = run_sweep(load, retries=1)
    assert load.calls == [100, 200, 200, 400, 800, 800, 566, 566]
    assert [p.get("retry") for p in points] == [None, None, 1, None, None, 1, None, 1]
    best = sbs.best_sustained(points, 0.1)
    assert best is not None and best["offered_rate_per_s"] == 400
    # point_at reports the re-run, whose verdict the sweep used
    assert sbs.point_at(points[:3], 200)["p99_s"] == 0.05


def test_without_retries_one_stall_ends_the_climb() -> None:
    load = ScriptedLoad({200.0: [False, True]})
    points = run_sweep(load, retries=0)
    assert load.calls == [100, 200, 141]
    assert sbs.best_sustained(points, 0.1)["offered_rate_per_s"] == 141


def test_sweep_stops_when_bracket_is_tight() -> None:
    history = [(100.0, True), (110.0, False)]
    assert sbs.next_rate(history, start=100, factor=1.1, refine=3) is None


@pytest.mark.parametrize(
    ("rate", "expected"),
    [(4525.483, 4530.0), (565.685, 566.0), (25.0, 25.0), (1.2345, 1.23), (0.0, 0.0)],
)
def test_round_rate_three_significant_figures(rate: float, expected: float) -> None:
    assert sbs.round_rate(rate) == expected


# --------------------------------------------------------------------------- ratios


def model_doc(ceiling: float | None, **best: float | None) -> dict[str, Any]:
    setups = {k: {"best": None if v is None else {"throughput_per_s": v}} for k, v in best.items()}
    return {"ceiling": {"items_per_s_max": ceiling}, "setups": setups}


def test_ratios_against_ceiling_and_plain() -> None:
    doc = model_doc(10000.0, plain_1=200.0, plain_shared=250.0, serve_app=5000.0)
    assert sbs.compute_ratios(doc) == {
        "plain_1_vs_ceiling": 0.02,
        "plain_shared_vs_ceiling": 0.025,
        "serve_app_vs_ceiling": 0.5,
        "serve_app_vs_plain_shared": 20.0,
        "serve_app_vs_plain_1": 25.0,
    }


def test_ratios_missing_values_are_none() -> None:
    doc = model_doc(None, plain_shared=None, serve_app=300.0, plain_shared_haproxy=150.0)
    got = sbs.compute_ratios(doc)
    assert got["serve_app_vs_ceiling"] is None
    assert got["serve_app_vs_plain_shared"] is None
    assert got["serve_app_vs_plain_shared_haproxy"] == 2.0
    assert "serve_app_vs_plain_1" not in got


def test_ratio_rounds_and_guards_zero() -> None:
    assert sbs.ratio(1.0, 3.0) == 0.3333
    assert sbs.ratio(1.0, 0.0) is None
    assert sbs.ratio(None, 1.0) is None


def test_noop_verdict() -> None:
    ok = sbs.noop_verdict(0.0030, 0.0015)
    assert ok["passed"] is True and ok["added_p50_s"] == pytest.approx(0.0015)
    over = sbs.noop_verdict(0.0060, 0.0015)
    assert over["passed"] is False and over["added_p50_s"] == pytest.approx(0.0045)
    assert sbs.noop_verdict(None, 0.001)["passed"] is None


# --------------------------------------------------------------------------- memory


def nvml(t: float, pid: int, used: int | None, uuid: str = "GPU-a") -> dict[str, Any]:
    return {"t_unix_s": t, "source": "nvml", "pid": pid, "used_bytes": used, "gpu_uuid": uuid}


def test_memory_summary_peaks_of_new_processes_against_share() -> None:
    gib = 1 << 30
    samples = [
        nvml(98.0, 7, 5 * gib),  # alive before the window: another setup's process
        nvml(100.0, 7, 5 * gib),
        nvml(101.0, 11, 2 * gib),
        nvml(102.0, 11, 9 * gib),
        nvml(103.0, 12, 3 * gib),
        nvml(104.0, 12, None),
        nvml(200.0, 11, 30 * gib),  # after the window
        {"t_unix_s": 102.0, "source": "server", "pid": 11, "reserved_bytes": 1},
    ]
    got = sbs.memory_summary(samples, 100.0, 150.0, 0.25, {"GPU-a": 40 * gib})
    assert got["replicas"] == [
        {
            "pid": 11,
            "gpu_uuid": "GPU-a",
            "peak_nvml_bytes": 9 * gib,
            "budget_bytes": 10 * gib,
            "peak_over_budget": 0.9,
        },
        {
            "pid": 12,
            "gpu_uuid": "GPU-a",
            "peak_nvml_bytes": 3 * gib,
            "budget_bytes": 10 * gib,
            "peak_over_budget": 0.3,
        },
    ]
    assert got["max_peak_nvml_bytes"] == 9 * gib
    assert got["max_peak_over_budget"] == 0.9


def test_memory_summary_without_nvml() -> None:
    got = sbs.memory_summary([], 0.0, 10.0, 1.0, {})
    assert got["replicas"] == [] and got["max_peak_nvml_bytes"] is None


# --------------------------------------------------------------------------- client limits


def test_client_saturation_and_limit_hint() -> None:
    busy = summary(100, client_cpu_frac_max=0.95, send_lag_s={"p99": 0.001})
    late = summary(100, client_cpu_frac_max=0.2, send_lag_s={"p99": 0.05})
    fine = summary(100, client_cpu_frac_max=0.2, send_lag_s={"p99": 0.001})
    assert sbs.client_saturated(busy) and sbs.client_saturated(late)
    assert not sbs.client_saturated(fine)
    assert sbs.limit_hint([{"passed": True}]) is None
    assert sbs.limit_hint([{"passed": True}, {"passed": False, "client_saturated": True}]) == (
        "client"
    )
    assert sbs.limit_hint([{"passed": False, "client_saturated": False}]) == "server"


# --------------------------------------------------------------------------- orchestration


def test_plan_clusters_default_phases() -> None:
    assert sbs.plan_clusters(sbs.DEFAULT_PHASES) == [
        ("haproxy", "haproxy", ["serve_app"], True),
        ("default", "default", ["plain_1", "plain_shared"], True),
    ]


def test_plan_clusters_with_haproxy_plain_only() -> None:
    assert sbs.plan_clusters(["haproxy_plain"]) == [
        ("haproxy_plain", "haproxy", ["plain_1_haproxy", "plain_shared_haproxy"], False)
    ]
    assert sbs.plan_clusters(["ceiling", "client"]) == []


def test_cluster_weight_favours_serve_app_sweeps() -> None:
    assert sbs.cluster_weight(["serve_app"], True, 2) > sbs.cluster_weight(
        ["plain_1", "plain_shared"], True, 2
    )


def test_merge_previous_fills_only_what_is_missing() -> None:
    doc: dict[str, Any] = {
        "models": {"minilm": {"ceiling": {}, "setups": {"serve_app": {"status": "ok"}}}},
        "client": {},
        "noop": {"serve_haproxy": {"p50_s": 0.003}},
    }
    prev = {
        "models": {
            "minilm": {
                "ceiling": {"items_per_s_max": 1.0},
                "setups": {"serve_app": {"status": "old"}, "plain_1": {"status": "ok"}},
            },
            "resnet50": {"setups": {}},
        },
        "client": {"status": "ok"},
        "noop": {"serve_haproxy": {"p50_s": 1.0}, "serve_default": {"p50_s": 0.007}},
    }
    taken = sbs.merge_previous(doc, prev)
    assert sorted(taken) == sorted(
        ["minilm/ceiling", "minilm/plain_1", "resnet50", "client", "noop/serve_default"]
    )
    assert doc["models"]["minilm"]["setups"]["serve_app"] == {"status": "ok"}
    assert doc["noop"]["serve_haproxy"] == {"p50_s": 0.003}


def test_help_works() -> None:
    with pytest.raises(SystemExit) as exc:
        sbs.main(["--help"])
    assert exc.value.code == 0


def test_bad_phase_is_refused() -> None:
    with pytest.raises(SystemExit) as exc:
        sbs.main(["--only", "nonsense", "--out", "/nonexistent/never-created"])
    assert exc.value.code == 2


# --------------------------------------------------------------------------- markdown


def full_doc() -> dict[str, Any]:
    gib = 1 << 30
    setups = {
        "plain_1": {
            "status": "ok",
            "replicas": 1,
            "num_gpus_per_replica": 1.0,
            "best": {"throughput_per_s": 190.0},
            "moderate": {"p50_s": 0.012, "p99_s": 0.25},
            "memory": {"max_peak_nvml_bytes": 3 * gib, "replicas": [{"budget_bytes": 140 * gib}]},
            "vs_ceiling": 0.019,
        },
        "plain_shared": {"status": "error", "error": "RuntimeError: boom | bad"},
        "serve_app": {
            "status": "ok",
            "replicas": 4,
            "num_gpus_per_replica": 0.25,
            "best": {"throughput_per_s": 4000.0},
            "moderate": {"p50_s": 0.004, "p99_s": 0.009},
            "memory": {"max_peak_nvml_bytes": 5 * gib, "replicas": [{"budget_bytes": 35 * gib}]},
            "vs_ceiling": 0.4,
        },
    }
    model = {
        "kind": "image",
        "items": "images",
        "p99_target_s": 0.2,
        "moderate_rate_per_s": 100.0,
        "ceiling": {
            "status": "ok",
            "items_per_s": {"64": 10000.0, "8": 1500.0},
            "items_per_s_max": 10000.0,
        },
        "setups": setups,
        "ratios": {"serve_app_vs_plain_1": 21.0526, "serve_app_vs_plain_shared": None},
    }
    return {
        "command": "python -m load_tests.side_by_side",
        "config": {"noop_rate": 50.0},
        "machine": {"gpu_name": "NVIDIA H200", "gpu_total_bytes": 140 * gib, "cpu_count": 16},
        "models": {"resnet50": model},
        "client": {
            "client_procs": 4,
            "bare_uvicorn_noop": {"p50_s": 0.0015, "p99_s": 0.004},
            "image": {"max_throughput_per_s": 9000.0, "p99_target_s": 0.05},
        },
        "noop": {
            "in_process": {"direct_call_p50_s": 2e-7, "asgi_in_process_p50_s": 0.0008},
            "serve_haproxy": {"p50_s": 0.0025, "p99_s": 0.006},
            "verdict_haproxy_vs_bare_uvicorn": sbs.noop_verdict(0.0025, 0.0015),
        },
        "errors": [{"phase": "cluster[default]", "error": "worker exited with 1"}],
        "timings": {"total_s": 431.2},
    }


def test_render_markdown_rows_and_values() -> None:
    md = render_markdown(full_doc())
    lines = md.splitlines()
    ceiling = next(line for line in lines if line.startswith("| in-process ceiling"))
    assert "batch 64: 10,000, batch 8: 1,500" in ceiling and "| 10,000 |" in ceiling
    plain = next(line for line in lines if line.startswith("| plain Ray Serve, 1 replica"))
    cells = [c.strip() for c in plain.strip("|").split("|")]
    assert cells[1:9] == ["1 x 1", "190", "0.019x", "21.05x", "12.0 ms", "250 ms", "3.00", "140.00"]
    app = next(line for line in lines if line.startswith("| serve_app"))
    assert "| 4 x 0.25 | 4,000 | 0.40x | 1.00x | 4.0 ms | 9.0 ms | 5.00 | 35.00 | ok |" in app
    broken = next(line for line in lines if line.startswith("| plain Ray Serve, shared"))
    assert "error: RuntimeError: boom / bad" in broken  # a '|' would break the table
    assert "Serve + HAProxy adds 1.0 ms p50 over bare uvicorn: within the 2.0 ms limit." in md
    assert "| in-process await of the handler | 0.2 us | - |" in md
    assert "| image | 9,000 |" in md
    assert "- cluster[default]: worker exited with 1" in md
    assert "Wall time: 431 s." in md


def test_render_markdown_of_an_empty_run() -> None:
    md = render_markdown({"models": {"minilm": {"setups": {}}}})
    assert "### MiniLM-L6 embeddings" in md
    assert "| setup | replicas x GPU | best sustained req/s |" in md
    assert "Wall time" not in md


def test_plain_baseline_preprocesses_exactly_like_serve_app() -> None:
    import numpy as np
    import torch

    from load_tests import payloads
    from serve_app.adapters.image.backend import ImageClassifier as ImageClassifierAdapter
    from serve_app.adapters.image.backend import to_model_input
    from serve_app.config.args import parse_args

    adapter = ImageClassifierAdapter(
        parse_args({"adapter": "image-classification", "load_format": "dummy"})
    )
    for seed in range(2):
        blob = payloads.image_bytes(224, "jpeg", seed)
        item = torch.from_numpy(np.stack([adapter._preprocess(blob, 0)]))
        ours = to_model_input(item, torch.device("cpu"), torch.float32)[0].numpy()
        np.testing.assert_allclose(sbs.preprocess_image(blob), ours, atol=1e-5)
