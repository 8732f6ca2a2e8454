"""Memory readings of one process on one device, as data, and the one owner of the calls that
take them.

Where a replica's GPU bytes go, as NVML counts them for its process::

    nvml process bytes = torch reserved bytes           (weights, activations, the allocator's
                                                          cache, CUDA graphs' pool: what the
                                                          torch cap counts)
                       + outside torch                  (the CUDA context, kernels loaded on
                                                          their first launch, instantiated
                                                          graphs, nvJPEG's buffers)

``DeviceMemory`` is the only code in serve_app that calls torch's memory functions or gives
cached blocks back (``free_cache``); the partition, start-up, CUDA graphs and the adapters' own
probes all go through it. ``MemorySnapshot`` is one reading; ``memory_profiling`` measures what
a piece of work left outside torch (the model of vLLM's ``memory_profiling``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from serve_app.gpu import nvml


@dataclass(frozen=True)
class MemorySnapshot:
    """Memory figures of this process on one device at one moment (integer bytes).

    Attributes:
        allocated_bytes: bytes in live tensors.
        reserved_bytes: bytes the caching allocator holds, live or cached: what the torch cap
            counts.
        peak_allocated_bytes: high-water mark of ``allocated_bytes`` since the last reset.
        peak_reserved_bytes: high-water mark of ``reserved_bytes`` since the last reset.
        nvml_process_bytes: what NVML reports for this process, or None when unknown.
        non_torch_bytes: ``nvml_process_bytes - reserved_bytes`` (CUDA context, other
            libraries), or None when NVML is unknown.
    """

    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    nvml_process_bytes: int | None
    non_torch_bytes: int | None

    @classmethod
    def measure(cls, device: torch.device | str, nvml_process_bytes: int | None) -> MemorySnapshot:
        """Read torch's allocator figures for ``device`` (zero on a non-CUDA device), beside
        NVML's per-process figure read by the caller (or None)."""
        dev = torch.device(device)
        if dev.type == "cuda":
            allocated = int(torch.cuda.memory_allocated(dev))
            reserved = int(torch.cuda.memory_reserved(dev))
            peak_allocated = int(torch.cuda.max_memory_allocated(dev))
            peak_reserved = int(torch.cuda.max_memory_reserved(dev))
        else:
            allocated = reserved = peak_allocated = peak_reserved = 0
        return cls(
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            peak_allocated_bytes=peak_allocated,
            peak_reserved_bytes=peak_reserved,
            nvml_process_bytes=nvml_process_bytes,
            non_torch_bytes=None if nvml_process_bytes is None else nvml_process_bytes - reserved,
        )


@dataclass
class DeviceMemory:
    """This process's memory on one device: torch's figures, NVML's figure for the process, and
    giving cached blocks back. On a CPU every figure is 0 or None and nothing is freed.

    Attributes:
        device: the torch device.
        gpu_uuid: the GPU's NVML UUID (serve_app.gpu.devices), or None on a CPU.
    """

    device: torch.device
    gpu_uuid: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def free_cache(self) -> None:
        """Give the allocator's cached blocks back to the device (``torch.cuda.empty_cache``)."""
        if self.on_gpu:
            with self._lock:
                torch.cuda.empty_cache()

    def synchronize(self) -> None:
        if self.on_gpu:
            torch.cuda.synchronize(self.device)

    def reserved_bytes(self) -> int:
        return int(torch.cuda.memory_reserved(self.device)) if self.on_gpu else 0

    def allocated_bytes(self) -> int:
        return int(torch.cuda.memory_allocated(self.device)) if self.on_gpu else 0

    def peak_reserved_bytes(self) -> int:
        return int(torch.cuda.max_memory_reserved(self.device)) if self.on_gpu else 0

    def reserved_and_allocated_bytes(self) -> tuple[int, int]:
        """Both from one read of the allocator's stats, as the nested dict the allocator
        returns: this runs after every batch, and torch's own functions (``memory_stats``
        under each) flatten, sort and copy every stat in Python first."""
        if not self.on_gpu:
            return 0, 0
        stats = torch.cuda.memory_stats_as_nested_dict(self.device)
        return (
            int(stats.get("reserved_bytes", {}).get("all", {}).get("current", 0)),
            int(stats.get("allocated_bytes", {}).get("all", {}).get("current", 0)),
        )

    def reset_peak(self) -> None:
        if self.on_gpu:
            torch.cuda.reset_peak_memory_stats(self.device)

    def total_bytes(self) -> int:
        return int(torch.cuda.get_device_properties(self.device).total_memory)

    def free_device_bytes(self) -> int:
        """The device's free bytes as CUDA reports them to this process."""
        return int(torch.cuda.mem_get_info(self.device)[0])

    def process_bytes(self) -> int | None:
        """NVML's bytes for this process on this GPU; None when unknown (no GPU, NVML failed,
        or a PID namespace hides the process)."""
        if self.gpu_uuid is None:
            return None
        return nvml.value(nvml.process_used_bytes(os.getpid(), self.gpu_uuid))

    def used_bytes(self) -> int | None:
        """``process_bytes``, or the device's used bytes where NVML does not list the process
        (a PID namespace); None when neither can be read."""
        proc = self.process_bytes()
        if proc is not None or self.gpu_uuid is None:
            return proc
        dev = nvml.value(nvml.device_memory(self.gpu_uuid))
        return None if dev is None else int(dev.used_bytes)

    def outside_torch_bytes(self) -> int | None:
        """NVML's bytes for the process less torch's reserved bytes; None with no NVML reading,
        or when torch's figure moved while NVML was read (another thread allocating)."""
        if not self.on_gpu:
            return None
        reserved = self.reserved_bytes()
        proc = self.process_bytes()
        if proc is None or self.reserved_bytes() != reserved:
            return None
        return int(proc) - reserved

    def snapshot(self) -> MemorySnapshot:
        return MemorySnapshot.measure(self.device, self.process_bytes())


@dataclass
class MemoryProfile:
    """What a piece of work left in this process's memory (``memory_profiling``).

    Attributes:
        before_bytes: the reading before the work (cache emptied).
        high_bytes: the highest reading at a ``sample`` (cache emptied each time).
        reserved_before_bytes: torch's reserved bytes before the work.
        reserved_after_bytes: torch's reserved bytes after it (set on leaving the block).
    """

    memory: DeviceMemory
    read: Callable[[], int]
    before_bytes: int = 0
    high_bytes: int = 0
    reserved_before_bytes: int = 0
    reserved_after_bytes: int = 0

    def sample(self) -> None:
        """Wait for the device, give cached blocks back and keep the highest reading: what the
        work holds outside torch shows, what torch only cached does not."""
        self.memory.synchronize()
        self.memory.free_cache()
        self.high_bytes = max(self.high_bytes, self.read())

    @property
    def outside_torch_growth_bytes(self) -> int:
        """How much more the readings grew than torch's reserved bytes did: what the work keeps
        outside the allocator (never below 0)."""
        reserved_delta = self.reserved_after_bytes - self.reserved_before_bytes
        return max(0, self.high_bytes - self.before_bytes - reserved_delta)


@contextmanager
def memory_profiling(memory: DeviceMemory, read: Callable[[], int]) -> Iterator[MemoryProfile]:
    """Measure what the block leaves outside torch: ``read`` (the process's bytes; it raises
    where they cannot be read) before it, at each ``profile.sample()`` inside it, and torch's
    reserved bytes on both sides. Empties torch's cache."""
    memory.synchronize()
    memory.free_cache()
    before = read()
    profile = MemoryProfile(
        memory,
        read,
        before_bytes=before,
        high_bytes=before,
        reserved_before_bytes=memory.reserved_bytes(),
    )
    yield profile
    profile.reserved_after_bytes = memory.reserved_bytes()


def is_torch_oom(exc: BaseException) -> bool:
    """True for a CUDA out-of-memory error: ``torch.OutOfMemoryError``, or a ``RuntimeError``
    whose message contains ``"CUDA out of memory"`` (raised by some extensions and older paths).
    """
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)
