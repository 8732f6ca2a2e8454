"""What a GPU memory reading is, whoever takes it: the driver through NVML
(serve_app.gpu.nvml) or, in tests, a script (serve_app.testing.nvml)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class NvmlErrorKind(StrEnum):
    """Why an NVML reading is missing."""

    LIBRARY_NOT_FOUND = "library_not_found"
    DRIVER_NOT_LOADED = "driver_not_loaded"
    GPU_LOST = "gpu_lost"
    NOT_SUPPORTED = "not_supported"
    NOT_FOUND = "not_found"
    NO_PERMISSION = "no_permission"
    UNINITIALIZED = "uninitialized"
    TIMEOUT = "timeout"
    SCRIPT = "script"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class NvmlError:
    """A failed NVML call as a value: ``kind`` for code, ``message`` for people."""

    kind: NvmlErrorKind
    message: str


@dataclass(frozen=True)
class GpuMemory:
    """Device-level memory of one GPU, every process included (Ray's and everyone else's).

    With memory info v2 ``used_bytes`` excludes the driver's ``reserved_bytes``, so
    ``total_bytes = free_bytes + used_bytes + reserved_bytes``; with v1 ``reserved_bytes`` is 0.
    """

    uuid: str
    total_bytes: int
    free_bytes: int
    used_bytes: int
    reserved_bytes: int = 0

    @property
    def cuda_total_bytes(self) -> int:
        """The total a process's CUDA reports (``cudaMemGetInfo``, torch's ``total_memory``):
        NVML's total less what the driver reserves. A replica's budget is its share of this
        figure, so a share derived from NVML must be derived from it too."""
        return self.total_bytes - self.reserved_bytes


class ReadingSource(Protocol):
    """Where readings come from: the driver, or a script in tests (``scripted`` True)."""

    scripted: bool

    def device_memory(self, uuid: str) -> GpuMemory | NvmlError: ...

    def all_devices(self) -> list[GpuMemory] | NvmlError: ...

    def process_used_bytes(self, pid: int, uuid: str) -> int | None | NvmlError: ...

    def processes(self, uuid: str) -> dict[int, int] | NvmlError: ...

    def mps_client_pids(self, uuid: str) -> set[int] | NvmlError: ...

    def mps_blockers(self) -> list[str] | NvmlError: ...
