"""load_tests.harness.schedule: the seeded Poisson arrival times."""

from __future__ import annotations

import math

import pytest

from load_tests.harness.schedule import poisson_schedule


@pytest.mark.parametrize("rate_per_s,duration_s", [(50.0, 20.0), (200.0, 10.0), (5.0, 60.0)])
def test_poisson_schedule_count_order_and_gaps(rate_per_s: float, duration_s: float) -> None:
    times = poisson_schedule(rate_per_s, duration_s, seed=1)
    expected = rate_per_s * duration_s
    # Count is Poisson(expected): allow 4 standard deviations (fixed seed, so deterministic).
    assert abs(len(times) - expected) <= 4 * math.sqrt(expected)
    assert all(0.0 <= t < duration_s for t in times)
    assert all(b > a for a, b in zip(times, times[1:], strict=False))
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    mean_gap = sum(gaps) / len(gaps)
    # Mean of n exponentials has relative sd 1/sqrt(n); 4 sd tolerance.
    assert abs(mean_gap * rate_per_s - 1.0) <= 4 / math.sqrt(len(gaps))


def test_poisson_schedule_is_seeded() -> None:
    assert poisson_schedule(30.0, 5.0, seed=7) == poisson_schedule(30.0, 5.0, seed=7)
    assert poisson_schedule(30.0, 5.0, seed=7) != poisson_schedule(30.0, 5.0, seed=8)


def test_poisson_schedule_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="rate"):
        poisson_schedule(0.0, 5.0)
    with pytest.raises(ValueError, match="duration"):
        poisson_schedule(1.0, -1.0)
    assert poisson_schedule(10.0, 0.0) == []
