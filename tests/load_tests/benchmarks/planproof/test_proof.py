"""load_tests.benchmarks.planproof.proof: the naive config, goodput, the rows and the verdict of
issue 27's proof (pure functions), on the committed H200 example plan and on made-up records."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import yaml

from load_tests.benchmarks.planproof.proof import (
    goodput_per_s,
    keep_applications,
    model_row,
    naive_config,
    naive_counts,
    stage_times,
    tail_by_second,
    targets_from_measurements,
    verdict,
)
from load_tests.harness.meta import ROOT
from serve_app.config.deploy import check_deploy_config, load_deploy_config
from serve_app.plan.measurements import load_measurements

EXAMPLE = ROOT / "examples" / "planning"
PLAN = json.loads((EXAMPLE / "rag-stack-plan" / "plan.json").read_text())
PLANNED = load_deploy_config(EXAMPLE / "rag-stack-plan" / "serve_config.yaml")
CPUS = {
    k: m.num_cpus
    for k, m in load_measurements(EXAMPLE / "rag-stack-measurements.json").models.items()
}


def test_the_naive_config_of_the_h200_example_plan() -> None:
    # The plan: 7 + 2 + 1 + 1 replicas holding 1,428 share units, 12 cores of 12. Equal
    # replicas: 3 each would need 3 x (1 + 1 + 1 + 2) = 15 cores; 2 each need 10, and
    # 1428 // 8 = 178 units (2.67 GB of the H200) hold every model's budget (at most 135 units).
    assert naive_counts(PLAN, CPUS) == (2, 178)
    naive, notes = naive_config(PLANNED, PLAN, CPUS)
    apps = naive["applications"]
    assert [a["name"] for a in apps] == ["embeddings", "rerank", "classify-text", "classify-images"]
    for app, planned in zip(apps, PLANNED["applications"], strict=True):
        dep = app["deployments"][0]
        assert dep["num_replicas"] == 2 and dep["ray_actor_options"]["num_gpus"] == 0.0178
        assert (
            dep["ray_actor_options"]["num_cpus"]
            == planned["deployments"][0]["ray_actor_options"]["num_cpus"]
        )
        assert "budget" not in app["args"]["memory"]
        assert app["args"]["max_batch_size"] == planned["args"]["max_batch_size"]  # the plan's caps
        assert planned["args"]["memory"]["budget"] > 0  # the plan's config untouched
    assert check_deploy_config(naive, gpus=1) == []
    assert (
        "2 replica(s) of each of the 4 models" in notes[0] and "1424 of the plan's 1428" in notes[0]
    )


def _plan(
    models: list[tuple[str, float, int]], cores_cap: float, gpus: int = 1, units_cap: int = 9856
) -> dict[str, Any]:
    return {
        "models": [
            {"application": n, "num_gpus": share, "replicas_per_gpu": [reps]}
            for n, share, reps in models
        ],
        "gpus": [{"cores_cap": cores_cap, "share_units_cap": units_cap}] * gpus,
    }


def test_naive_counts_bound_by_cores_and_by_the_largest_budget() -> None:
    cpus = {"a": 1.0, "b": 1.0}
    # 10 units of a and 2 of b in all: 3 replicas each would need 6 cores of 4.
    assert naive_counts(_plan([("a", 0.0001, 8), ("b", 0.0001, 2)], 4.0), cpus) == (2, 2)
    # b's budget needs 6 units; 12 units in all hold one of each at 6, not two.
    assert naive_counts(_plan([("a", 0.0001, 6), ("b", 0.0006, 1)], 16.0), cpus) == (1, 6)
    # 7 units in all cannot give both 6: one replica each at b's budget holds 12 (the H200
    # proof's case: the images budget over a quarter of the plan's share).
    assert naive_counts(_plan([("a", 0.0001, 1), ("b", 0.0006, 1)], 16.0), cpus) == (1, 6)
    with pytest.raises(ValueError, match="no naive config.*the GPU has 10"):
        naive_counts(_plan([("a", 0.0001, 1), ("b", 0.0006, 1)], 16.0, units_cap=10), cpus)
    with pytest.raises(ValueError, match="no naive config.*2 cores"):
        naive_counts(_plan([("a", 0.0001, 1), ("b", 0.0001, 1)], 1.5), cpus)
    with pytest.raises(ValueError, match="one GPU; this plan has 2"):
        naive_counts(_plan([("a", 0.0001, 1)], 4.0, gpus=2), cpus)


def _records(rows: list[tuple[float, float, int]]) -> np.ndarray:
    """Open-loop records (scheduled s, latency s, send lag s, status) of made-up requests."""
    return np.array([[t for t, _, _ in rows], [lat for _, lat, _ in rows], [0.0] * len(rows),
                     [s for _, _, s in rows]], dtype=np.float64)  # fmt: skip


def test_goodput_counts_answers_within_the_target_in_the_window() -> None:
    first = _records([
        (0.5, 0.01, 200),  # in the warm-up: not counted
        (1.0, 0.05, 200),  # counted
        (1.5, 0.30, 200),  # over the 0.2 s target
        (2.0, 0.01, 503),  # not a 2xx
        (2.5, np.nan, 0),  # no answer (timeout)
    ])  # fmt: skip
    second = _records([(1.2, 0.2, 200), (3.0, 0.01, 200)])  # at the target; after the window
    assert goodput_per_s([first, second], 0.2, warmup_s=1.0, duration_s=2.0) == 1.0
    assert goodput_per_s([first, second], 1.0, warmup_s=1.0, duration_s=2.0) == 1.5
    assert goodput_per_s([], 1.0, warmup_s=1.0, duration_s=2.0) == 0.0
    late = _records([(1.0, 0.25, 200), (1.5, 0.25, 200)])
    late[2] = [0.1, np.nan]  # the first sent 0.1 s late; the second's lag not recorded
    assert goodput_per_s([late], 0.2, warmup_s=1.0, duration_s=2.0) == 0.0
    assert goodput_per_s([late], 0.2, 1.0, 2.0, forgive_lag=True) == 0.5


def test_the_tail_by_second_shows_when_the_slow_answers_came() -> None:
    first = _records([
        (0.5, 9.00, 200),  # in the warm-up: not counted
        (1.1, 0.05, 200), (1.2, 0.30, 200),  # second 0: one over the 0.2 s target
        (2.5, 0.01, 503), (2.6, np.nan, 0),  # second 1: two failed, none answered
    ])  # fmt: skip
    second = _records([(3.9, 0.10, 200), (4.0, 0.40, 200)])  # second 2; after the window
    tail = tail_by_second([first, second], 0.2, warmup_s=1.0, duration_s=3.0)
    assert tail == {"p99_ms": [300.0, None, 100.0], "over_target": [1, 0, 0], "errors": [0, 2, 0]}
    empty = tail_by_second([], 0.2, warmup_s=1.0, duration_s=2.0)
    assert empty == {"p99_ms": [None, None], "over_target": [0, 0], "errors": [0, 0]}


def _summary(answered: float, p99_ms: float, keeps_up: bool = True) -> dict[str, Any]:
    return {"offered_per_s": 100.0, "requests_per_s": answered, "p50_ms": p99_ms / 2,
            "p99_ms": p99_ms, "requests": 1000, "errors": 0, "error_counts": {},
            "client_keeps_up": keeps_up}  # fmt: skip


def test_a_models_row_against_its_prediction_and_target() -> None:
    row = model_row("emb", "/v1/embeddings", 100.0, 0.1, _summary(86.0, 99.0), 85.0)
    assert row["throughput_ok"] and row["p99_ok"] and row["answered_over_predicted"] == 0.86
    assert row["p99_target_ms"] == 100.0 and row["goodput_rps"] == 85.0
    assert not model_row("emb", "/", 100.0, 0.1, _summary(84.0, 99.0), 80.0)["throughput_ok"]
    assert not model_row("emb", "/", 100.0, 0.1, _summary(116.0, 99.0), 80.0)["throughput_ok"]
    assert not model_row("emb", "/", 100.0, 0.1, _summary(100.0, 101.0), 80.0)["p99_ok"]
    failed = model_row("emb", "/", 100.0, 0.1, {"error": "RuntimeError: worker"}, None)
    assert not failed["throughput_ok"] and not failed["p99_ok"] and failed["error"]


def _rows(
    goodputs: list[float], keeps_up: bool = True, forgiven: list[float | None] | None = None
) -> list[dict[str, Any]]:
    best = forgiven or goodputs
    return [model_row(f"m{i}", "/", 100.0, 0.1, _summary(100.0, 50.0, keeps_up), g, best[i])
            for i, g in enumerate(goodputs)]  # fmt: skip


WATCH = {"budget_violations": 0, "nvml_samples_judged": 500}


def test_the_verdict_of_issue_27() -> None:
    ok = verdict(_rows([100.0, 40.0]), _rows([60.0, 40.0]), WATCH, WATCH, on_gpu=True)
    assert ok["all_ok"] and ok["goodput_ratio"] == 1.4 and ok["failed"] == []
    assert ok["goodput_rps"] == {"plan": 140.0, "naive": 100.0}
    low = verdict(_rows([100.0, 20.0]), _rows([60.0, 40.0]), WATCH, WATCH, on_gpu=True)
    assert low["failed"] == ["goodput_ok"] and low["goodput_ratio"] == 1.2
    over = {"budget_violations": 1, "nvml_samples_judged": 500}
    assert verdict(_rows([100.0]), _rows([1.0]), WATCH, over, True)["failed"] == ["budget_ok"]
    unjudged = {"budget_violations": 0, "nvml_samples_judged": 0}
    assert verdict(_rows([100.0]), _rows([1.0]), unjudged, unjudged, True)["failed"] == [
        "budget_ok"
    ]
    assert verdict(_rows([100.0]), _rows([1.0]), unjudged, unjudged, False)["all_ok"]  # CPU
    late = verdict(_rows([100.0], keeps_up=False), _rows([1.0]), WATCH, WATCH, True)
    assert late["failed"] == ["client_ok"]  # the plan's rows need a client that kept up
    # A naive row's late client fails the run only if sending on time could have closed the gap.
    harmless = verdict(_rows([100.0]), _rows([1.0], False, [2.0]), WATCH, WATCH, True)
    assert harmless["all_ok"] and harmless["naive_clients_late"] == ["m0"]
    assert harmless["goodput_ratio"] == 100.0 and harmless["goodput_ratio_late_forgiven"] == 50.0
    closes = verdict(_rows([100.0]), _rows([1.0], False, [80.0]), WATCH, WATCH, True)
    assert closes["failed"] == ["client_ok"] and closes["goodput_ratio_late_forgiven"] == 1.25
    unknown = verdict(_rows([100.0]), _rows([1.0], False, [None]), WATCH, WATCH, True)
    assert unknown["failed"] == ["client_ok"] and unknown["goodput_ratio_late_forgiven"] == 0.0
    none = verdict(_rows([100.0]), _rows([0.0]), WATCH, WATCH, True)
    assert none["all_ok"] and none["goodput_ratio"] is None  # the naive config answered none
    assert "throughput_ok" in verdict([], [], WATCH, WATCH, True)["failed"]


def test_keep_applications_keeps_the_measured_ones() -> None:
    rag = load_deploy_config(ROOT / "configs" / "rag-stack.yaml")
    doc, notes = keep_applications(rag, ["rerank", "embeddings"])
    assert [a["name"] for a in doc["applications"]] == ["embeddings", "rerank"]
    assert len(notes) == 2 and "classify-text" in notes[0]
    assert len(rag["applications"]) == 4
    assert yaml.safe_dump(doc)  # plain data, writable as a config


def _exposition(count: float, total: float, buckets: list[tuple[str, float]]) -> str:
    lines = ["# TYPE ray_serve_app_queue_seconds histogram"]
    for replica in ("a", "b"):  # two replicas of one application, summed
        labels = f'application="img",replica="{replica}"'
        lines.append(f"ray_serve_app_queue_seconds_count{{{labels}}} {count / 2}")
        lines.append(f"ray_serve_app_queue_seconds_sum{{{labels}}} {total / 2}")
        for le, v in buckets:
            lines.append(f'ray_serve_app_queue_seconds_bucket{{{labels},le="{le}"}} {v / 2}')
    return "\n".join(lines) + "\n"


def test_stage_times_are_the_window_between_two_scrapes_summed_over_replicas() -> None:
    before = _exposition(10, 1.0, [("0.1", 10), ("0.5", 10), ("+Inf", 10)])
    after = _exposition(110, 31.0, [("0.1", 20), ("0.5", 110), ("+Inf", 110)])
    got = stage_times(before, after, ["img", "idle"])
    # 100 requests in the window took 30 s in all; 90 of them between 0.1 and 0.5 s, so the
    # 99th is the 89th of those 90, interpolated within the bucket.
    want = {
        "count": 100.0,
        "mean_s": pytest.approx(0.3),
        "p99_s": pytest.approx(0.1 + 0.4 * 89 / 90),
    }
    assert got["img"]["queue"] == want
    assert "request" not in got["img"] and got["idle"] == {}
    assert stage_times("", after, ["img"])["img"]["queue"]["count"] == 110.0


def test_the_replan_targets_state_the_asks_the_measurements_carry() -> None:
    from serve_app.plan.targets import Targets

    measured = json.loads((ROOT / "examples/planning/rag-stack-measurements.json").read_text())
    stated = yaml.safe_load((ROOT / "examples/planning/rag-stack-targets.yaml").read_text())
    asks = targets_from_measurements(measured)
    Targets.model_validate(asks)  # a valid targets file
    # The example measurements carry the example targets' asks: the same file comes back.
    assert asks == stated
