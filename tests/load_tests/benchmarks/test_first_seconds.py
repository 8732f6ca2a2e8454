"""load_tests.benchmarks.first_seconds: the verdict on its windows and the busiest processes
(pure; the tool itself runs a server, in docs/benchmarks.md's run)."""

from __future__ import annotations

import os

from load_tests.benchmarks.first_seconds import process_cpu, top_processes, window_verdict


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


def test_top_processes_by_cpu_between_readings() -> None:
    before = {1: ("replica", 10.0), 2: ("idle worker", 1.0)}
    after = {1: ("replica", 12.5), 2: ("idle worker", 4.0), 3: ("new", 0.5)}
    got = top_processes(before, after, n=2)
    assert got == [
        {"pid": 2, "title": "idle worker", "cpu_s": 3.0},
        {"pid": 1, "title": "replica", "cpu_s": 2.5},
    ]


def test_process_cpu_reads_this_process() -> None:
    mine = process_cpu(os.getpid())
    assert os.getpid() in mine and mine[os.getpid()][1] > 0
