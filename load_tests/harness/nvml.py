"""NVML, as the load tools read it: the GPUs (name, UUID, total bytes), per-process memory
sampled while a load runs (once a second by default), and those samples judged against each
replica's ``budget_bytes``. Every NVML call of load_tests is here (the research probes aside)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx


def nvml_devices() -> list[dict[str, Any]]:
    """Name, UUID, total bytes and driver of each GPU via NVML ([] when there is none)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPUs to describe
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out.append(
                {
                    "index": i,
                    "name": _text(pynvml.nvmlDeviceGetName(h)),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                    "total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "driver_version": _text(driver),
                }
            )
        return out
    finally:
        pynvml.nvmlShutdown()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvml_process_samples(nvml: Any) -> list[dict[str, Any]]:
    """Used GPU bytes of each compute process, by GPU UUID."""
    out = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
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


class BudgetWatch:
    """NVML per-process bytes (``MemorySampler``, every ``interval_s``) judged against each
    replica's ``budget_bytes``, read from ``GET /v1/memory`` every ``budgets_every_s`` so that
    replacement replicas (new pids) are judged too. For a whole run with replicas coming and
    going, such as the fault suite; ``stop`` returns ``budget_violations`` and what was judged.
    """

    def __init__(
        self, memory_url: str, interval_s: float = 0.25, budgets_every_s: float = 2.0
    ) -> None:
        self.memory_url = memory_url
        self.budgets_every_s = budgets_every_s
        self.budgets: dict[int, int] = {}
        self.sampler = MemorySampler(None, use_nvml=True, interval_s=interval_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="budget-poll", daemon=True)

    def start(self) -> BudgetWatch:
        self.sampler.start()
        self._thread.start()
        return self

    def _read_budgets(self) -> None:
        try:
            reps = httpx.get(self.memory_url, timeout=10.0).json().get("replicas", [])
            for r in reps:
                if r.get("budget_bytes") and r.get("pid") is not None:
                    self.budgets[int(r["pid"])] = int(r["budget_bytes"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            pass  # a replica being replaced; the next poll reads it

    def _poll(self) -> None:
        while True:
            self._read_budgets()
            if self._stop.wait(self.budgets_every_s):
                break

    def so_far(self) -> dict[str, Any]:
        """The verdict on the samples taken until now, for a run that writes its JSON as it
        goes: a run cut short (a lost GPU lease) still records what its samples showed."""
        samples = list(self.sampler.log.samples)  # a copy: the sampler thread appends
        return {
            **judge_budgets(samples, dict(self.budgets)),
            "nvml_notes": list(self.sampler.log.notes),
        }

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=15.0)
        self._read_budgets()
        log = self.sampler.stop()
        return {**judge_budgets(log.samples, self.budgets), "nvml_notes": log.notes}


def judge_budgets(samples: list[dict[str, Any]], budgets: dict[int, int]) -> dict[str, Any]:
    """``BudgetWatch``'s verdict on NVML samples, given budgets by pid: the violations, the
    samples and processes judged, the largest used/budget ratio and the bytes over by pid."""
    judged = budget_violations(samples, budgets)
    peaks = judged.pop("peak_bytes")
    return {
        **judged,
        "replica_pids_judged": len(peaks),
        "max_used_over_budget": max((peaks[pid] / budgets[pid] for pid in peaks), default=None),
        "bytes_over_budget_by_pid": {
            pid: peak - budgets[pid] for pid, peak in peaks.items() if peak > budgets[pid]
        },
    }


def budget_violations(
    samples: Iterable[Mapping[str, Any]], budgets_by_pid: Mapping[int, int]
) -> dict[str, Any]:
    """NVML samples of a replica process above its ``budget_bytes`` (from GET /v1/memory).

    Only processes with a known budget are judged; returns the violation count, the samples
    judged, and each judged pid's peak used bytes."""
    judged = 0
    violations = 0
    peaks: dict[int, int] = {}
    for s in samples:
        pid, used = s.get("pid"), s.get("used_bytes")
        if s.get("source") != "nvml" or pid is None or used is None:
            continue
        if int(pid) not in budgets_by_pid:
            continue
        judged += 1
        peaks[int(pid)] = max(peaks.get(int(pid), 0), int(used))
        if int(used) > int(budgets_by_pid[int(pid)]):
            violations += 1
    return {"budget_violations": violations, "nvml_samples_judged": judged, "peak_bytes": peaks}
