"""What this host reads of a running server's replica processes (those that run on it), for
``serve-app plan --from-running`` and the planner's proof: each process's CPU seconds and
resident bytes, each of its threads' CPU seconds (psutil), this host's memory, and the cores
the replicas may run on. A replica saturates when its busiest thread does
(serve_app.plan.live.bound_busy_s)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def local_process(rep: dict[str, Any]) -> Any:
    """The replica's process when it runs on this host (its pid, started when it says), else
    None."""
    import psutil

    try:
        proc = psutil.Process(int(rep["pid"]))
        if abs(proc.create_time() - float(rep["process_started_at_s"])) > 1.0:
            return None  # another process with that pid
        return proc
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None


def cpu_seconds(reps: list[dict[str, Any]]) -> dict[tuple[Any, Any], float]:
    """User + system CPU seconds of each replica process on this host, by (replica, pid)."""
    out = {}
    for rep in reps:
        proc = local_process(rep)
        if proc is not None:
            times = proc.cpu_times()
            out[(rep.get("replica_id"), rep.get("pid"))] = times.user + times.system
    return out


def thread_seconds(reps: list[dict[str, Any]]) -> dict[tuple[Any, Any], dict[int, float]]:
    """User + system CPU seconds of each thread of each replica process on this host, by
    (replica, pid), then by thread id."""
    import psutil

    out = {}
    for rep in reps:
        proc = local_process(rep)
        if proc is None:
            continue
        try:
            threads = proc.threads()
        except psutil.Error:
            continue
        out[(rep.get("replica_id"), rep.get("pid"))] = {
            t.id: t.user_time + t.system_time for t in threads
        }
    return out


def thread_name(pid: Any, tid: int) -> str:
    """A thread as py-spy's dump of its process names it: the kernel's name of the thread
    (``/proc/PID/task/TID/comm``, often the worker's first title, as Ray's threads inherit it)
    and its id, which py-spy prints beside the Python thread's name."""
    try:
        comm = Path(f"/proc/{int(pid)}/task/{tid}/comm").read_text().strip()
    except (OSError, TypeError, ValueError):
        comm = "gone"
    main = ", the main thread" if str(tid) == str(pid) else ""
    return f"{comm} (thread {tid} of process {pid}{main})"


@dataclass(frozen=True)
class Threads:
    """Each local replica process's threads' CPU seconds at the window's ends, and the seconds
    between the two reads."""

    before: dict[tuple[Any, Any], dict[int, float]] = field(default_factory=dict)
    after: dict[tuple[Any, Any], dict[int, float]] = field(default_factory=dict)
    window_s: float = 0.0

    def busiest(self, keys: list[tuple[Any, Any]]) -> tuple[float, str] | None:
        """The mean over ``keys`` (those read at both ends) of each process's busiest thread's
        CPU fraction of the window, and the name of the busiest of them; None: none read."""
        fractions: list[float] = []
        top: tuple[float, Any, int] | None = None
        for key in keys:
            b, a = self.before.get(key), self.after.get(key)
            if b is None or a is None or self.window_s <= 0:
                continue
            used = {tid: a[tid] - b[tid] for tid in a if tid in b}
            if not used:
                continue
            tid = max(used, key=lambda t: used[t])
            fraction = max(0.0, used[tid]) / self.window_s
            fractions.append(fraction)
            if top is None or fraction > top[0]:
                top = (fraction, key[1], tid)
        if not fractions or top is None:
            return None
        return sum(fractions) / len(fractions), thread_name(top[1], top[2])


def server_cores(procs: Any) -> set[int]:
    """The cores the replicas' processes on this host may run on (the union of their CPU
    affinities), not this process's own, which may be pinned apart from the server; this
    process's where no replica's affinity can be read."""
    import psutil

    cores: set[int] = set()
    for proc in procs:
        if proc is None:
            continue
        try:
            cores.update(proc.cpu_affinity())
        except psutil.Error:
            continue
    return cores or set(os.sched_getaffinity(0))


@dataclass(frozen=True)
class HostFacts:
    """What this host read of the replicas' processes (those that run on it) and of itself."""

    cpu_before: dict[tuple[Any, Any], float]  # (replica_id, pid) -> CPU seconds
    cpu_after: dict[tuple[Any, Any], float]
    rss_bytes: dict[tuple[Any, Any], int]
    all_local: bool  # every replica's process runs on this host
    memory_bytes: int
    cores: float
    threads: Threads = field(default_factory=Threads)


def host_facts(
    cpu_before: dict[tuple[Any, Any], float],
    last: dict[str, Any],
    threads_before: dict[tuple[Any, Any], dict[int, float]] | None = None,
    threads_read_at_s: float | None = None,
) -> HostFacts:
    """What this host reads of ``last``'s replicas now; ``threads_before`` and the monotonic
    time it was read at give the threads' window."""
    import psutil

    reps = list(last.get("replicas") or [])
    procs = {(r.get("replica_id"), r.get("pid")): local_process(r) for r in reps}
    threads_after = thread_seconds(reps)
    window_s = time.monotonic() - threads_read_at_s if threads_read_at_s is not None else 0.0
    return HostFacts(
        cpu_before=cpu_before,
        cpu_after=cpu_seconds(reps),
        rss_bytes={k: int(p.memory_info().rss) for k, p in procs.items() if p is not None},
        all_local=all(p is not None for p in procs.values()),
        memory_bytes=int(psutil.virtual_memory().total),
        cores=float(len(server_cores(procs.values()))),
        threads=Threads(threads_before or {}, threads_after, window_s),
    )
