"""load_tests.benchmarks.first_seconds: the verdict on its windows and the busiest processes
(pure; the tool itself runs a server, in docs/benchmarks.md's run)."""

from __future__ import annotations

import os

from load_tests.benchmarks.first_seconds import top_processes, window_verdict
from load_tests.benchmarks.throughput.proccpu import ProcCpu, ServerCpu


def window(p99_ms: float, errors: int = 0) -> dict:
    return {"p99_ms": p99_ms, "errors": errors, "requests_per_s": 100.0}


def test_the_first_windows_p99_is_judged_against_the_last() -> None:
    ok = window_verdict([window(30.0), window(20.0), window(16.0)], max_ratio=2.0)
    assert ok == {"ok": True, "why": None, "p99_ratio": 1.875, "errors": 0}
    slow = window_verdict([window(240.0), window(20.0), window(16.0)], max_ratio=2.0)
    assert slow["ok"] is False and slow["p99_ratio"] == 15.0 and "15.0 > 2.0" in slow["why"]
    errs = window_verdict([window(16.0, errors=3), window(16.0)], max_ratio=2.0)
    assert errs["ok"] is False and errs["why"] == "3 errors"


def test_a_window_that_did_not_run_fails_the_verdict() -> None:
    got = window_verdict([window(16.0), {"error": "wrk exit 1"}], max_ratio=2.0)
    assert got == {"ok": False, "why": "a window did not run", "p99_ratio": None}


def test_top_processes_by_cpu_between_snapshots() -> None:
    def proc(pid: int, title: str, cpu_s: float, created_s: float = 900.0) -> ProcCpu:
        return ProcCpu(pid, "other", cpu_s, created_s, title)

    before = {1: proc(1, "replica", 10.0), 2: proc(2, "idle worker", 1.0), 4: proc(4, "x", 9.0)}
    after = {
        1: proc(1, "replica", 12.5),
        2: proc(2, "idle worker", 4.0),
        3: proc(3, "new", 0.5, 1001.0),
        4: proc(4, "reused pid", 2.75, 1002.0),  # a new process under an old pid: whole
    }
    got = top_processes(before, after, n=3)
    assert got == [
        {"pid": 2, "title": "idle worker", "kind": "other", "cpu_s": 3.0},
        {"pid": 4, "title": "reused pid", "kind": "other", "cpu_s": 2.75},
        {"pid": 1, "title": "replica", "kind": "other", "cpu_s": 2.5},
    ]


def test_server_cpu_keeps_its_snapshots_with_the_titles() -> None:
    cpu = ServerCpu([os.getpid()])
    cpu.start()
    sum(i * i for i in range(200_000))
    cpu.stop(1)
    before, after = cpu.last
    mine = after[os.getpid()]
    assert os.getpid() in before and mine.title and mine.cpu_s >= before[os.getpid()].cpu_s


def test_during_sums_collections_and_leftover_work_over_the_replicas_in_both() -> None:
    from load_tests.benchmarks.first_seconds import during

    def rep(c: list[int], p: list[float], pending: int) -> dict:
        gc = {"collections": c, "pause_s": p, "max_pause_s": p, "frozen_objects": 9}
        return {"gc": gc, "cuda_graphs": 10 - pending, "cuda_graphs_pending": pending}

    before = {"a": rep([10, 1, 0], [0.01, 0.001, 0.0], 6), "gone": rep([5, 0, 0], [0.1, 0, 0], 9)}
    after = {"a": rep([30, 3, 1], [0.03, 0.002, 0.5], 2), "b": rep([4, 0, 0], [0.004, 0, 0], 0)}
    got = during(before, after)
    assert got == {
        "replicas": 1,
        "gc_collections": [20, 2, 1],
        "gc_pause_s": [0.02, 0.001, 0.5],
        "before": {"cuda_graphs": 4, "cuda_graphs_pending": 6, "warmup_pending": 0},
        "after": {"cuda_graphs": 8, "cuda_graphs_pending": 2, "warmup_pending": 0},
    }


def test_long_pauses_are_counted_in_the_window_they_ended_in_over_every_replica() -> None:
    from load_tests.benchmarks.first_seconds import long_pauses

    def pause(at: float, gen: int, s: float) -> dict:
        return {"at_unix_s": at, "generation": gen, "pause_s": s, "collected": 0}

    reports = {
        "a": {"gc": {"long_pauses": [pause(99.9, 2, 0.5), pause(100.0, 2, 0.08)]}},
        "b": {"gc": {"long_pauses": [pause(105.0, 0, 0.011), pause(109.5, 2, 0.03)]}},
        "c": {"gc": {"long_pauses": [pause(110.0, 2, 0.2)]}},  # the next window's
        "old": {"gc": {"collections": [1, 0, 0]}},  # a report without the field
    }
    assert long_pauses(reports, 100.0, 110.0) == {
        "count": [1, 0, 2],
        "longest_s": [0.011, 0.0, 0.08],
    }
    assert long_pauses({}, 0.0, 1.0) == {"count": [0, 0, 0], "longest_s": [0.0, 0.0, 0.0]}


def test_app_args_and_the_abba_order_of_two_arms() -> None:
    import argparse

    import pytest

    from load_tests.benchmarks.first_seconds import app_arg, arm_order

    assert app_arg("cuda_graph_startup_budget_s=5") == ("cuda_graph_startup_budget_s", 5)
    assert app_arg("warmup=false") == ("warmup", False)
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        app_arg("warmup")
    assert arm_order(3, 1) == [0, 0, 0]
    assert arm_order(6, 2) == [0, 1, 1, 0, 0, 1]
