"""The start-up cap against a device that never has its whole total free."""

from __future__ import annotations

import pytest

from serve_app.memory import InsufficientGpuMemoryError, plan_budget
from serve_app.partition import fit_cap_to_device, resolve_device, startup_tolerance_bytes

TOTAL = 150_109_880_320  # an H200 as torch reports it
CONTEXT = 641_728_512


def test_tolerance_is_half_a_percent() -> None:
    assert startup_tolerance_bytes(TOTAL) == 750_549_401


def test_enough_free_keeps_the_budget() -> None:
    budget = plan_budget(0.25, TOTAL, CONTEXT)
    assert fit_cap_to_device(budget, 100 * 2**30, CONTEXT, "GPU-x") is budget


def test_whole_gpu_share_lowers_the_cap_to_what_is_free() -> None:
    # Seen on an idle H200: 9,240,576 bytes short of a num_gpus=1.0 cap.
    budget = plan_budget(1.0, TOTAL, CONTEXT)
    free = 149_458_911_232
    fitted = fit_cap_to_device(budget, free, CONTEXT, "GPU-x")
    assert fitted.budget_bytes == TOTAL
    assert fitted.cap_bytes == pytest.approx(free + CONTEXT, abs=1)
    assert fitted.cap_bytes <= free + CONTEXT
    assert fitted.torch_fraction < budget.torch_fraction


def test_short_by_more_than_the_tolerance_fails_with_the_fix() -> None:
    budget = plan_budget(0.25, TOTAL, CONTEXT)
    with pytest.raises(InsufficientGpuMemoryError) as info:
        fit_cap_to_device(budget, 20 * 2**30, CONTEXT, "GPU-x")
    assert "ray_actor_options.num_gpus" in str(info.value) and "GPU-x" in str(info.value)


def test_cpu_device_without_cuda() -> None:
    assert resolve_device("auto").type == "cpu"
    assert resolve_device("cpu").type == "cpu"
