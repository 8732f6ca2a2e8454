"""The one place that talks to NVML.

Every NVML function goes through ``_call``, which turns ``pynvml.NVMLError`` (and ``ImportError``
or ``OSError`` when the library is missing) into an ``NvmlError`` *value*: callers get typed
results and never an exception. NVML is initialised lazily on first use and shut down at exit.

Devices are addressed by UUID (``"GPU-xxxxxxxx-xxxx-..."``), never by NVML index: Ray rewrites
``CUDA_VISIBLE_DEVICES``, so torch's device 0 is not NVML's device 0. ``uuid_for_torch_device``
maps a torch device to its NVML UUID.

Readings come from a source: the real driver (``NvmlSource``) or, for tests on machines without
a GPU, a ``ScriptedSource`` that replays readings from a JSON file. The scripted source is
switched on by the ``SERVE_APP_FAKE_NVML`` environment variable (a path), or in-process with
``set_source``. Nothing happens at import.
"""

from __future__ import annotations

import atexit
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar

from serve_app import env

__all__ = [
    "FAKE_NVML_VAR",
    "GpuMemory",
    "NvmlError",
    "NvmlErrorKind",
    "NvmlSource",
    "ReadingSource",
    "ScriptedSource",
    "all_devices",
    "device_memory",
    "format_uuid",
    "get_source",
    "is_scripted",
    "device_memory_for_visible",
    "mps_blockers",
    "mps_client_pids",
    "process_used_bytes",
    "processes",
    "set_source",
    "uuid_for_torch_device",
]

FAKE_NVML_VAR = "SERVE_APP_FAKE_NVML"
"""Environment variable: path of a JSON script that stands in for NVML (see ScriptedSource)."""

T = TypeVar("T")


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


class ReadingSource(Protocol):
    """Where readings come from: the driver, or a script in tests."""

    def device_memory(self, uuid: str) -> GpuMemory | NvmlError: ...

    def all_devices(self) -> list[GpuMemory] | NvmlError: ...

    def process_used_bytes(self, pid: int, uuid: str) -> int | None | NvmlError: ...


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


def _as_str(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ScriptedSource:
    """Readings replayed from a JSON script, standing in for NVML on machines without a GPU.

    The file is re-read whenever it changes, so a test may also rewrite it while running::

        {
          "t0_unix_s": 1700000000.0,          # optional; default: the first reading's time
          "devices": {"GPU-00000000-0000-0000-0000-000000000001": {"total_bytes": 1000}},
          "steps": [
            {"at_s": 0,  "devices": {"GPU-...01": {"free_bytes": 900, "used_bytes": 100}},
                         "processes": {"1234": {"GPU-...01": 80}}},
            {"at_s": 30, "devices": {"GPU-...01": {"error": "gpu_lost"}}},
            {"at_s": 60, "error": "library_not_found"}
          ]
        }

    The step in force is the last one with ``at_s <= now - t0``. A device missing from that step
    keeps its previous figures; ``error`` (a ``NvmlErrorKind`` value) fails a device or, at
    step level, every reading. A malformed script gives ``NvmlError(kind=SCRIPT)``.
    """

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time) -> None:
        self._path = Path(path)
        self._clock = clock
        self._lock = threading.Lock()
        self._mtime_ns: int | None = None
        self._script: dict[str, Any] = {}
        self._t0_s: float | None = None

    def _load(self) -> dict[str, Any] | NvmlError:
        try:
            mtime_ns = self._path.stat().st_mtime_ns
            if mtime_ns != self._mtime_ns:
                script = json.loads(self._path.read_text())
                if not isinstance(script, dict):
                    raise ValueError("the script must be a JSON object")
                self._script, self._mtime_ns = script, mtime_ns
        except (OSError, ValueError) as exc:
            return NvmlError(NvmlErrorKind.SCRIPT, f"NVML script {self._path}: {exc}")
        return self._script

    def _state(self) -> tuple[dict[str, dict[str, Any]], dict[str, Any]] | NvmlError:
        """Devices (figures merged over the steps so far) and the step in force."""
        with self._lock:
            script = self._load()
            if isinstance(script, NvmlError):
                return script
            now_s = self._clock()
            if self._t0_s is None:
                self._t0_s = float(script.get("t0_unix_s", now_s))
            t0_s = float(script.get("t0_unix_s", self._t0_s))
        try:
            devices = {u: dict(d) for u, d in dict(script.get("devices", {})).items()}
            current: dict[str, Any] = {}
            steps = sorted(script.get("steps", []), key=lambda s: float(s.get("at_s", 0.0)))
            for step in steps:
                if float(step.get("at_s", 0.0)) > now_s - t0_s:
                    break
                current = step
                for uuid, figures in dict(step.get("devices", {})).items():
                    devices.setdefault(uuid, {})
                    devices[uuid].pop("error", None)
                    devices[uuid].update(figures)
        except (AttributeError, TypeError, ValueError) as exc:
            return NvmlError(NvmlErrorKind.SCRIPT, f"NVML script {self._path}: {exc}")
        if "error" in current:
            return _scripted_error(current["error"], "all devices")
        return devices, current

    def _device(self, uuid: str, figures: dict[str, Any]) -> GpuMemory | NvmlError:
        if "error" in figures:
            return _scripted_error(figures["error"], uuid)
        try:
            total = int(figures["total_bytes"])
            free = int(figures.get("free_bytes", total))
            reserved = int(figures.get("reserved_bytes", 0))
            used = int(figures.get("used_bytes", total - free - reserved))
        except (KeyError, TypeError, ValueError) as exc:
            return NvmlError(NvmlErrorKind.SCRIPT, f"NVML script {self._path}: {uuid}: {exc!r}")
        return GpuMemory(uuid, total, free, used, reserved)

    def device_memory(self, uuid: str) -> GpuMemory | NvmlError:
        state = self._state()
        if isinstance(state, NvmlError):
            return state
        devices, _ = state
        if uuid not in devices:
            return NvmlError(NvmlErrorKind.NOT_FOUND, f"no GPU with UUID {uuid} in the script")
        return self._device(uuid, devices[uuid])

    def all_devices(self) -> list[GpuMemory] | NvmlError:
        state = self._state()
        if isinstance(state, NvmlError):
            return state
        out: list[GpuMemory] = []
        for uuid, figures in sorted(state[0].items()):
            memory = self._device(uuid, figures)
            if isinstance(memory, NvmlError):
                return memory
            out.append(memory)
        return out

    def process_used_bytes(self, pid: int, uuid: str) -> int | None | NvmlError:
        state = self._state()
        if isinstance(state, NvmlError):
            return state
        devices, step = state
        if uuid not in devices:
            return NvmlError(NvmlErrorKind.NOT_FOUND, f"no GPU with UUID {uuid} in the script")
        if "error" in devices[uuid]:
            return _scripted_error(devices[uuid]["error"], uuid)
        used = dict(step.get("processes", {})).get(str(pid), {}).get(uuid)
        return None if used is None else int(used)

    def processes(self, uuid: str) -> dict[int, int] | NvmlError:
        state = self._state()
        if isinstance(state, NvmlError):
            return state
        devices, step = state
        if uuid not in devices:
            return NvmlError(NvmlErrorKind.NOT_FOUND, f"no GPU with UUID {uuid} in the script")
        return {
            int(pid): int(per_gpu[uuid])
            for pid, per_gpu in dict(step.get("processes", {})).items()
            if uuid in per_gpu
        }

    def mps_client_pids(self, uuid: str) -> set[int] | NvmlError:
        state = self._state()
        if isinstance(state, NvmlError):
            return state
        return {int(p) for p in dict(state[1].get("mps_clients", {})).get(uuid, [])}

    def mps_blockers(self) -> list[str] | NvmlError:
        state = self._state()
        if isinstance(state, NvmlError):
            return state
        return [str(r) for r in state[1].get("mps_blockers", [])]


def _scripted_error(kind: Any, where: str) -> NvmlError:
    try:
        parsed = NvmlErrorKind(str(kind))
    except ValueError:
        parsed = NvmlErrorKind.UNKNOWN
    return NvmlError(parsed, f"scripted NVML error {kind!r} for {where}")


_source_lock = threading.Lock()
_source: ReadingSource | None = None


def set_source(source: ReadingSource | None) -> None:
    """Use ``source`` for every reading in this process; ``None`` goes back to the default."""
    global _source
    with _source_lock:
        _source = source


def get_source() -> ReadingSource:
    """The source in use: one set with ``set_source``, else a ``ScriptedSource`` when
    ``SERVE_APP_FAKE_NVML`` names a script, else the driver. Chosen on first use."""
    global _source
    with _source_lock:
        if _source is None:
            script = env.get(FAKE_NVML_VAR)
            _source = ScriptedSource(script) if script else NvmlSource()
        return _source


def is_scripted() -> bool:
    """Whether readings in this process come from a ``ScriptedSource`` (tests, CPU machines)."""
    return isinstance(get_source(), ScriptedSource)


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


def _optional(name: str) -> Callable[..., Any] | NvmlError:
    fn = getattr(get_source(), name, None)
    if fn is None:
        return NvmlError(NvmlErrorKind.NOT_SUPPORTED, f"this reading source has no {name}")
    return fn  # type: ignore[no-any-return]


def processes(uuid: str) -> dict[int, int] | NvmlError:
    """Bytes per PID of every process with a context on this GPU (MPS clients included)."""
    fn = _optional("processes")
    return fn if isinstance(fn, NvmlError) else fn(uuid)


def mps_client_pids(uuid: str) -> set[int] | NvmlError:
    """The PIDs NVML lists as MPS clients of this GPU (empty without an MPS server)."""
    fn = _optional("mps_client_pids")
    return fn if isinstance(fn, NvmlError) else fn(uuid)


def mps_blockers() -> list[str] | NvmlError:
    """Why MPS cannot run on this node (no GPU, MIG, a prohibited compute mode); empty if it can."""
    fn = _optional("mps_blockers")
    return fn if isinstance(fn, NvmlError) else fn()


def device_memory_for_visible(visible: str) -> GpuMemory | NvmlError:
    """The memory of the GPU that one CUDA_VISIBLE_DEVICES entry names (an index, or a UUID or
    its prefix), read without initialising CUDA. Indices follow NVML's (PCI bus) order, which
    is CUDA's on a node of identical GPUs, the case Ray's GPU ids assume."""
    devices = all_devices()
    if isinstance(devices, NvmlError):
        return devices
    if visible.isdigit():
        index = int(visible)
        if index < len(devices):
            return devices[index]
    else:
        matches = [d for d in devices if d.uuid.startswith(visible)]
        if len(matches) == 1:
            return matches[0]
    return NvmlError(NvmlErrorKind.NOT_FOUND, f"no single GPU matches {visible!r}")


def count_visible(visible: str | None, uuids: list[str]) -> int:
    """How many of the GPUs with these NVML UUIDs (in NVML's index order) CUDA gives a
    process whose CUDA_VISIBLE_DEVICES is ``visible`` (None: unset, all of them). Each entry
    is an index or a UUID (or its unique prefix); CUDA stops at the first entry that names no
    GPU, and names each GPU once."""
    if visible is None:
        return len(uuids)
    seen: set[int] = set()
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit():
            index = int(entry)
        else:
            matches = [i for i, u in enumerate(uuids) if entry and u.startswith(entry)]
            index = matches[0] if len(matches) == 1 else len(uuids)
        if index >= len(uuids) or index in seen:
            break
        seen.add(index)
    return len(seen)


def visible_cuda_devices(visible: str | None, driver: NvmlSource | None = None) -> int | NvmlError:
    """How many GPUs CUDA would give a process with CUDA_VISIBLE_DEVICES ``visible``, read from
    the driver through NVML without importing torch or initialising CUDA (``count_visible``).
    Always the driver's GPUs (``driver``, default the process's NvmlSource), never a scripted
    source's: this decides whether there is a GPU at all."""
    if driver is None:
        source = get_source()
        driver = source if isinstance(source, NvmlSource) else NvmlSource()
    devices = driver.all_devices()
    if isinstance(devices, NvmlError):
        return devices
    return count_visible(visible, [d.uuid for d in devices])


def format_uuid(raw: object) -> str:
    """NVML's UUID string (``"GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"``) for a torch UUID.

    Accepts ``torch.cuda.get_device_properties(i).uuid`` (a ``_CUuuid`` whose ``str`` is the
    bare UUID), a bare UUID string, or 16 raw bytes. Strings that already carry NVML's ``GPU-``
    or ``MIG-`` prefix come back unchanged.
    """
    if isinstance(raw, bytes | bytearray) and len(raw) == 16:
        hexed = bytes(raw).hex()
        text = f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"
    else:
        text = _as_str(raw) if isinstance(raw, str | bytes) else str(raw)
    text = text.strip()
    if text.startswith(("GPU-", "MIG-")):
        return text
    return f"GPU-{text.lower()}"


def uuid_for_torch_device(index: int) -> str | None:
    """The NVML UUID of torch's CUDA device ``index`` (as seen through CUDA_VISIBLE_DEVICES),
    or ``None`` when there is no such device in this process.

    Under a scripted source (CPU machines, logical Ray GPUs) the script's devices, sorted by
    UUID, play the physical GPUs: ``CUDA_VISIBLE_DEVICES`` (which Ray sets) picks among them.
    """
    source = get_source()
    if isinstance(source, ScriptedSource):
        return _scripted_uuid(source, index)
    import torch

    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    return format_uuid(torch.cuda.get_device_properties(index).uuid)


def _scripted_uuid(source: ScriptedSource, index: int) -> str | None:
    devices = source.all_devices()
    if isinstance(devices, NvmlError):
        return None
    visible = (env.get("CUDA_VISIBLE_DEVICES") or "").strip()
    try:
        order = [int(v) for v in visible.split(",") if v.strip()] if visible else None
    except ValueError:
        return None
    physical = order[index] if order is not None and index < len(order) else index
    if order is not None and index >= len(order):
        return None
    return devices[physical].uuid if 0 <= physical < len(devices) else None
