"""The start-up cap against a device that never has its whole total free."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from serve_app.gpu.budget import (
    InsufficientGpuMemoryError,
    fit_cap_to_device,
    plan_budget,
    startup_tolerance_bytes,
)
from serve_app.gpu.capping import resolve_device
from serve_app.gpu.partition import Partition
from serve_app.gpu.snapshot import DeviceMemory

TOTAL = 150_109_880_320  # an H200 as torch reports it
CONTEXT = 641_728_512
MIB = 1 << 20
GIB = 1 << 30


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


def _capped(monkeypatch: pytest.MonkeyPatch, reserved: list[int], proc: list[int | None]) -> Any:
    """A GPU Partition (fakes for torch's reserved bytes, its cap setter and NVML's reading of
    the process: the arithmetic of refit, not CUDA)."""
    budget = plan_budget(0.25, 100 * GIB, overhead_bytes=600 * MIB)
    part = Partition(
        device=torch.device("cuda", 0),
        num_gpus=0.25,
        gpu_mode="cuda",
        gpu_uuid="GPU-fake",
        budget=budget,
    )
    fractions: list[float] = []
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved[0])
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, device=None: fractions.append(f)
    )
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(DeviceMemory, "process_bytes", lambda self: proc[0])
    part.fractions = fractions  # type: ignore[attr-defined]
    return part


def test_refit_lowers_the_torch_cap_by_the_growth_outside_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from serve_app.gpu.partition import NON_TORCH_RESERVE_BYTES as RESERVE

    reserved, proc = [2 * GIB], [2 * GIB + 600 * MIB]
    part = _capped(monkeypatch, reserved, proc)
    start = part.budget
    # Nothing grew, but the first refit keeps the reserve free for growth not yet seen.
    assert part.refit("first launch") == 0 and part.non_torch_reserve_bytes == RESERVE
    assert part.budget.torch_cap_bytes == start.cap_bytes - 600 * MIB - RESERVE
    assert part.budget.overhead_bytes == 600 * MIB and len(part.fractions) == 1
    assert part.refit("nothing grew") == 0 and len(part.fractions) == 1
    proc[0] += 80 * MIB  # kernels loaded outside torch
    assert part.refit("kernels") == 80 * MIB
    after = part.budget
    assert after.overhead_bytes == 680 * MIB and after.cap_bytes == start.cap_bytes
    assert after.torch_cap_bytes == start.cap_bytes - 680 * MIB - RESERVE
    assert part.fractions[-1] == after.torch_fraction and part.non_torch_growth_bytes == 80 * MIB
    # The torch cap, what is outside torch and the reserve make the cap, to the byte.
    assert after.torch_cap_bytes + after.overhead_bytes + RESERVE == after.cap_bytes
    reserved[0] += GIB  # torch's own growth moves both figures: not outside torch
    proc[0] += GIB
    assert part.refit("torch grew") == 0 and part.budget == after
    proc[0] = None  # no NVML reading: nothing changes
    assert part.refit("no reading") == 0 and part.budget == after
    assert part.report()["non_torch_reserve_bytes"] == RESERVE


def test_refit_does_nothing_without_a_torch_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    part = _capped(monkeypatch, [GIB], [GIB + GIB])
    part.enforcement = "mps"  # the driver's limit, which counts everything, enforces the cap
    assert part.refit("mps") == 0 and part.fractions == []
    cpu = Partition(device=torch.device("cpu"), num_gpus=0.0)
    assert cpu.refit("cpu") == 0


def test_after_batch_refits_when_torch_is_near_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    reserved, proc = [GIB], [GIB + 600 * MIB + 50 * MIB]  # 50 MiB grew outside torch
    part = _capped(monkeypatch, reserved, proc)
    part.cache_policy = "never"

    def stats(device: Any = None) -> dict[str, Any]:
        return {
            "reserved_bytes": {"all": {"current": reserved[0]}},
            "allocated_bytes": {"all": {"current": 0}},
        }

    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", stats)
    part.after_batch()  # far from the cap: no NVML reading, nothing counted
    assert part.non_torch_growth_bytes == 0
    reserved[0] = int(0.95 * part.budget.torch_cap_bytes)
    proc[0] = reserved[0] + 650 * MIB
    part.after_batch()
    assert part.non_torch_growth_bytes == 50 * MIB and part.budget.overhead_bytes == 650 * MIB


def test_after_batch_refits_every_refit_every_s(monkeypatch: pytest.MonkeyPatch) -> None:
    from serve_app.gpu.partition import REFIT_EVERY_S

    reserved, proc = [GIB], [GIB + 600 * MIB + 20 * MIB]  # 20 MiB grew outside torch
    part = _capped(monkeypatch, reserved, proc)
    part.cache_policy = "never"
    monkeypatch.setattr(
        torch.cuda,
        "memory_stats_as_nested_dict",
        lambda device=None: {"reserved_bytes": {"all": {"current": reserved[0]}}},
    )
    part.after_batch()  # far from the cap, read just now (start-up): not yet
    assert part.non_torch_growth_bytes == 0
    part._refit_at_s -= REFIT_EVERY_S
    part.after_batch()
    assert part.non_torch_growth_bytes == 20 * MIB
