"""The one place that talks to NVML.

Every NVML function goes through ``_call``, which turns ``pynvml.NVMLError`` (and ``ImportError``
or ``OSError`` when the library is missing) into an ``NvmlError`` *value*: callers get typed
results and never an exception. NVML is initialised lazily on first use and shut down at exit.

Devices are addressed by UUID (``"GPU-xxxxxxxx-xxxx-..."``), never by NVML index: Ray rewrites
``CUDA_VISIBLE_DEVICES``, so torch's device 0 is not NVML's device 0 (serve_app.gpu.devices maps
one to the other).

Readings come from a source: the driver (``NvmlSource``), or in tests a script that replays
readings (serve_app.testing.nvml), switched on by ``SERVE_APP_FAKE_NVML`` (serve_app.env.doubles)
or in-process with ``set_source``. Nothing happens at import.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from serve_app import env
from serve_app.gpu.readings import GpuMemory, NvmlError, NvmlErrorKind, ReadingSource

__all__ = [
    "FAKE_NVML_VAR",
    "GpuMemory",
    "NvmlError",
    "NvmlErrorKind",
    "NvmlSource",
    "ReadingSource",
    "all_devices",
    "device_memory",
    "get_source",
    "is_scripted",
    "mps_blockers",
    "mps_client_pids",
    "process_used_bytes",
    "processes",
    "set_source",
]

FAKE_NVML_VAR = env.FAKE_NVML_VAR

T = TypeVar("T")


# NVML return codes (nvml.h) -> our kinds. Numbers, not pynvml constants, so a fake module
# in tests needs only NVMLError.
_KIND_BY_CODE: dict[int, NvmlErrorKind] = {
    1: NvmlErrorKind.UNINITIALIZED,
    3: NvmlErrorKind.NOT_SUPPORTED,
    4: NvmlErrorKind.NO_PERMISSION,
    6: NvmlErrorKind.NOT_FOUND,
    9: NvmlErrorKind.DRIVER_NOT_LOADED,
    10: NvmlErrorKind.TIMEOUT,
    12: NvmlErrorKind.LIBRARY_NOT_FOUND,
    13: NvmlErrorKind.NOT_SUPPORTED,  # function not found: an older driver
    15: NvmlErrorKind.GPU_LOST,
    25: NvmlErrorKind.NOT_SUPPORTED,  # argument version mismatch: no memory info v2
}


def _import_pynvml() -> ModuleType:
    import pynvml

    return pynvml


def _call(nv: ModuleType | None, fn: Callable[..., T] | str, *args: Any) -> T | NvmlError:
    """Run one NVML function (a callable, or its name in ``nv``); every NVML call in serve_app
    goes through here."""
    try:
        if isinstance(fn, str):
            return getattr(nv, fn)(*args)  # type: ignore[no-any-return]
        return fn(*args)
    except (ImportError, OSError) as exc:
        return NvmlError(NvmlErrorKind.LIBRARY_NOT_FOUND, f"NVML library not available: {exc}")
    except AttributeError as exc:  # an older pynvml without this function
        return NvmlError(NvmlErrorKind.NOT_SUPPORTED, f"{_name(fn)}: {exc}")
    except Exception as exc:
        nvml_error = getattr(nv, "NVMLError", None)
        if nvml_error is not None and isinstance(exc, nvml_error):
            code = getattr(exc, "value", None)
            kind = (
                _KIND_BY_CODE.get(code, NvmlErrorKind.UNKNOWN)
                if isinstance(code, int)
                else (NvmlErrorKind.UNKNOWN)
            )
            return NvmlError(kind, f"{_name(fn)}: {exc}")
        # Anything else from the binding (ctypes, a driver quirk) is still only a failed reading.
        return NvmlError(NvmlErrorKind.UNKNOWN, f"{_name(fn)}: {type(exc).__name__}: {exc}")


def _name(fn: Callable[..., Any] | str) -> str:
    return fn if isinstance(fn, str) else getattr(fn, "__name__", "nvml")


class NvmlSource:
    """Readings from the NVIDIA driver through pynvml (nvidia-ml-py)."""

    scripted = False

    def __init__(self, importer: Callable[[], ModuleType] = _import_pynvml) -> None:
        self._importer = importer
        self._lock = threading.Lock()
        self._nv: ModuleType | None = None
        self._memory_v2: bool | None = None  # None: not tried yet

    def _module(self) -> ModuleType | NvmlError:
        with self._lock:
            if self._nv is not None:
                return self._nv
            nv = _call(None, self._importer)
            if isinstance(nv, NvmlError):
                return nv
            init = _call(nv, "nvmlInit")
            if isinstance(init, NvmlError):
                return init
            self._nv = nv
            atexit.register(self.shutdown)
            return nv

    def shutdown(self) -> None:
        """Shut NVML down if this source initialised it; the next reading initialises again."""
        with self._lock:
            nv, self._nv = self._nv, None
        if nv is not None:
            _call(nv, "nvmlShutdown")

    def _memory(self, nv: ModuleType, uuid: str, handle: Any) -> GpuMemory | NvmlError:
        info: Any = None
        if self._memory_v2 is not False:
            version = getattr(nv, "nvmlMemory_v2", None)
            info = _call(nv, "nvmlDeviceGetMemoryInfo", handle, version) if version else None
            if isinstance(info, NvmlError):
                if info.kind is not NvmlErrorKind.NOT_SUPPORTED:
                    return info
                info = None
            self._memory_v2 = info is not None
        if info is None:
            info = _call(nv, "nvmlDeviceGetMemoryInfo", handle)
            if isinstance(info, NvmlError):
                return info
        return GpuMemory(
            uuid=uuid,
            total_bytes=int(info.total),
            free_bytes=int(info.free),
            used_bytes=int(info.used),
            reserved_bytes=int(getattr(info, "reserved", 0) or 0),
        )

    def _handle(self, uuid: str) -> tuple[ModuleType, Any] | NvmlError:
        """The NVML module and the handle of the GPU with this UUID."""
        nv = self._module()
        if isinstance(nv, NvmlError):
            return nv
        handle = _call(nv, "nvmlDeviceGetHandleByUUID", uuid)
        return handle if isinstance(handle, NvmlError) else (nv, handle)

    def device_memory(self, uuid: str) -> GpuMemory | NvmlError:
        got = self._handle(uuid)
        return got if isinstance(got, NvmlError) else self._memory(got[0], uuid, got[1])

    def _handles(self) -> tuple[ModuleType, list[Any]] | NvmlError:
        """The NVML module and every GPU's handle, in NVML's index order."""
        nv = self._module()
        if isinstance(nv, NvmlError):
            return nv
        count = _call(nv, "nvmlDeviceGetCount")
        if isinstance(count, NvmlError):
            return count
        handles = []
        for index in range(int(count)):  # enumeration only; results are keyed by UUID
            handle = _call(nv, "nvmlDeviceGetHandleByIndex", index)
            if isinstance(handle, NvmlError):
                return handle
            handles.append(handle)
        return nv, handles

    def all_devices(self) -> list[GpuMemory] | NvmlError:
        got = self._handles()
        if isinstance(got, NvmlError):
            return got
        nv, handles = got
        devices: list[GpuMemory] = []
        for handle in handles:
            uuid = _call(nv, "nvmlDeviceGetUUID", handle)
            if isinstance(uuid, NvmlError):
                return uuid
            memory = self._memory(nv, _as_str(uuid), handle)
            if isinstance(memory, NvmlError):
                return memory
            devices.append(memory)
        return devices

    def process_used_bytes(self, pid: int, uuid: str) -> int | None | NvmlError:
        got = self._handle(uuid)
        if isinstance(got, NvmlError):
            return got
        nv, handle = got
        # Under MPS the clients are listed apart from ordinary compute processes.
        listings = (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetMPSComputeRunningProcesses",
        )
        errors: list[NvmlError] = []
        for name in listings:
            procs = _call(nv, name, handle)
            if isinstance(procs, NvmlError):
                if procs.kind is not NvmlErrorKind.NOT_SUPPORTED:
                    return procs  # a lost GPU is not "PID not listed"
                errors.append(procs)
                continue
            for proc in procs:
                if int(proc.pid) == pid:
                    used = getattr(proc, "usedGpuMemory", None)
                    return None if used is None else int(used)
        if len(errors) == len(listings):
            return errors[0]
        # Not listed: no context on this GPU, or a PID namespace (containers) hides it.
        return None

    def _listing(self, uuid: str, name: str) -> list[Any] | NvmlError:
        """One of NVML's process listings (``name``) of the GPU with this UUID."""
        got = self._handle(uuid)
        if isinstance(got, NvmlError):
            return got
        procs: list[Any] | NvmlError = _call(got[0], name, got[1])
        return procs

    def processes(self, uuid: str) -> dict[int, int] | NvmlError:
        """Every process with a context on this GPU and its bytes (MPS clients included: NVML
        lists them among the compute processes too, with their own bytes)."""
        procs = self._listing(uuid, "nvmlDeviceGetComputeRunningProcesses")
        if isinstance(procs, NvmlError):
            return procs
        return {int(p.pid): int(getattr(p, "usedGpuMemory", None) or 0) for p in procs}

    def mps_client_pids(self, uuid: str) -> set[int] | NvmlError:
        """PIDs NVML lists as MPS clients of this GPU."""
        procs = self._listing(uuid, "nvmlDeviceGetMPSComputeRunningProcesses")
        return procs if isinstance(procs, NvmlError) else {int(p.pid) for p in procs}

    def mps_blockers(self) -> list[str] | NvmlError:
        """Why MPS cannot run on this node's GPUs: none at all, MIG, a prohibited compute mode."""
        got = self._handles()
        if isinstance(got, NvmlError):
            return got
        nv, handles = got
        if not handles:
            return ["this node has no NVIDIA GPU"]
        reasons: list[str] = []
        for index, handle in enumerate(handles):
            mig = _call(nv, "nvmlDeviceGetMigMode", handle)
            if not isinstance(mig, NvmlError) and int(mig[0]) == 1:
                reasons.append(
                    f"GPU {index} is in MIG mode (MPS clients cannot set a memory limit per MIG "
                    "instance here; serve_app does not place replicas on MIG instances)"
                )
            mode = _call(nv, "nvmlDeviceGetComputeMode", handle)
            if not isinstance(mode, NvmlError) and int(mode) == 2:  # NVML_COMPUTEMODE_PROHIBITED
                reasons.append(f"GPU {index} is in the Prohibited compute mode")
        return reasons

    def utilization_and_name(self, uuid: str) -> tuple[int, str] | NvmlError:
        """The share of the last sample period (percent) in which a kernel ran on this GPU,
        and its name (``serve-app plan --measure``'s GPU time and provenance)."""
        got = self._handle(uuid)
        if isinstance(got, NvmlError):
            return got
        rates: Any = _call(got[0], "nvmlDeviceGetUtilizationRates", got[1])
        if isinstance(rates, NvmlError):
            return rates
        name: Any = _call(got[0], "nvmlDeviceGetName", got[1])
        if isinstance(name, NvmlError):
            return name
        return int(rates.gpu), _as_str(name)


def _as_str(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


_source_lock = threading.Lock()
_source: ReadingSource | None = None


def set_source(source: ReadingSource | None) -> None:
    """Use ``source`` for every reading in this process; ``None`` goes back to the default."""
    global _source
    with _source_lock:
        _source = source


def get_source() -> ReadingSource:
    """The source in use: one set with ``set_source``, else the NVML script that
    ``SERVE_APP_FAKE_NVML`` names (tests), else the driver. Chosen on first use."""
    global _source
    with _source_lock:
        if _source is None:
            script = env.doubles().nvml_script
            if script:
                from serve_app.testing.nvml import ScriptedSource

                _source = ScriptedSource(script)
            else:
                _source = NvmlSource()
        return _source


def is_scripted() -> bool:
    """Whether readings in this process come from a script (tests, CPU machines)."""
    return get_source().scripted


def device_memory(uuid: str) -> GpuMemory | NvmlError:
    """Total, free and used bytes of the GPU with this NVML UUID."""
    return get_source().device_memory(uuid)


def all_devices() -> list[GpuMemory] | NvmlError:
    """Memory of every GPU the driver sees on this node (ignores CUDA_VISIBLE_DEVICES)."""
    return get_source().all_devices()


def process_used_bytes(pid: int, uuid: str) -> int | None | NvmlError:
    """GPU bytes NVML attributes to ``pid`` on this GPU; ``None`` when NVML does not list the
    PID (no CUDA context there, or a container's PID namespace hides it: replicas therefore also
    report their own torch figures)."""
    return get_source().process_used_bytes(pid, uuid)


def processes(uuid: str) -> dict[int, int] | NvmlError:
    """Bytes per PID of every process with a context on this GPU (MPS clients included)."""
    return get_source().processes(uuid)


def mps_client_pids(uuid: str) -> set[int] | NvmlError:
    """The PIDs NVML lists as MPS clients of this GPU (empty without an MPS server)."""
    return get_source().mps_client_pids(uuid)


def mps_blockers() -> list[str] | NvmlError:
    """Why MPS cannot run on this node (no GPU, MIG, a prohibited compute mode); empty if it can."""
    return get_source().mps_blockers()


def utilization_and_name(uuid: str) -> tuple[int, str] | NvmlError:
    """This GPU's utilisation (percent of the last sample period) and name; NOT_SUPPORTED from
    a scripted source, which scripts memory only."""
    source = get_source()
    if isinstance(source, NvmlSource):
        return source.utilization_and_name(uuid)
    return NvmlError(NvmlErrorKind.NOT_SUPPORTED, "scripted NVML has no utilisation")


def value(result: T | NvmlError) -> T | None:
    """A reading's value, or None where NVML failed."""
    return None if isinstance(result, NvmlError) else result
