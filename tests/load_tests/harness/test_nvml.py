"""load_tests.harness.nvml: NVML samples judged against each replica's budget."""

from __future__ import annotations

from load_tests.harness.nvml import BudgetWatch, budget_violations, judge_budgets


def test_judge_budgets_counts_each_sample_over_its_own_pids_budget() -> None:
    samples = [
        {"source": "nvml", "pid": 1, "used_bytes": 90},
        {"source": "nvml", "pid": 1, "used_bytes": 120},  # over 100
        {"source": "nvml", "pid": 2, "used_bytes": 150},
        {"source": "nvml", "pid": 3, "used_bytes": 10**9},  # the hog: no budget, not judged
        {"source": "http", "pid": 2, "used_bytes": 10**9},  # not an NVML sample
    ]
    got = judge_budgets(samples, {1: 100, 2: 200})
    assert got == {
        "budget_violations": 1,
        "nvml_samples_judged": 3,
        "replica_pids_judged": 2,
        "max_used_over_budget": 1.2,
        "bytes_over_budget_by_pid": {1: 20},
    }
    assert judge_budgets([], {1: 100})["max_used_over_budget"] is None


def test_budget_violations_by_pid() -> None:
    samples = [
        {"source": "nvml", "pid": 1, "used_bytes": 100},
        {"source": "nvml", "pid": 1, "used_bytes": 101},  # over 100
        {"source": "nvml", "pid": 2, "used_bytes": 300},
        {"source": "nvml", "pid": 3, "used_bytes": 10**12},  # no budget known: not judged
        {"source": "server", "pid": 2, "used_bytes": 10**12},
        {"source": "nvml", "pid": 2, "used_bytes": None},
    ]
    got = budget_violations(samples, {1: 100, 2: 200})
    assert got == {"budget_violations": 2, "nvml_samples_judged": 3, "peak_bytes": {1: 101, 2: 300}}


def test_budget_watch_so_far_judges_the_samples_taken_until_now() -> None:
    # Never started: no NVML, no HTTP; the samples and budgets stand in for what its threads read.
    watch = BudgetWatch("http://127.0.0.1:9/v1/memory")
    watch.budgets = {1: 100}
    watch.sampler.log.samples.extend(
        [
            {"source": "nvml", "pid": 1, "used_bytes": 90},
            {"source": "nvml", "pid": 1, "used_bytes": 130},  # over 100
        ]
    )
    got = watch.so_far()
    assert got["budget_violations"] == 1 and got["nvml_samples_judged"] == 2
    assert got["bytes_over_budget_by_pid"] == {1: 30} and got["nvml_notes"] == []
    watch.sampler.log.samples.append({"source": "nvml", "pid": 1, "used_bytes": 100})
    assert watch.so_far()["nvml_samples_judged"] == 3  # read again, not cached
