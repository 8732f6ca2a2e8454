"""load_tests.benchmarks.startup.cli: each part's share of what is left of the budget."""

from __future__ import annotations

import time

import pytest

from load_tests.benchmarks.startup.cli import PART_WEIGHTS, part_deadline
from load_tests.harness.run import SHUTDOWN_RESERVE_S, Budget


def test_part_deadline_splits_what_is_left_by_weight() -> None:
    parts = tuple(PART_WEIGHTS)
    budget = Budget(100.0 + SHUTDOWN_RESERVE_S)
    now = time.monotonic()
    cold = part_deadline(budget, "cold", parts) - now
    assert cold == pytest.approx(100.0 * PART_WEIGHTS["cold"], abs=0.5)
    later = PART_WEIGHTS["replacement"] / (PART_WEIGHTS["replacement"] + PART_WEIGHTS["decision"])
    assert part_deadline(budget, "replacement", parts) - now == pytest.approx(100 * later, abs=0.5)
    assert part_deadline(budget, "decision", parts) - now == pytest.approx(100.0, abs=0.5)
    assert part_deadline(budget, "decision", ("decision",)) - now == pytest.approx(100.0, abs=0.5)
