"""load_tests.benchmarks.multigpu.rows, the two-GPU benchmark's pure logic: time shares,
placement per GPU, answers by GPU, the grab timeline's samples and verdict, the two-GPU
speedup."""

from __future__ import annotations

import pytest

from load_tests.benchmarks.multigpu import rows
from load_tests.benchmarks.multigpu.common import FAKE_GPUS

GIB = 1 << 30
A, B = FAKE_GPUS


def test_allot_s_shares_what_is_left_among_the_parts_to_come() -> None:
    weights = {"throughput": 0.5, "grab": 0.3, "placement": 0.2}
    assert rows.allot_s(500.0, weights, "throughput") == pytest.approx(250.0)
    # throughput took 200 s of its 250: grab gets its share of the 300 left, not of 500
    assert rows.allot_s(300.0, {"grab": 0.3, "placement": 0.2}, "grab") == pytest.approx(180.0)
    assert rows.allot_s(120.0, {"placement": 0.2}, "placement") == pytest.approx(120.0)
    assert rows.allot_s(-5.0, {"placement": 0.2}, "placement") == 0.0
    # under its minimum, an earlier part takes the minimum if the time left holds it
    assert rows.allot_s(96.0, {"grab": 0.3, "placement": 0.2}, "grab", 60.0) == 60.0
    assert rows.allot_s(50.0, {"grab": 0.3, "placement": 0.2}, "grab", 60.0) == 50.0


def memory_doc() -> dict:
    """/v1/memory with 3 replicas on A (one node) and 1 on B; 80 GiB GPUs."""
    reps = [
        {"replica_id": f"a{i}", "pid": 100 + i, "gpu_uuid": A, "budget_bytes": 24 * GIB}
        | {"node_id": "n1", "num_gpus": 0.3}
        for i in range(3)
    ]
    reps.append(
        {"replica_id": "b0", "pid": 200, "gpu_uuid": B, "budget_bytes": 24 * GIB}
        | {"node_id": "n1", "num_gpus": 0.3}
    )
    reps.append({"replica_id": "cpu", "pid": 300, "gpu_uuid": None, "budget_bytes": 0})
    gpus = [
        {"uuid": u, "node_id": "n1", "total_bytes": 80 * GIB, "budgets_bytes": 0} for u in (A, B)
    ]
    return {"replicas": reps, "gpus": gpus}


def nvml(pid: int, uuid: str, used: int) -> dict:
    return {"source": "nvml", "pid": pid, "gpu_uuid": uuid, "used_bytes": used, "t_unix_s": 1.0}


def test_replica_gpus_maps_replica_ids_and_leaves_cpu_replicas_out() -> None:
    assert rows.replica_gpus(memory_doc()["replicas"]) == {"a0": A, "a1": A, "a2": A, "b0": B}


def test_placement_rows_per_gpu_budgets_and_nvml_against_each_budget() -> None:
    samples = [
        nvml(100, A, 2 * GIB),
        nvml(101, A, 25 * GIB),  # over its 24 GiB budget
        nvml(101, A, 3 * GIB),
        nvml(200, B, 1 * GIB),
        nvml(999, A, 70 * GIB),  # the hog or any process that is not a replica: not judged
        {"source": "server", "pid": 100, "used_bytes": 99 * GIB},
    ]
    got = {r["gpu_uuid"]: r for r in rows.placement_rows(memory_doc(), samples)}
    a, b = got[A], got[B]
    assert (a["replicas"], a["replica_count"], a["num_gpus_sum"]) == (["a0", "a1", "a2"], 3, 0.9)
    assert (a["budgets_bytes"], a["total_bytes"], a["budgets_within_total"]) == (
        72 * GIB,
        80 * GIB,
        True,
    )
    assert (a["nvml_samples"], a["budget_violations"]) == (3, 1)
    detail = {d["replica_id"]: d for d in a["replica_detail"]}
    assert detail["a1"]["nvml_peak_bytes"] == 25 * GIB and detail["a1"]["over_budget"] is True
    assert detail["a2"]["nvml_peak_bytes"] is None and detail["a2"]["over_budget"] is None
    assert (b["replica_count"], b["budget_violations"], b["node_id"]) == (1, 0, "n1")


def test_placement_rows_without_nvml_leave_the_nvml_fields_null() -> None:
    doc = memory_doc()
    doc["gpus"][0]["total_bytes"] = 60 * GIB  # 3 x 24 GiB do not fit
    got = {r["gpu_uuid"]: r for r in rows.placement_rows(doc, [])}
    assert got[A]["budgets_within_total"] is False
    assert (got[A]["nvml_samples"], got[A]["budget_violations"]) == (None, None)


def result(done_s: float, status: int | str, replica: str, ctype: str = "application/json"):
    return (done_s - 0.1, 0.1, status, ctype, replica)


def test_answers_by_gpu_split_by_the_replica_that_answered() -> None:
    gpu_of = {"a0": A, "b0": B}
    results = [
        result(1.0, 200, "a0"),
        result(1.5, 200, "b0"),
        result(1.6, 503, "b0"),  # a deliberate JSON refusal: failed
        result(1.7, "ReadError(x)", ""),  # no answer, no replica: lost, unattributed
        result(1.8, 200, "zz"),  # a replica /v1/memory has not listed yet
        result(2.5, 200, "a0"),  # outside the window
    ]
    got = rows.answers_by_gpu(results, gpu_of, 1.0, 2.0)
    assert got == {
        A: {"ok": 1, "failed": 0, "lost": 0},
        B: {"ok": 1, "failed": 1, "lost": 0},
        rows.UNATTRIBUTED: {"ok": 1, "failed": 0, "lost": 1},
    }


def sample(
    phase: str, a: int, b: int, errors_a: int = 0, reason_b: str | None = None, elsewhere: int = 0
) -> dict:
    return rows.grab_sample(
        t_s=1.0,
        dt_s=0.5,
        phase=phase,
        running_by_gpu={A: a, B: b},
        target_by_gpu={A: a, B: b},
        reason_by_gpu={A: "hold_in_band", B: reason_b},
        free_by_gpu={A: 70 * GIB, B: GIB},
        by_app={A: {"ok": 10, "failed": errors_a, "lost": 0}, B: {"ok": 4, "failed": 0, "lost": 1}},
        by_answering_gpu={A: {"ok": 10, "failed": 0, "lost": 0}},
        answered_elsewhere=elsewhere,
    )


def test_grab_sample_has_the_plot_keys_and_the_per_gpu_series() -> None:
    s = sample("grab", 4, 3, errors_a=1)
    assert (s["replicas_running"], s["controller_target"]) == (7, 7)
    assert (s["ok_rps"], s["errors_per_s"], s["offered_rps"]) == (28.0, 4.0, 32.0)
    assert s["ok_per_s_by_gpu"] == {A: 20.0, B: 8.0}
    assert s["errors_by_gpu"] == {A: 1, B: 1} and s["errors_per_s_by_gpu"] == {A: 2.0, B: 2.0}
    assert s["gpu_free_bytes"] == {A: 70 * GIB, B: GIB}
    assert (
        rows.grab_sample(
            t_s=0.0,
            dt_s=0.5,
            phase=None,
            running_by_gpu={},
            target_by_gpu={A: None},
            reason_by_gpu={},
            free_by_gpu={},
            by_app={},
            by_answering_gpu={},
        )["controller_target"]
        is None
    )


def test_grab_verdict_only_the_grabbed_gpu_shed_and_the_spared_one_without_errors() -> None:
    samples = [
        sample("deploy", 1, 1, errors_a=5),  # before "steady": not judged
        sample("steady", 4, 4),
        sample("grab", 4, 4),
        sample("grab", 4, 3, reason_b="shed_memory_pressure"),
        sample("released", 4, 4),
    ]
    v = rows.grab_verdict(samples, grabbed=B, spared=A)
    assert v["replicas_at_grab"] == {B: 4, A: 4} and v["samples_judged"] == 4
    assert v["fewest_replicas_after_grab"] == {B: 3, A: 4}
    assert v["errors_by_gpu"] == {B: 4, A: 0}
    assert v["only_grabbed_gpu_shed"] and v["spared_gpu_errors_zero"] and v["shed_decision_seen"]
    assert v["answers_from_other_gpus"] == 0
    # Both shed, GPU 0's application had errors, and answered from GPU 1
    bad = [sample("steady", 4, 4), sample("grab", 4, 4), sample("grab", 3, 3, 2, elsewhere=7)]
    v = rows.grab_verdict(bad, grabbed=B, spared=A)
    assert not v["only_grabbed_gpu_shed"] and not v["spared_gpu_errors_zero"]
    assert v["answers_from_other_gpus"] == 7
    # Judged from the replicas running when the grab began, not from max_replicas
    few = [sample("steady", 3, 2), sample("grab", 3, 2), sample("grab", 4, 1)]
    assert rows.grab_verdict(few, grabbed=B, spared=A)["only_grabbed_gpu_shed"]
    never = rows.grab_verdict([sample("steady", 4, 4)], B, A)
    assert never["replicas_at_grab"] == {B: None, A: None} and not never["only_grabbed_gpu_shed"]
    assert not rows.grab_verdict([sample("deploy", 4, 4)], B, A)["spared_gpu_errors_zero"]


def test_transitions_keep_the_samples_where_replicas_targets_or_reasons_change() -> None:
    samples = [
        sample("steady", 4, 4),
        sample("steady", 4, 4),  # free bytes and load change all the time: not a transition
        sample("grab", 4, 3, reason_b="shed_memory_pressure"),
        sample("grab", 4, 3, reason_b="shed_memory_pressure"),
        sample("released", 4, 4),
    ]
    got = rows.transitions(samples)
    assert [(t["phase"], t["replicas_by_gpu"][B]) for t in got] == [
        ("steady", 4),
        ("grab", 3),
        ("released", 4),
    ]
    assert got[0]["gpu_free_gib"] == {A: 70.0, B: 1.0}
    assert len(rows.transitions(samples, limit=2)) == 2


def tp_row(replicas: int, n: int, items: float | None, client: str = "wrk", **kw) -> dict:
    return {
        "setup": "serve_app",
        "client": client,
        "status": "ok",
        "replicas": replicas,
        "inputs_per_request": n,
        "items_per_s": items,
        **kw,
    }


def test_speedup_two_gpus_against_one_from_the_wrk_rows() -> None:
    table = [
        tp_row(4, 64, 40_000.0, budget_violations=0, nvml_samples=100),
        tp_row(8, 64, 78_000.0, budget_violations=2, nvml_samples=200, client_headroom=4.5),
        tp_row(8, 64, 99_999.0, client="open-loop"),  # not the closed-loop maximum
        tp_row(4, 1, 2_700.0),
        tp_row(8, 1, None, status="skipped"),
        {"setup": "client_ceiling", "client": "wrk", "status": "ok", "requests_per_s": 9e4},
    ]
    got = rows.speedup(table, 4, 8)
    assert [(s["inputs_per_request"], s["speedup"], s["wanted"]) for s in got] == [
        (64, 1.95, rows.SPEEDUP_WANTED),
        (1, None, None),
    ]
    assert (got[0]["one_gpu_texts_per_s"], got[0]["two_gpu_texts_per_s"]) == (40_000.0, 78_000.0)
    assert (got[0]["two_gpu_client_headroom"], got[1]["two_gpu_client_headroom"]) == (4.5, None)
    assert rows.violations_total(table) == {"budget_violations": 2, "nvml_samples": 300}
    assert rows.violations_total([tp_row(4, 1, 1.0)]) == {
        "budget_violations": None,
        "nvml_samples": None,
    }


def test_replicas_per_gpu_from_a_jobs_server_report() -> None:
    reports = [{"replica_id": "x", "gpu_uuid": A}] * 4 + [{"replica_id": "y", "gpu_uuid": None}]
    assert rows.replicas_per_gpu(reports + [{"error": "unreachable"}]) == {A: 4, "cpu": 1}
    packed = {"minilm/r4": {A: 4}, "minilm/r8": {A: 4, B: 4}}
    assert rows.layout_check(packed, 4) == {"one_gpu": True, "two_gpus": True}
    spread = {"minilm/r4": {A: 2, B: 2}, "minilm/r8": {A: 5, B: 3}}
    assert rows.layout_check(spread, 4) == {"one_gpu": False, "two_gpus": False}
    assert rows.layout_check({"minilm/r1": {"cpu": 1}}, 1) == {"one_gpu": False, "two_gpus": None}
