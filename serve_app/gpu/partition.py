"""A replica's share of its GPU: the start-up sequence that applies the cap, the cache policy
between batches, and the figures the memory report shows.

Start-up order matters: the CUDA context is created and measured *before* any weight touches
the GPU, so that ``torch_fraction`` can be computed net of it (see memory.plan_budget).

A replica is in one of three GPU modes (``Partition.gpu_mode``, shown in the memory report):

- ``cuda``: a real GPU; budget, torch cap and calibration as above.
- ``logical-scripted``: the model runs on the CPU, but Ray gave the replica a share of a *logical*
  GPU and NVML readings come from a script (``SERVE_APP_FAKE_NVML``). The replica names its GPU
  through the script and takes ``num_gpus x`` the scripted total as its budget (no overhead, no
  torch cap: there is no CUDA), so the headroom controller runs end to end on a CPU machine.
- ``cpu``: no GPU at all; no budget, no cap.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from serve_app import env
from serve_app.adapters.image.gpudecode import startup_decoder_memory
from serve_app.config.args import AppArgs
from serve_app.errors import StartupError
from serve_app.gpu import mps, nvml
from serve_app.gpu.budget import (
    GpuMemoryError,
    MemoryBudget,
    MemorySnapshot,
    check_free_memory,
    format_bytes,
    plan_budget,
    should_free_cache,
)

logger = logging.getLogger("serve_app")

GpuMode = Literal["cuda", "logical-scripted", "cpu"]


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


def _free_bytes(device: torch.device, uuid: str, plan: mps.ClientPlan | None) -> int:
    """The device's free bytes. CUDA's figure, except for an MPS client with a limit: CUDA then
    reports what is left of the limit, so NVML's device figure is read instead."""
    if plan is not None:
        dev = _nvml_value(nvml.device_memory(uuid))
        if dev is not None:
            return int(dev.free_bytes)
    return int(torch.cuda.mem_get_info(device)[0])


def _enforcement_text(budget: MemoryBudget, plan: mps.ClientPlan | None, mode: str) -> str:
    parts = []
    if mode != "mps":
        parts.append(f"torch cap fraction {budget.torch_fraction:.4f}")
    if plan is not None:
        parts.append(f"MPS limit {plan.limit_value} ({format_bytes(plan.limit_bytes)})")
        if plan.thread_percentage is not None:
            parts.append(f"{plan.thread_percentage}% of the SMs")
    return ", ".join(parts)


def _nvml_value(result: Any) -> Any | None:
    return None if isinstance(result, nvml.NvmlError) else result


def _used_bytes(uuid: str) -> int | None:
    """This process's NVML bytes on ``uuid``, or the device's used bytes where NVML does not
    list the process (a PID namespace)."""
    proc = _nvml_value(nvml.process_used_bytes(os.getpid(), uuid))
    if proc is not None:
        return int(proc)
    dev = _nvml_value(nvml.device_memory(uuid))
    return None if dev is None else int(dev.used_bytes)


# After a batch that left torch's reserved bytes at this share of its cap or more, the replica
# re-reads its memory outside torch at once (``Partition.refit``); after any batch, once this
# long has passed since the last reading (a kernel loads on its first launch, outside torch).
REFIT_NEAR_CAP = 0.9
REFIT_EVERY_S = 5.0
# Kept free under the cap from the first refit on, for memory outside torch that has not grown
# yet: refit lowers the torch cap only after a kernel has loaded, so a batch that fills torch to
# its cap and loads one would take the process past its cap until then (memory test 2 on the
# H200: 7 MB past, with refit after each batch near the cap and no reserve; 235 MB past before
# any refit). Every step of growth measured after the first launch (76 MiB, done at start-up
# while torch holds only the weights) was well under 64 MiB: about 1 MiB per graph, 7 MB there.
NON_TORCH_RESERVE_BYTES = 64 * 1024 * 1024


@dataclass
class Partition:
    """The device a replica runs on and, on a GPU, its budget and cap."""

    device: torch.device
    num_gpus: float
    gpu_mode: GpuMode = "cpu"
    gpu_uuid: str | None = None
    budget: MemoryBudget | None = None
    overhead_source: str | None = None
    cache_policy: str = "never"
    cache_threshold_fraction: float = 0.0
    cache_frees: int = 0
    decoder_bytes: int = 0  # nvJPEG's buffers and margin, in the overhead (outside the torch cap)
    decoder_margin_bytes: int = 0  # the margin: in the overhead, not yet in NVML's reading
    enforcement: str = "torch"
    mps_plan: mps.ClientPlan | None = None
    # How much the memory outside torch grew after start-up's measurement (``refit``).
    non_torch_growth_bytes: int = 0
    # Held free for that growth once refit has run (NON_TORCH_RESERVE_BYTES; 0 before).
    non_torch_reserve_bytes: int = 0
    _refit_at_s: float = field(default_factory=time.perf_counter, repr=False)  # last reading
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def on_gpu(self) -> bool:
        """Whether the model runs on a CUDA device (torch memory calls apply)."""
        return self.device.type == "cuda"

    @property
    def gpu_fraction(self) -> float:
        """The GPU share to report to the headroom controller: ``num_gpus`` when this replica
        holds a (real or logical-scripted) GPU share, else 0."""
        return self.num_gpus if self.gpu_mode != "cpu" else 0.0

    @classmethod
    def start(cls, args: AppArgs, num_gpus: float) -> Partition:
        """Pick the device; on a GPU, measure the context, check free memory, apply the cap.

        Under MPS enforcement the replica's driver limit goes into its environment first, before
        anything here initialises CUDA (``torch.cuda.is_available`` already does)."""
        enforcement = args.memory.enforcement
        plan = mps.plan_client(
            enforcement, num_gpus, args.memory.memory_fraction, args.memory.compute_share
        )
        device = resolve_device(args.device)
        if device.type != "cuda" and plan is not None:
            raise StartupError(
                f"memory.enforcement {enforcement} needs CUDA, but this replica sees no CUDA "
                f"device; {mps.TORCH_HINT}"
            )
        if device.type != "cuda":
            if num_gpus > 0 and nvml.is_scripted():
                logical = cls._start_logical(args, num_gpus, device)
                if logical is not None:
                    return logical
            logger.warning(
                "serve_app replica on CPU (no CUDA device visible): no memory cap, no calibration"
            )
            return cls(device=device, num_gpus=num_gpus)
        if num_gpus <= 0:
            raise StartupError(
                "this replica sees a GPU but Ray assigned it no GPU share; set "
                "ray_actor_options.num_gpus (e.g. 0.25) for the deployment"
            )
        index = device.index or 0
        uuid = nvml.uuid_for_torch_device(index)
        if uuid is None:
            raise StartupError(
                f"cannot find CUDA device {index}'s UUID in NVML; serve_app identifies GPUs "
                "by UUID to apply and report the memory cap (is the NVIDIA driver installed?)"
            )
        before = _nvml_value(nvml.device_memory(uuid))
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)  # creates the CUDA context: the overhead we measure
        torch.cuda.synchronize(device)
        if plan is not None:  # before any memory is planned: is the driver's limit in force?
            mps.verify_client(plan, os.getpid(), uuid, int(torch.cuda.mem_get_info(device)[0]))
        # nvJPEG's own device buffers (GPU image decode) are cudaMalloc'd outside the torch cap
        # and kept for the process's life: grow them to their worst case now, so that the
        # overhead measured below holds them beside the CUDA context.
        decoder = startup_decoder_memory(args, device, lambda: _used_bytes(uuid))
        total_bytes = int(torch.cuda.get_device_properties(device).total_memory)
        reserved = int(torch.cuda.memory_reserved(device))
        proc = _nvml_value(nvml.process_used_bytes(os.getpid(), uuid))
        after = _nvml_value(nvml.device_memory(uuid))
        if proc is not None:
            overhead, source = max(0, proc - reserved), "nvml_process"
        elif before is not None and after is not None:
            overhead, source = (
                max(0, after.used_bytes - before.used_bytes - reserved),
                ("nvml_device_delta"),
            )
            logger.warning(
                "NVML does not list this process (PID namespace?); overhead measured as the "
                "device's used-bytes change over context creation: %s",
                format_bytes(overhead),
            )
        else:
            raise StartupError(
                "cannot measure this replica's CUDA context through NVML (is the NVIDIA "
                "driver's libnvidia-ml available?); serve_app needs it to apply the memory cap"
            )
        if decoder is not None:  # its measured buffers are in the overhead; add the margin
            overhead += decoder.reserve_bytes - decoder.raw_bytes
        try:
            budget = plan_budget(num_gpus, total_bytes, overhead, args.memory.memory_fraction)
            own = proc if proc is not None else overhead + reserved
            budget = fit_cap_to_device(budget, _free_bytes(device, uuid, plan), int(own), uuid)
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
        return cls(
            device=device,
            num_gpus=num_gpus,
            gpu_mode="cuda",
            gpu_uuid=uuid,
            budget=budget,
            overhead_source=source,
            cache_policy=args.memory.cache_policy,
            cache_threshold_fraction=args.memory.cache_threshold_fraction,
            decoder_bytes=decoder.reserve_bytes if decoder else 0,
            decoder_margin_bytes=decoder.reserve_bytes - decoder.raw_bytes if decoder else 0,
            enforcement=enforcement,
            mps_plan=plan,
        )

    @property
    def torch_capped(self) -> bool:
        """Whether PyTorch's allocator cap is set (enforcement torch or both, on a GPU)."""
        return self.on_gpu and self.budget is not None and self.enforcement != "mps"

    @classmethod
    def _start_logical(
        cls, args: AppArgs, num_gpus: float, device: torch.device
    ) -> Partition | None:
        """A CPU replica holding a logical GPU share under scripted NVML: name the GPU through
        the script and budget ``num_gpus x`` its scripted total (overhead 0, no torch cap).

        ``None`` (plain CPU mode) when the script has no device for this replica.
        """
        uuid = nvml.uuid_for_torch_device(0)
        memory = nvml.device_memory(uuid) if uuid is not None else None
        if uuid is None or isinstance(memory, nvml.NvmlError) or memory is None:
            why = memory.message if isinstance(memory, nvml.NvmlError) else "no scripted device"
            logger.warning(
                "serve_app replica on CPU with a logical GPU share (num_gpus=%s) under scripted "
                "NVML, but the script names no GPU for it (%s; CUDA_VISIBLE_DEVICES=%r): "
                "running as a plain CPU replica",
                num_gpus,
                why,
                env.get("CUDA_VISIBLE_DEVICES"),
            )
            return None
        try:
            budget = plan_budget(num_gpus, memory.total_bytes, 0, args.memory.memory_fraction)
        except GpuMemoryError as exc:
            raise StartupError(str(exc)) from None
        logger.warning(
            "serve_app replica on CPU with a LOGICAL GPU under scripted NVML (%s): GPU %s, "
            "budget %s (num_gpus=%s x scripted total %s), no torch cap; for tests only",
            nvml.FAKE_NVML_VAR,
            uuid,
            format_bytes(budget.budget_bytes),
            num_gpus,
            format_bytes(memory.total_bytes),
        )
        return cls(
            device=device,
            num_gpus=num_gpus,
            gpu_mode="logical-scripted",
            gpu_uuid=uuid,
            budget=budget,
            overhead_source="scripted",
        )

    def free_cache(self, count: bool = True) -> None:
        """Give cached blocks back to the device; ``count`` it as a cache free (calibration's
        own frees are not counted)."""
        if self.on_gpu:
            with self._lock:
                torch.cuda.empty_cache()
                if count:
                    self.cache_frees += 1

    def refit(self, why: str) -> int:
        """Re-measure the bytes this process holds outside torch and lower the torch cap by
        any growth since the last measurement, keeping ``NON_TORCH_RESERVE_BYTES`` free below
        the cap for growth not yet seen, so that the torch cap plus them stays within
        ``cap_bytes``; the growth in bytes (0 when none, or with no torch cap or no NVML
        reading of this process).

        The overhead measured at start-up is the CUDA context alone. Kernels load lazily on
        their first launch and an instantiated CUDA graph holds device memory of its own, both
        outside the allocator: on the H200 a MiniLM replica's first eager pass added 76 MiB and
        112 graphs 126 MiB more (``docs/results/startup/graph_memory_probe_h200.json``). Call
        it on the model thread, after work that can load kernels or capture graphs.
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
        if int(torch.cuda.memory_reserved(self.device)) > torch_cap:
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
        """The bytes this process holds outside torch's allocator, as the overhead counts them
        (NVML's bytes for the process less torch's reserved bytes, plus nvJPEG's margin); None
        with no NVML reading, or when torch's figure moved while NVML was read."""
        if not self.on_gpu or self.gpu_uuid is None:
            return None
        reserved = int(torch.cuda.memory_reserved(self.device))
        proc = self.process_bytes()
        if proc is None or int(torch.cuda.memory_reserved(self.device)) != reserved:
            return None
        return int(proc) - reserved + self.decoder_margin_bytes

    def after_batch(self) -> bool:
        """Give cached memory back by policy; True when it freed."""
        if not self.on_gpu or self.budget is None:
            return False
        # One read of the allocator's stats for both figures: torch's memory_reserved and
        # memory_allocated each build the whole stats dict, and this runs after every batch
        # (about 8% of a loaded MiniLM replica's model thread, docs/results/profile/
        # throughput_x1_r8_h200).
        stats = torch.cuda.memory_stats(self.device)
        reserved = int(stats.get("reserved_bytes.all.current", 0))
        allocated = int(stats.get("allocated_bytes.all.current", 0))
        if self.torch_capped and reserved >= REFIT_NEAR_CAP * self.budget.torch_cap_bytes:
            # Full to its cap, the allocator leaves no slack for growth outside torch (a kernel
            # loading for a new shape): count it now rather than at the next periodic refit.
            self.refit("torch near its cap")
        elif time.perf_counter() - self._refit_at_s >= REFIT_EVERY_S:
            self.refit("serving")
        if should_free_cache(
            self.cache_policy,  # type: ignore[arg-type]
            reserved,
            allocated,
            self.budget.budget_bytes,
            self.cache_threshold_fraction,
        ):
            self.free_cache()
            return True
        return False

    def process_bytes(self) -> int | None:
        if not self.on_gpu or self.gpu_uuid is None:
            return None
        return _nvml_value(nvml.process_used_bytes(os.getpid(), self.gpu_uuid))

    def report(self) -> dict[str, Any]:
        """The memory figures for ``GET /v1/memory`` (integer bytes)."""
        proc = self.process_bytes()
        snap = MemorySnapshot.measure(self.device, proc)
        budget = self.budget
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
            "nvjpeg_bytes": self.decoder_bytes,
            "overhead_source": self.overhead_source,
            "nvml_process_bytes": proc,
            "cache_policy": self.cache_policy,
            "cache_frees": self.cache_frees,
            "enforcement": self.enforcement if self.gpu_mode != "cpu" else None,
            **(self.mps_plan.report() if self.mps_plan else {}),
        }
