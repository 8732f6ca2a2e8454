"""Scripted NVML: readings replayed from a JSON file, standing in for the driver on machines
without a GPU (unit and integration tests, the CPU runs of the benchmarks). serve_app.gpu.nvml
uses it only when SERVE_APP_FAKE_NVML names a script (serve_app.env.doubles), or when a test
passes one to ``nvml.set_source``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serve_app import env
from serve_app.gpu.readings import GpuMemory, NvmlError, NvmlErrorKind, ReadingSource


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

    scripted = True

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


def scripted_uuid(source: ReadingSource, index: int) -> str | None:
    """The UUID of torch's device ``index`` under a script: the script's devices, sorted by
    UUID, play the physical GPUs, and ``CUDA_VISIBLE_DEVICES`` (which Ray sets) picks among
    them."""
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
