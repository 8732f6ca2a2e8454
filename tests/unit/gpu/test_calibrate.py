"""Unit tests for serve_app.gpu.calibrate: the doubling search over a scripted probe."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from serve_app.gpu.budget import GpuMemoryError
from serve_app.gpu.calibrate import (
    CalibrationError,
    CalibrationResult,
    candidate_sizes,
    find_max_batch,
)


def linear_probe(base_bytes: int, per_item_bytes: int, calls: list[int]) -> Callable[[int], int]:
    def probe(n: int) -> int:
        calls.append(n)
        return base_bytes + n * per_item_bytes

    return probe


def oom_above(limit: int, peak_bytes: int, calls: list[int]) -> Callable[[int], int | None]:
    def probe(n: int) -> int | None:
        calls.append(n)
        return None if n > limit else peak_bytes

    return probe


@pytest.mark.parametrize(
    ("start", "max_batch_size", "expected"),
    [
        (1, 1, [1]),
        (1, 2, [1, 2]),
        (1, 16, [1, 2, 4, 8, 16]),
        (1, 24, [1, 2, 4, 8, 16, 24]),
        (1, 17, [1, 2, 4, 8, 16, 17]),
        (3, 10, [3, 6, 10]),
        (4, 4, [4]),
    ],
)
def test_candidate_sizes(start: int, max_batch_size: int, expected: list[int]) -> None:
    assert candidate_sizes(start, max_batch_size) == expected


@pytest.mark.parametrize(("start", "max_batch_size"), [(0, 4), (5, 4), (1, 0)])
def test_candidate_sizes_rejects_bad_bounds(start: int, max_batch_size: int) -> None:
    with pytest.raises(ValueError, match="1 <= start <= max_batch_size"):
        candidate_sizes(start, max_batch_size)


def test_linear_peak_chooses_last_doubling_that_fits() -> None:
    calls: list[int] = []
    result = find_max_batch(linear_probe(4_000, 500, calls), budget_bytes=10_000, max_batch_size=64)
    assert result == CalibrationResult(
        batch_size=8,
        peak_bytes=8_000,
        budget_bytes=10_000,
        first_failure_size=16,
        first_failure=12_000,
        probes=((1, 4_500), (2, 5_000), (4, 6_000), (8, 8_000), (16, 12_000)),
    )
    assert calls == [1, 2, 4, 8, 16]  # stops at the first failure


@pytest.mark.parametrize(
    ("base_bytes", "per_item_bytes", "budget_bytes", "max_batch_size"),
    [
        (1_000, 10, 2_000, 1_000),
        (1_000, 10, 1_010, 1_000),
        (600_000_000, 150_000_000, 36_900_000_000, 512),
        (0, 1, 7, 100),
        (5, 3, 100, 24),
    ],
)
def test_chosen_size_fits_and_next_step_does_not(
    base_bytes: int, per_item_bytes: int, budget_bytes: int, max_batch_size: int
) -> None:
    calls: list[int] = []
    result = find_max_batch(
        linear_probe(base_bytes, per_item_bytes, calls),
        budget_bytes=budget_bytes,
        max_batch_size=max_batch_size,
    )
    assert base_bytes + result.batch_size * per_item_bytes <= budget_bytes
    assert result.peak_bytes == base_bytes + result.batch_size * per_item_bytes
    if result.first_failure_size is None:
        assert result.batch_size == max_batch_size
        assert result.first_failure is None
    else:
        next_step = min(result.batch_size * 2, max_batch_size)
        assert result.first_failure_size == next_step
        assert result.first_failure == base_bytes + next_step * per_item_bytes
        assert result.first_failure > budget_bytes


def test_peak_equal_to_budget_fits() -> None:
    result = find_max_batch(linear_probe(0, 100, []), budget_bytes=400, max_batch_size=8)
    assert (result.batch_size, result.peak_bytes) == (4, 400)
    assert (result.first_failure_size, result.first_failure) == (8, 800)


def test_oom_stops_the_search() -> None:
    calls: list[int] = []
    result = find_max_batch(oom_above(5, 1_000, calls), budget_bytes=10_000, max_batch_size=32)
    assert result.batch_size == 4
    assert result.peak_bytes == 1_000
    assert result.first_failure_size == 8
    assert result.first_failure == "oom"
    assert result.probes == ((1, 1_000), (2, 1_000), (4, 1_000), (8, None))
    assert calls == [1, 2, 4, 8]


def test_cap_is_respected_and_not_a_power_of_two_is_probed() -> None:
    calls: list[int] = []
    result = find_max_batch(linear_probe(0, 1, calls), budget_bytes=10**9, max_batch_size=24)
    assert calls == [1, 2, 4, 8, 16, 24]
    assert result.batch_size == 24
    assert result.first_failure_size is None
    assert result.first_failure is None


def test_cap_reached_exactly_at_a_power_of_two() -> None:
    calls: list[int] = []
    result = find_max_batch(linear_probe(0, 1, calls), budget_bytes=10**9, max_batch_size=16)
    assert calls == [1, 2, 4, 8, 16]
    assert result.batch_size == 16


def test_failure_at_the_cap_candidate() -> None:
    # 16 fits (peak 16), the cap 24 does not (peak 24 > 20).
    result = find_max_batch(linear_probe(0, 1, []), budget_bytes=20, max_batch_size=24)
    assert result.batch_size == 16
    assert (result.first_failure_size, result.first_failure) == (24, 24)


def test_start_above_one() -> None:
    calls: list[int] = []
    result = find_max_batch(
        linear_probe(0, 10, calls), budget_bytes=100, max_batch_size=64, start=3
    )
    assert calls == [3, 6, 12]
    assert result.batch_size == 6


def test_batch_one_over_budget_raises() -> None:
    with pytest.raises(CalibrationError) as info:
        find_max_batch(linear_probe(2 * 1024**3, 1, []), budget_bytes=1024**3, max_batch_size=8)
    message = str(info.value)
    assert "even a batch of 1 peaked at 2.00 GiB (2,147,483,649 bytes)" in message
    assert "budget of 1.00 GiB (1,073,741,824 bytes)" in message
    assert "ray_actor_options.num_gpus" in message


def test_batch_one_oom_raises() -> None:
    with pytest.raises(CalibrationError, match="even a batch of 1 ran out of memory"):
        find_max_batch(oom_above(0, 1, []), budget_bytes=1_000, max_batch_size=8)


def test_calibration_error_is_a_gpu_memory_error() -> None:
    assert issubclass(CalibrationError, GpuMemoryError)


def test_non_positive_budget_is_rejected() -> None:
    with pytest.raises(ValueError, match="budget_bytes must be > 0"):
        find_max_batch(linear_probe(0, 1, []), budget_bytes=0, max_batch_size=8)
