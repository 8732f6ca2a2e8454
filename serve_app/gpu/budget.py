"""GPU memory accounting for one replica: budget, hard cap, snapshots and cache policy.

Several replicas share one GPU. Ray's fractional ``num_gpus`` is scheduler bookkeeping only, so
each replica enforces its own share with ``torch.cuda.set_per_process_memory_fraction``. That cap
counts only the PyTorch caching allocator's *reserved* bytes, measured against a fraction of the
*total* device memory; the CUDA context and other libraries' allocations sit outside it but still
use the GPU (NVML sees them). So the torch cap is the replica's share minus what the process
already holds outside PyTorch.

Where the bytes go, with an illustrative device of 150,000,000,000 bytes total (a round number
near an H200's; the real figure comes from ``torch.cuda.get_device_properties(d).total_memory``)
and ``num_gpus: 0.25``::

    budget_bytes    = int(0.25 x 150,000,000,000)          = 37,500,000,000  (34.92 GiB)
    overhead_bytes  = NVML process bytes - torch reserved  =    600,000,000  (CUDA context)
    torch_cap_bytes = 37,500,000,000 - 600,000,000         = 36,900,000,000  (weights, activations,
                                                                             allocator cache)
    torch_fraction  = 36,900,000,000 / 150,000,000,000     = 0.246

``plan_budget`` does this arithmetic, ``check_free_memory`` and ``fit_cap_to_device`` fail fast
at start-up when the GPU cannot hold the budget, and ``should_free_cache`` decides whether to hand
cached blocks back between batches. serve_app.gpu.snapshot takes the readings, OOM recovery lives
in serve_app.serving.oom and batch-size calibration in serve_app.gpu.calibrate.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Literal, get_args

logger = logging.getLogger("serve_app")

__all__ = [
    "GRAPH_MIN_ROOM_BYTES",
    "GRAPH_POOL_ROOM_SHARE",
    "CachePolicy",
    "GpuMemoryError",
    "InsufficientGpuMemoryError",
    "MemoryBudget",
    "MemoryConfigError",
    "cap_to_limit",
    "check_free_memory",
    "fit_cap_to_device",
    "format_bytes",
    "plan_budget",
    "should_free_cache",
    "startup_tolerance_bytes",
]

_GIB = 1 << 30

# The share of a replica's activation room (its torch cap less the weights) that the graphs'
# pool may hold. The pool never shrinks while its graphs live, so without a limit a tight cap
# can end up all pool, and then even a single input has no room to run eagerly (507).
GRAPH_POOL_ROOM_SHARE = 0.5
# Below this much room, a replica runs eagerly: each capture's eager warm-up loads kernels
# outside torch, and a MiniLM replica's graphs take about 0.3 GiB in all (pool and memory
# outside torch: benchmarks/results/startup/graph_memory_probe_h200.json), which would leave a
# small cap little room for eager batches. Here, not in gpu.graphs, so that the planner's
# budgets (serve_app.plan) can leave this room without importing torch.
GRAPH_MIN_ROOM_BYTES = 1 << 30

CachePolicy = Literal["always", "threshold", "never"]
"""When to return the allocator's cached blocks to the device between batches."""

_CACHE_POLICIES: tuple[str, ...] = get_args(CachePolicy)


class GpuMemoryError(Exception):
    """Base class for the memory module's errors."""


class MemoryConfigError(GpuMemoryError, ValueError):
    """A memory setting (``num_gpus``, ``memory_fraction``, cache policy) cannot work."""


class InsufficientGpuMemoryError(GpuMemoryError):
    """The GPU does not have enough free memory for this replica's cap."""


def format_bytes(n: int) -> str:
    """Format a byte count as GiB with two decimals, for messages only (``"34.92 GiB"``)."""
    return f"{n / _GIB:.2f} GiB"


def _bytes_and_gib(n: int) -> str:
    return f"{format_bytes(n)} ({n:,} bytes)"


@dataclass(frozen=True)
class MemoryBudget:
    """The memory plan of one replica on one device; see ``plan_budget`` for the arithmetic.

    Attributes:
        device_total_bytes: total memory of the device, as torch reports it.
        num_gpus: the replica's ``ray_actor_options.num_gpus`` share of the device.
        memory_fraction: the optional tighter per-deployment cap, as a fraction of the device.
        budget_bytes: ``int(num_gpus * device_total_bytes)``, the replica's share.
        cap_bytes: the whole-process limit: ``budget_bytes``, or
            ``int(memory_fraction * device_total_bytes)`` when ``memory_fraction`` is set.
        overhead_bytes: memory the process holds outside PyTorch (CUDA context and the like).
        torch_fraction: the value to pass to ``torch.cuda.set_per_process_memory_fraction``.
        torch_cap_bytes: ``cap_bytes - overhead_bytes``, the bytes the caching allocator may
            reserve. torch computes its limit as ``fraction * total`` in floating point, so its
            own figure may differ from this one by a byte or so.
    """

    device_total_bytes: int
    num_gpus: float
    memory_fraction: float | None
    budget_bytes: int
    cap_bytes: int
    overhead_bytes: int
    torch_fraction: float
    torch_cap_bytes: int


def plan_budget(
    num_gpus: float,
    device_total_bytes: int,
    overhead_bytes: int,
    memory_fraction: float | None = None,
) -> MemoryBudget:
    """Compute a replica's memory budget and the torch cap fraction that enforces it.

    Call this at start-up, after CUDA is initialised but before any weights load, with
    ``overhead_bytes = nvml_process_bytes - torch.cuda.memory_reserved()``: the bytes this process
    already holds that the torch cap will not count.

    Arithmetic, on an illustrative device of 150,000,000,000 bytes with 600,000,000 bytes of
    overhead:

    ================  ==================================  ==================================
    figure            ``num_gpus=0.25``                   ``num_gpus=0.25, memory_fraction=0.2``
    ================  ==================================  ==================================
    budget_bytes      int(0.25 x 150e9) = 37,500,000,000  37,500,000,000
    cap_bytes         = budget_bytes = 37,500,000,000     int(0.2 x 150e9) = 30,000,000,000
    torch_cap_bytes   37.5e9 - 0.6e9 = 36,900,000,000     30e9 - 0.6e9 = 29,400,000,000
    torch_fraction    36.9e9 / 150e9 = 0.246              29.4e9 / 150e9 = 0.196
    ================  ==================================  ==================================

    Args:
        num_gpus: the replica's share of the device, in (0, 1].
        device_total_bytes: the device's total memory (``total_memory`` of its properties).
        overhead_bytes: non-PyTorch bytes already held by this process, >= 0.
        memory_fraction: an optional tighter cap, in (0, num_gpus]; None uses the whole share.

    Raises:
        MemoryConfigError: a value is out of range, or the overhead leaves no room for torch.
    """
    if device_total_bytes <= 0:
        raise MemoryConfigError(f"device_total_bytes must be > 0, got {device_total_bytes}")
    if overhead_bytes < 0:
        raise MemoryConfigError(f"overhead_bytes must be >= 0, got {overhead_bytes}")
    if not (math.isfinite(num_gpus) and 0 < num_gpus <= 1):
        raise MemoryConfigError(
            f"ray_actor_options.num_gpus must be in (0, 1] for a capped replica, got {num_gpus}; "
            "set a fraction of one GPU such as 0.25"
        )
    budget_bytes = int(num_gpus * device_total_bytes)
    if memory_fraction is None:
        cap_bytes = budget_bytes
    else:
        if not (math.isfinite(memory_fraction) and 0 < memory_fraction <= num_gpus):
            raise MemoryConfigError(
                f"memory_fraction={memory_fraction} must be > 0 and <= num_gpus={num_gpus}; "
                f"set memory_fraction to a value in (0, {num_gpus}] or remove it to use the "
                "whole num_gpus share"
            )
        cap_bytes = int(memory_fraction * device_total_bytes)
    if overhead_bytes >= cap_bytes:
        setting = "num_gpus" if memory_fraction is None else "memory_fraction"
        raise MemoryConfigError(
            f"the process already holds {_bytes_and_gib(overhead_bytes)} outside PyTorch "
            f"(CUDA context and libraries), which is not below its cap of "
            f"{_bytes_and_gib(cap_bytes)} ({setting}="
            f"{num_gpus if memory_fraction is None else memory_fraction}); "
            f"raise {setting} in the deploy config"
        )
    torch_cap_bytes = cap_bytes - overhead_bytes
    return MemoryBudget(
        device_total_bytes=device_total_bytes,
        num_gpus=num_gpus,
        memory_fraction=memory_fraction,
        budget_bytes=budget_bytes,
        cap_bytes=cap_bytes,
        overhead_bytes=overhead_bytes,
        torch_fraction=torch_cap_bytes / device_total_bytes,
        torch_cap_bytes=torch_cap_bytes,
    )


def check_free_memory(free_bytes: int, own_bytes: int, budget: MemoryBudget, gpu_uuid: str) -> None:
    """Fail fast when the GPU cannot hold this replica's cap.

    The replica can grow to ``budget.cap_bytes``. What it may use is the device's free memory
    plus what it already holds (``own_bytes``, e.g. its CUDA context, which NVML counts as used).

    Args:
        free_bytes: the device's free memory now (NVML or ``torch.cuda.mem_get_info``).
        own_bytes: bytes this process already holds on the device.
        budget: the plan from ``plan_budget``.
        gpu_uuid: the device's UUID, named in the message.

    Raises:
        InsufficientGpuMemoryError: ``free_bytes + own_bytes < budget.cap_bytes``; the message
            says how much is free, how much was asked and which setting to lower.
    """
    available_bytes = free_bytes + own_bytes
    if available_bytes >= budget.cap_bytes:
        return
    if budget.memory_fraction is None:
        asked = f"num_gpus={budget.num_gpus}"
    else:
        asked = f"memory_fraction={budget.memory_fraction}"
    raise InsufficientGpuMemoryError(
        f"GPU {gpu_uuid} has {_bytes_and_gib(free_bytes)} free "
        f"(plus {_bytes_and_gib(own_bytes)} already held by this replica), but the replica's cap "
        f"asks for {_bytes_and_gib(budget.cap_bytes)} ({asked} of "
        f"{_bytes_and_gib(budget.device_total_bytes)}), "
        f"{_bytes_and_gib(budget.cap_bytes - available_bytes)} short. Lower "
        "ray_actor_options.num_gpus or memory_fraction in the deploy config, or free the memory "
        "held by other processes on this GPU (see nvidia-smi)"
    )


def startup_tolerance_bytes(total_bytes: int) -> int:
    """How far below its cap a device's free memory may be at start-up and still pass.

    A device never has its whole total free: the driver and tools hold some of it even when idle
    (9,240,576 bytes on an idle H200 here), so a replica with ``num_gpus: 1`` would always fail a
    strict check. Up to 0.5 % of the device (about 0.7 GiB on an H200) the cap is lowered to what
    is free instead; beyond that the replica fails with the message that names the fix.
    """
    return total_bytes // 200


def fit_cap_to_device(
    budget: MemoryBudget, free_bytes: int, own_bytes: int, gpu_uuid: str
) -> MemoryBudget:
    """``budget`` if the device can hold its cap; a cap lowered to the available bytes when it
    falls short by at most ``startup_tolerance_bytes`` (logged); else InsufficientGpuMemoryError."""
    available = free_bytes + own_bytes
    short = budget.cap_bytes - available
    if short <= 0 or short > startup_tolerance_bytes(budget.device_total_bytes):
        check_free_memory(free_bytes, own_bytes, budget, gpu_uuid)
        return budget
    lowered = plan_budget(
        budget.num_gpus,
        budget.device_total_bytes,
        budget.overhead_bytes,
        available / budget.device_total_bytes,
    )
    logger.warning(
        "GPU %s: %s is available, %s short of this replica's cap of %s (held outside it); "
        "cap lowered to %s",
        gpu_uuid,
        format_bytes(available),
        format_bytes(short),
        format_bytes(budget.cap_bytes),
        format_bytes(lowered.cap_bytes),
    )
    return lowered


def cap_to_limit(budget: MemoryBudget, limit_bytes: int) -> MemoryBudget:
    """``budget`` with its cap no higher than the MPS limit (which is sized from NVML's usable
    bytes, rounded down to MiB): the driver refuses past the limit, so the plan must too."""
    if limit_bytes >= budget.cap_bytes:
        return budget
    torch_cap = max(0, limit_bytes - budget.overhead_bytes)
    return dataclasses.replace(
        budget,
        cap_bytes=limit_bytes,
        torch_cap_bytes=torch_cap,
        torch_fraction=torch_cap / budget.device_total_bytes,
    )


def should_free_cache(
    policy: CachePolicy,
    reserved_bytes: int,
    allocated_bytes: int,
    budget_bytes: int,
    threshold_fraction: float,
) -> bool:
    """Decide whether to call ``torch.cuda.empty_cache()`` between batches.

    ``"always"`` frees every time (lowest footprint, other replicas can use the memory, costs
    re-allocation); ``"never"`` keeps the cache (fastest); ``"threshold"`` frees when the cached
    but unused bytes, ``reserved_bytes - allocated_bytes``, exceed
    ``threshold_fraction * budget_bytes``. Example: budget 37,500,000,000 bytes, threshold 0.1:
    free when more than 3,750,000,000 bytes sit idle in the cache.

    Raises:
        MemoryConfigError: unknown policy, or ``threshold_fraction`` outside [0, 1].
    """
    if not 0.0 <= threshold_fraction <= 1.0:
        raise MemoryConfigError(
            f"cache threshold_fraction must be in [0, 1], got {threshold_fraction}; "
            "use e.g. 0.1 to free the cache when idle cached bytes exceed 10% of the budget"
        )
    if policy == "always":
        return True
    if policy == "never":
        return False
    if policy == "threshold":
        return reserved_bytes - allocated_bytes > threshold_fraction * budget_bytes
    raise MemoryConfigError(
        f"unknown cache policy {policy!r}; use one of {', '.join(map(repr, _CACHE_POLICIES))}"
    )
