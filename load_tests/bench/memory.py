"""NVML per-process memory, sampled while the load runs (once a second by default)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


def _nvml_process_samples(nvml: Any) -> list[dict[str, Any]]:
    """Every NVML call the bench makes: used GPU bytes of each compute process, by GPU UUID."""
    out = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = getattr(proc, "usedGpuMemory", None)
            out.append(
                {
                    "source": "nvml",
                    "gpu_uuid": uuid,
                    "pid": int(proc.pid),
                    "used_bytes": int(used) if used is not None else None,
                }
            )
    return out


@dataclass
class MemoryLog:
    samples: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class MemorySampler:
    """Background thread sampling NVML per-process memory and/or `GET /v1/memory` each interval.

    Missing NVML (no GPU, no driver) or an unreachable memory URL is noted once in `notes` and
    sampling carries on with whatever works. Samples carry `t_unix_s` and `source`.
    """

    def __init__(
        self, memory_url: str | None, use_nvml: bool = True, interval_s: float = 1.0
    ) -> None:
        self.memory_url = memory_url
        self.use_nvml = use_nvml
        self.interval_s = interval_s
        self.log = MemoryLog()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self._noted: set[str] = set()

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def stop(self) -> MemoryLog:
        self._stop.set()
        self._thread.join(timeout=10.0)
        return self.log

    def _note(self, key: str, message: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self.log.notes.append(message)

    def _run(self) -> None:
        nvml = self._init_nvml() if self.use_nvml else None
        http = httpx.Client(timeout=max(0.5, self.interval_s)) if self.memory_url else None
        try:
            while True:
                self._sample(nvml, http)
                if self._stop.wait(self.interval_s):
                    self._sample(nvml, http)  # one last point at the end of the run
                    break
        finally:
            if http is not None:
                http.close()
            if nvml is not None:
                try:
                    nvml.nvmlShutdown()
                except Exception:
                    pass

    def _sample(self, nvml: Any, http: httpx.Client | None) -> None:
        now = time.time()
        if nvml is not None:
            try:
                for s in _nvml_process_samples(nvml):
                    self.log.samples.append({"t_unix_s": now, **s})
            except Exception as exc:  # NVML errors are many types; keep sampling the rest
                self._note("nvml_query", f"nvml query failed: {exc!r}")
        if http is not None and self.memory_url:
            self._poll(http, self.memory_url, now)

    def _init_nvml(self) -> Any:
        try:
            import pynvml

            pynvml.nvmlInit()
            return pynvml
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver errors
            self._note("nvml", f"nvml unavailable: {exc!r}")
            return None

    def _poll(self, http: httpx.Client, url: str, now: float) -> None:
        try:
            resp = http.get(url)
            resp.raise_for_status()
            replicas = resp.json().get("replicas", [])
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            self._note("memory_url", f"memory poll of {url} failed: {exc!r}")
            return
        for rep in replicas:
            if isinstance(rep, dict):
                scalars = {
                    k: v
                    for k, v in rep.items()
                    if v is None or isinstance(v, int | float | str | bool)
                }
                self.log.samples.append({"t_unix_s": now, "source": "server", **scalars})


def nvml_process_pids() -> set[int] | None:
    """PIDs of every compute process NVML sees now on any GPU; None when NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, NVMLError_LibraryNotFound, driver errors
        return None
    try:
        return {int(s["pid"]) for s in _nvml_process_samples(pynvml)}
    except Exception:  # NVML errors are many types: treat as unknown
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
