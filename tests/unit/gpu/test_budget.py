"""gpu.budget: budget arithmetic, free-memory check, snapshot, cache policy."""

from __future__ import annotations

import pytest

from serve_app.gpu.budget import (
    GpuMemoryError,
    InsufficientGpuMemoryError,
    MemoryBudget,
    MemoryConfigError,
    check_free_memory,
    format_bytes,
    plan_budget,
    should_free_cache,
)

TOTAL_BYTES = 150_000_000_000  # illustrative device, as in the module docstring
OVERHEAD_BYTES = 600_000_000
GIB = 1 << 30


def test_format_bytes() -> None:
    assert format_bytes(0) == "0.00 GiB"
    assert format_bytes(GIB) == "1.00 GiB"
    assert format_bytes(37_500_000_000) == "34.92 GiB"
    assert format_bytes(GIB + GIB // 2) == "1.50 GiB"


def test_plan_budget_num_gpus_only() -> None:
    budget = plan_budget(0.25, TOTAL_BYTES, OVERHEAD_BYTES, None)
    assert budget == MemoryBudget(
        device_total_bytes=TOTAL_BYTES,
        num_gpus=0.25,
        memory_fraction=None,
        budget_bytes=37_500_000_000,
        cap_bytes=37_500_000_000,
        overhead_bytes=OVERHEAD_BYTES,
        torch_fraction=0.246,
        torch_cap_bytes=36_900_000_000,
    )


def test_plan_budget_with_memory_fraction() -> None:
    budget = plan_budget(0.25, TOTAL_BYTES, OVERHEAD_BYTES, memory_fraction=0.2)
    assert budget.budget_bytes == 37_500_000_000
    assert budget.cap_bytes == 30_000_000_000
    assert budget.torch_cap_bytes == 29_400_000_000
    assert budget.torch_fraction == 0.196
    assert budget.memory_fraction == 0.2


def test_plan_budget_memory_fraction_equal_to_num_gpus_is_allowed() -> None:
    budget = plan_budget(0.5, TOTAL_BYTES, 0, memory_fraction=0.5)
    assert budget.cap_bytes == budget.budget_bytes == 75_000_000_000
    assert budget.torch_fraction == 0.5


def test_plan_budget_truncates_to_whole_bytes() -> None:
    # 1/3 of 1,000 bytes is 333.33...: the budget is the whole-byte floor.
    budget = plan_budget(1 / 3, 1_000, 100, None)
    assert budget.budget_bytes == 333
    assert budget.torch_cap_bytes == 233
    assert budget.torch_fraction == 0.233


def test_torch_fraction_times_total_gives_torch_cap_within_one_byte() -> None:
    for num_gpus in (0.1, 0.25, 1 / 3, 0.7, 1.0):
        budget = plan_budget(num_gpus, 143_771_000_000, 523_000_000, None)
        assert abs(budget.torch_fraction * budget.device_total_bytes - budget.torch_cap_bytes) <= 1


@pytest.mark.parametrize("memory_fraction", [0.3, 0.25000001, 1.0])
def test_memory_fraction_above_num_gpus_is_rejected(memory_fraction: float) -> None:
    with pytest.raises(MemoryConfigError) as info:
        plan_budget(0.25, TOTAL_BYTES, OVERHEAD_BYTES, memory_fraction)
    message = str(info.value)
    assert f"memory_fraction={memory_fraction}" in message
    assert "num_gpus=0.25" in message
    assert "(0, 0.25]" in message


@pytest.mark.parametrize("memory_fraction", [0.0, -0.1, float("nan")])
def test_memory_fraction_not_positive_is_rejected(memory_fraction: float) -> None:
    with pytest.raises(MemoryConfigError, match="memory_fraction=.* must be > 0"):
        plan_budget(0.25, TOTAL_BYTES, OVERHEAD_BYTES, memory_fraction)


@pytest.mark.parametrize("num_gpus", [0.0, -0.5, 1.5, float("inf")])
def test_num_gpus_out_of_range_is_rejected(num_gpus: float) -> None:
    with pytest.raises(MemoryConfigError, match=r"ray_actor_options.num_gpus must be in \(0, 1\]"):
        plan_budget(num_gpus, TOTAL_BYTES, OVERHEAD_BYTES, None)


def test_bad_total_or_overhead_is_rejected() -> None:
    with pytest.raises(MemoryConfigError, match="device_total_bytes must be > 0, got 0"):
        plan_budget(0.25, 0, 0, None)
    with pytest.raises(MemoryConfigError, match="overhead_bytes must be >= 0, got -1"):
        plan_budget(0.25, TOTAL_BYTES, -1, None)


def test_overhead_at_or_above_cap_is_rejected() -> None:
    # cap = 0.01 x 150e9 = 1,500,000,000 bytes; an overhead equal to it leaves torch nothing.
    with pytest.raises(MemoryConfigError) as info:
        plan_budget(0.01, TOTAL_BYTES, 1_500_000_000, None)
    message = str(info.value)
    assert "1,500,000,000 bytes" in message
    assert "outside PyTorch" in message
    assert "raise num_gpus" in message
    assert "num_gpus=0.01" in message


def test_overhead_above_memory_fraction_cap_names_memory_fraction() -> None:
    with pytest.raises(MemoryConfigError) as info:
        plan_budget(0.25, TOTAL_BYTES, 2_000_000_000, memory_fraction=0.01)
    message = str(info.value)
    assert "raise memory_fraction" in message
    assert "memory_fraction=0.01" in message
    assert "2,000,000,000 bytes" in message


def test_overhead_just_below_cap_leaves_one_byte() -> None:
    budget = plan_budget(0.01, TOTAL_BYTES, 1_499_999_999, None)
    assert budget.torch_cap_bytes == 1


def test_config_errors_are_value_errors_in_the_hierarchy() -> None:
    assert issubclass(MemoryConfigError, ValueError)
    assert issubclass(MemoryConfigError, GpuMemoryError)
    assert issubclass(InsufficientGpuMemoryError, GpuMemoryError)


def test_check_free_memory_passes_when_free_plus_own_covers_cap() -> None:
    budget = plan_budget(0.25, TOTAL_BYTES, OVERHEAD_BYTES, None)
    check_free_memory(37_500_000_000, 0, budget, "GPU-abc")
    # Exactly enough once the process's own context is counted back in.
    check_free_memory(36_900_000_000, 600_000_000, budget, "GPU-abc")


def test_check_free_memory_message_says_free_asked_and_fix() -> None:
    budget = plan_budget(0.25, TOTAL_BYTES, OVERHEAD_BYTES, None)
    with pytest.raises(InsufficientGpuMemoryError) as info:
        check_free_memory(10 * GIB, 600_000_000, budget, "GPU-1234")
    message = str(info.value)
    assert "GPU GPU-1234" in message
    assert "10.00 GiB (10,737,418,240 bytes) free" in message
    assert "600,000,000 bytes" in message
    assert "34.92 GiB (37,500,000,000 bytes)" in message
    assert "num_gpus=0.25" in message
    # short by 37.5e9 - 10,737,418,240 - 6e8 bytes
    assert "26,162,581,760 bytes) short" in message
    assert "ray_actor_options.num_gpus" in message
    assert "memory_fraction" in message
    assert "other processes" in message


def test_check_free_memory_one_byte_short_raises_and_names_memory_fraction() -> None:
    budget = plan_budget(0.25, TOTAL_BYTES, OVERHEAD_BYTES, memory_fraction=0.2)
    with pytest.raises(InsufficientGpuMemoryError) as info:
        check_free_memory(29_999_999_999, 0, budget, "GPU-x")
    message = str(info.value)
    assert "memory_fraction=0.2" in message
    assert "(1 bytes) short" in message


@pytest.mark.parametrize(
    ("policy", "reserved_bytes", "allocated_bytes", "expected"),
    [
        ("always", 0, 0, True),
        ("always", 1_000, 1_000, True),
        ("never", 10_000, 0, False),
        ("never", 0, 0, False),
        # budget 10,000 x 0.1 = 1,000 bytes of idle cache allowed
        ("threshold", 5_000, 4_000, False),  # idle exactly 1,000: not above
        ("threshold", 5_001, 4_000, True),  # idle 1,001
        ("threshold", 9_000, 1_000, True),
        ("threshold", 0, 0, False),
    ],
)
def test_should_free_cache_table(
    policy: str, reserved_bytes: int, allocated_bytes: int, expected: bool
) -> None:
    assert (
        should_free_cache(policy, reserved_bytes, allocated_bytes, 10_000, 0.1)  # type: ignore[arg-type]
        is expected
    )


def test_should_free_cache_threshold_edges() -> None:
    assert should_free_cache("threshold", 1, 0, 10_000, 0.0) is True
    assert should_free_cache("threshold", 0, 0, 10_000, 0.0) is False
    assert should_free_cache("threshold", 10_000, 0, 10_000, 1.0) is False


@pytest.mark.parametrize("threshold_fraction", [-0.01, 1.01, float("nan")])
def test_should_free_cache_rejects_bad_threshold(threshold_fraction: float) -> None:
    with pytest.raises(MemoryConfigError, match=r"threshold_fraction must be in \[0, 1\]"):
        should_free_cache("always", 0, 0, 10_000, threshold_fraction)


def test_should_free_cache_rejects_unknown_policy() -> None:
    with pytest.raises(MemoryConfigError, match="unknown cache policy 'sometimes'"):
        should_free_cache("sometimes", 0, 0, 10_000, 0.1)  # type: ignore[arg-type]
