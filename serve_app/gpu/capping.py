"""A replica's partition at start-up: pick the device and, on a GPU, create and measure the CUDA
context, count what the model backend keeps outside torch, check that the device can hold the
budget, and apply the cap, all before any weight loads (serve_app.gpu.budget has the arithmetic).

Under MPS enforcement the replica's driver limit goes into its environment first, before anything
here initialises CUDA (``torch.cuda.is_available`` already does): the driver reads it once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from serve_app.config.args import AppArgs
from serve_app.errors import StartupError
from serve_app.gpu import devices, mps, nvml
from serve_app.gpu.budget import (
    GpuMemoryError,
    MemoryBudget,
    cap_to_limit,
    fit_cap_to_device,
    format_bytes,
    plan_budget,
)
from serve_app.gpu.partition import Partition
from serve_app.gpu.snapshot import DeviceMemory

logger = logging.getLogger("serve_app")


@dataclass(frozen=True)
class HeldOutsideTorch:
    """Device memory a model backend keeps outside torch's allocator for the life of the process
    (nvJPEG's buffers), measured at start-up before the cap.

    Attributes:
        measured_bytes: what the backend's probe left in NVML's reading of the process.
        reserve_bytes: what the overhead sets aside for it: the measured bytes and a margin for
            growth the probe did not reach.
    """

    measured_bytes: int
    reserve_bytes: int

    @property
    def margin_bytes(self) -> int:
        return self.reserve_bytes - self.measured_bytes


OutsideTorchHook = Callable[[DeviceMemory], HeldOutsideTorch | None]
"""A model backend's start-up hook: grow what it keeps outside torch to its worst case on this
device (through ``DeviceMemory`` and serve_app.gpu.snapshot.memory_profiling) and say how much."""


def resolve_device(requested: str) -> torch.device:
    """``auto`` picks CUDA when this process can see a GPU; ``cuda`` without one is an error."""
    has_cuda = torch.cuda.is_available()
    if requested == "cuda" and not has_cuda:
        raise StartupError(
            "args.device is 'cuda' but this replica sees no CUDA device; give the deployment "
            "ray_actor_options.num_gpus > 0 on a GPU node, or set device: auto or cpu"
        )
    if requested == "cpu" or not has_cuda:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _check_stated_budget(args: AppArgs, num_gpus: float, device: torch.device) -> None:
    """memory.budget in bytes (docs/planning.md): refused without a share on a GPU node, or on
    a GPU its share holds less of; on a CPU-only node, ignored as num_gpus is."""
    budget_bytes = args.memory.budget_bytes
    if budget_bytes is None:
        return
    from serve_app.config.shares import replica_budget_problem

    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    seen = nvml.value(nvml.all_devices())
    problem = replica_budget_problem(budget_bytes, num_gpus, total, bool(seen))
    if problem:
        raise StartupError(problem)


def start_partition(
    args: AppArgs, num_gpus: float, hold_outside_torch: OutsideTorchHook | None = None
) -> Partition:
    """Pick the device; on a GPU, measure the context, check free memory, apply the cap.

    Raises:
        StartupError: the cap cannot be applied (the message names the setting to change).
    """
    enforcement = args.memory.enforcement
    plan = mps.plan_client(
        enforcement, num_gpus, args.memory.memory_fraction, args.memory.compute_share
    )
    device = resolve_device(args.device)
    _check_stated_budget(args, num_gpus, device)
    if device.type != "cuda" and plan is not None:
        raise StartupError(
            f"memory.enforcement {enforcement} needs CUDA, but this replica sees no CUDA "
            f"device; {mps.TORCH_HINT}"
        )
    if device.type != "cuda":
        if num_gpus > 0 and nvml.is_scripted():
            from serve_app.testing.partition import start_logical

            logical = start_logical(args, num_gpus, device)
            if logical is not None:
                return logical
        logger.warning(
            "serve_app replica on CPU (no CUDA device visible): no memory cap, no calibration"
        )
        return Partition(device=device, num_gpus=num_gpus)
    if num_gpus <= 0:
        raise StartupError(
            "this replica sees a GPU but Ray assigned it no GPU share; set "
            "ray_actor_options.num_gpus (e.g. 0.25) for the deployment"
        )
    index = device.index or 0
    uuid = devices.uuid_for_torch_device(index)
    if uuid is None:
        raise StartupError(
            f"cannot find CUDA device {index}'s UUID in NVML; serve_app identifies GPUs "
            "by UUID to apply and report the memory cap (is the NVIDIA driver installed?)"
        )
    memory = DeviceMemory(device, uuid)
    before = nvml.value(nvml.device_memory(uuid))
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)  # creates the CUDA context: the overhead we measure
    memory.synchronize()
    if plan is not None:  # before any memory is planned: is the driver's limit in force?
        mps.verify_client(plan, os.getpid(), uuid, memory.free_device_bytes())
    # Grown to its worst case now, so that the overhead measured below holds it.
    held = hold_outside_torch(memory) if hold_outside_torch is not None else None
    overhead, own, source = _measure_overhead(memory, before)
    if held is not None:  # its measured bytes are in the overhead already; add the margin
        overhead += held.margin_bytes
    total_bytes = memory.total_bytes()
    try:
        budget = plan_budget(num_gpus, total_bytes, overhead, args.memory.memory_fraction)
        budget = fit_cap_to_device(budget, _free_bytes(memory, plan), own, uuid)
    except GpuMemoryError as exc:
        raise StartupError(str(exc)) from None
    if plan is not None:
        budget = cap_to_limit(budget, plan.limit_bytes)
    if enforcement != "mps":  # torch and both: PyTorch's allocator cap
        torch.cuda.set_per_process_memory_fraction(budget.torch_fraction, device)
    logger.info(
        "GPU %s: budget %s (num_gpus=%s x %s), CUDA context %s (%s), enforcement %s: %s",
        uuid,
        format_bytes(budget.budget_bytes),
        num_gpus,
        format_bytes(total_bytes),
        format_bytes(overhead),
        source,
        enforcement,
        _enforcement_text(budget, plan, enforcement),
    )
    return Partition(
        device=device,
        num_gpus=num_gpus,
        gpu_mode="cuda",
        gpu_uuid=uuid,
        budget=budget,
        overhead_source=source,
        cache_policy=args.memory.cache_policy,
        cache_threshold_fraction=args.memory.cache_threshold_fraction,
        held_outside_torch_bytes=held.reserve_bytes if held else 0,
        held_margin_bytes=held.margin_bytes if held else 0,
        enforcement=enforcement,
        mps_plan=plan,
    )


def _measure_overhead(memory: DeviceMemory, before: nvml.GpuMemory | None) -> tuple[int, int, str]:
    """What the process holds outside torch now (the CUDA context and whatever the backend's
    hook grew), what it holds in all, and how that was measured: NVML's figure for the process,
    or, where NVML does not list it (a PID namespace), the device's used bytes' change since
    ``before`` the context.

    Raises:
        StartupError: neither can be read.
    """
    assert memory.gpu_uuid is not None
    reserved = memory.reserved_bytes()
    proc = memory.process_bytes()
    if proc is not None:
        return max(0, proc - reserved), proc, "nvml_process"
    after = nvml.value(nvml.device_memory(memory.gpu_uuid))
    if before is None or after is None:
        raise StartupError(
            "cannot measure this replica's CUDA context through NVML (is the NVIDIA "
            "driver's libnvidia-ml available?); serve_app needs it to apply the memory cap"
        )
    overhead = max(0, after.used_bytes - before.used_bytes - reserved)
    logger.warning(
        "NVML does not list this process (PID namespace?); overhead measured as the "
        "device's used-bytes change over context creation: %s",
        format_bytes(overhead),
    )
    return overhead, overhead + reserved, "nvml_device_delta"


def _free_bytes(memory: DeviceMemory, plan: mps.ClientPlan | None) -> int:
    """The device's free bytes. CUDA's figure, except for an MPS client with a limit: CUDA then
    reports what is left of the limit, so NVML's device figure is read instead."""
    if plan is not None and memory.gpu_uuid is not None:
        dev = nvml.value(nvml.device_memory(memory.gpu_uuid))
        if dev is not None:
            return int(dev.free_bytes)
    return memory.free_device_bytes()


def _enforcement_text(budget: MemoryBudget, plan: mps.ClientPlan | None, mode: str) -> str:
    parts = []
    if mode != "mps":
        parts.append(f"torch cap fraction {budget.torch_fraction:.4f}")
    if plan is not None:
        parts.append(f"MPS limit {plan.limit_value} ({format_bytes(plan.limit_bytes)})")
        if plan.thread_percentage is not None:
            parts.append(f"{plan.thread_percentage}% of the SMs")
    return ", ".join(parts)
