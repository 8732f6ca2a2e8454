"""A replica's share of its GPU once it runs: the cap in force, its refit as memory outside torch
grows, the cache policy between batches, and the figures the memory report shows.
serve_app.gpu.capping starts one (measures the CUDA context and applies the cap).

A replica is in one of three GPU modes (``Partition.gpu_mode``, shown in the memory report):

- ``cuda``: a real GPU; budget, torch cap and calibration.
- ``logical-scripted``: tests only (serve_app.testing.partition): a CPU replica holding a share
  of a logical GPU under scripted NVML, with a budget but no cap.
- ``cpu``: no GPU at all; no budget, no cap.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Literal, TypedDict

import torch

from serve_app.gpu import mps
from serve_app.gpu.budget import CachePolicy, MemoryBudget, format_bytes, should_free_cache
from serve_app.gpu.hostheap import HostHeap
from serve_app.gpu.snapshot import DeviceMemory

logger = logging.getLogger("serve_app")

GpuMode = Literal["cuda", "logical-scripted", "cpu"]

# After a batch that left torch's reserved bytes at this share of its cap or more, the replica
# re-reads its memory outside torch at once; after any batch, once REFIT_EVERY_S has passed
# since the last reading (a kernel loads on its first launch, outside torch).
REFIT_NEAR_CAP = 0.9
REFIT_EVERY_S = 5.0
# Kept free under the cap from the first refit on, for growth outside torch not yet seen: refit
# counts growth only after it happened. Each step of growth measured after start-up's first
# launch was well under this (memory test 2 in
# benchmarks/journal/2026-12-01-startup-and-throughput-h200.md).
NON_TORCH_RESERVE_BYTES = 64 * 1024 * 1024


class PartitionFigures(TypedDict):
    """A partition's memory figures (integer bytes), as ``GET /v1/memory`` shows them."""

    device: str
    gpu_mode: GpuMode
    gpu_uuid: str | None
    num_gpus: float
    budget_bytes: int
    cap_bytes: int
    torch_fraction: float
    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    non_torch_overhead_bytes: int
    non_torch_growth_bytes: int
    non_torch_reserve_bytes: int
    held_outside_torch_bytes: int
    overhead_source: str | None
    nvml_process_bytes: int | None
    cache_policy: CachePolicy
    cache_frees: int
    enforcement: str | None
    mps_limit_bytes: int | None
    mps_thread_percentage: int | None
    mps_pipe_dir: str | None


@dataclass
class Partition:
    """The device a replica runs on and, on a GPU, its budget and cap.

    ``memory`` (derived from ``device`` and ``gpu_uuid``) takes every reading and is the only
    way to give cached blocks back.
    """

    device: torch.device
    num_gpus: float
    gpu_mode: GpuMode = "cpu"
    gpu_uuid: str | None = None
    budget: MemoryBudget | None = None
    overhead_source: str | None = None
    cache_policy: CachePolicy = "never"
    cache_threshold_fraction: float = 0.0
    cache_frees: int = 0
    # What the model backend keeps outside torch (serve_app.adapters.contract.HeldOutsideTorch):
    # its whole reserve is in the overhead; its margin is not yet in NVML's reading.
    held_outside_torch_bytes: int = 0
    held_margin_bytes: int = 0
    enforcement: str = "torch"
    mps_plan: mps.ClientPlan | None = None
    # How much the memory outside torch grew after start-up's measurement (``refit``).
    non_torch_growth_bytes: int = 0
    # Held free for that growth once refit has run (NON_TORCH_RESERVE_BYTES; 0 before).
    non_torch_reserve_bytes: int = 0
    memory: DeviceMemory = field(init=False, repr=False)
    heap: HostHeap = field(default_factory=HostHeap, repr=False)  # the host heap's trims
    _refit_at_s: float = field(default_factory=time.perf_counter, repr=False)  # last reading

    def __post_init__(self) -> None:
        uuid = self.gpu_uuid if self.device.type == "cuda" else None
        self.memory = DeviceMemory(self.device, uuid)

    @property
    def on_gpu(self) -> bool:
        """Whether the model runs on a CUDA device (torch memory calls apply)."""
        return self.device.type == "cuda"

    @property
    def gpu_fraction(self) -> float:
        """The GPU share to report to the headroom controller: ``num_gpus`` when this replica
        holds a (real or logical-scripted) GPU share, else 0."""
        return self.num_gpus if self.gpu_mode != "cpu" else 0.0

    @property
    def torch_capped(self) -> bool:
        """Whether PyTorch's allocator cap is set (enforcement torch or both, on a GPU)."""
        return self.on_gpu and self.budget is not None and self.enforcement != "mps"

    def free_cache(self, count: bool = True) -> None:
        """Give cached blocks back to the device; ``count`` it as a cache free (start-up's
        own frees are not counted)."""
        if self.on_gpu:
            self.memory.free_cache()
            if count:
                self.cache_frees += 1

    def room_beside_allocated_bytes(self) -> int | None:
        """The room the torch cap leaves beside what is allocated now; None without a budget."""
        if self.budget is None:
            return None
        return max(0, self.budget.torch_cap_bytes - self.memory.allocated_bytes())

    def refit(self, why: str) -> int:
        """Re-measure the bytes this process holds outside torch and lower the torch cap by
        any growth since the last measurement, keeping ``NON_TORCH_RESERVE_BYTES`` free below
        the cap for growth not yet seen, so that the torch cap plus them stays within
        ``cap_bytes``; the growth in bytes (0 when none, or with no torch cap or no NVML
        reading of this process).

        The overhead measured at start-up is the CUDA context. Kernels load on their first
        launch and an instantiated CUDA graph holds device memory of its own, both outside the
        allocator (benchmarks/results/startup/graph_memory_probe_h200.json). Call it on the
        model thread, after work that can load kernels or capture graphs.
        """
        budget = self.budget
        if not self.torch_capped or budget is None:
            return 0
        self._refit_at_s = time.perf_counter()
        non_torch = self.outside_torch_bytes()
        if non_torch is None:
            return 0
        growth = max(0, non_torch - budget.overhead_bytes)
        overhead = budget.overhead_bytes + growth
        torch_cap = max(0, budget.cap_bytes - overhead - NON_TORCH_RESERVE_BYTES)
        if torch_cap >= budget.torch_cap_bytes:
            return 0
        self.budget = dataclasses.replace(
            budget,
            overhead_bytes=overhead,
            torch_cap_bytes=torch_cap,
            torch_fraction=torch_cap / budget.device_total_bytes,
        )
        self.non_torch_growth_bytes += growth
        self.non_torch_reserve_bytes = NON_TORCH_RESERVE_BYTES
        torch.cuda.set_per_process_memory_fraction(self.budget.torch_fraction, self.device)
        if self.memory.reserved_bytes() > torch_cap:
            self.free_cache(count=False)
        logger.info(
            "memory outside torch grew by %s (%s; %s since start-up): torch cap lowered to %s "
            "(%s kept free for growth not yet seen) so that the process stays within its cap "
            "of %s",
            format_bytes(growth),
            why,
            format_bytes(self.non_torch_growth_bytes),
            format_bytes(torch_cap),
            format_bytes(NON_TORCH_RESERVE_BYTES),
            format_bytes(budget.cap_bytes),
        )
        return growth

    def outside_torch_bytes(self) -> int | None:
        """The bytes this process holds outside torch's allocator as the overhead counts them:
        ``memory.outside_torch_bytes()`` plus the margin held for the backend's own memory;
        None where that reading is None."""
        if self.gpu_uuid is None:
            return None
        outside = self.memory.outside_torch_bytes()
        return None if outside is None else outside + self.held_margin_bytes

    def after_batch(self) -> bool:
        """Trim the host heap when due (CPU and GPU alike), refit when due, then give cached
        memory back by policy; True when it freed torch's cache."""
        self.heap.after_batch()
        if not self.on_gpu or self.budget is None:
            return False
        reserved, allocated = self.memory.reserved_and_allocated_bytes()
        if self.torch_capped and reserved >= REFIT_NEAR_CAP * self.budget.torch_cap_bytes:
            # Full to its cap, the allocator leaves no slack for growth outside torch (a kernel
            # loading for a new shape): count it now rather than at the next periodic refit.
            self.refit("torch near its cap")
        elif time.perf_counter() - self._refit_at_s >= REFIT_EVERY_S:
            self.refit("serving")
        if should_free_cache(
            self.cache_policy,
            reserved,
            allocated,
            self.budget.budget_bytes,
            self.cache_threshold_fraction,
        ):
            self.free_cache()
            return True
        return False

    def process_bytes(self) -> int | None:
        """NVML's bytes for this process on its GPU (None on a CPU or when unknown)."""
        return self.memory.process_bytes()

    def report(self) -> PartitionFigures:
        """The memory figures for ``GET /v1/memory`` (integer bytes)."""
        snap = self.memory.snapshot()
        budget = self.budget
        plan = self.mps_plan
        return {
            "device": str(self.device),
            "gpu_mode": self.gpu_mode,
            "gpu_uuid": self.gpu_uuid,
            "num_gpus": self.num_gpus,
            "budget_bytes": budget.budget_bytes if budget else 0,
            "cap_bytes": budget.cap_bytes if budget else 0,
            # Only a real GPU has a torch cap; a logical-scripted budget is bookkeeping only.
            "torch_fraction": budget.torch_fraction if budget and self.torch_capped else 0.0,
            "allocated_bytes": snap.allocated_bytes,
            "reserved_bytes": snap.reserved_bytes,
            "peak_allocated_bytes": snap.peak_allocated_bytes,
            "peak_reserved_bytes": snap.peak_reserved_bytes,
            "non_torch_overhead_bytes": budget.overhead_bytes if budget else 0,
            "non_torch_growth_bytes": self.non_torch_growth_bytes,
            "non_torch_reserve_bytes": self.non_torch_reserve_bytes,
            "held_outside_torch_bytes": self.held_outside_torch_bytes,
            "overhead_source": self.overhead_source,
            "nvml_process_bytes": snap.nvml_process_bytes,
            "cache_policy": self.cache_policy,
            "cache_frees": self.cache_frees,
            "enforcement": self.enforcement if self.gpu_mode != "cpu" else None,
            "mps_limit_bytes": plan.limit_bytes if plan else None,
            "mps_thread_percentage": plan.thread_percentage if plan else None,
            "mps_pipe_dir": plan.pipe_dir if plan else None,
        }
