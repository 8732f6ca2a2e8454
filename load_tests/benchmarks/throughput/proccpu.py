"""CPU seconds of the server's processes over a measured window, read from /proc (psutil), and
split by kind, so that a row says what one request costs the host and where that CPU goes.

Which processes are the server: every descendant of the given roots (the serve worker, whose
children are Ray's daemons, its workers and the HAProxy that Serve starts; a LitServe
subprocess; the static no-op HAProxy), less the excluded pids and their descendants (the
open-loop client's processes, the harness process itself). wrk runs as a child of the harness
only during its try, so it is gone when the window's second snapshot is taken; it is excluded by
name as well, in case a snapshot meets it.

Each process's own user + system time counts (not its reaped children's, which are counted as
processes of their own while they live). A process that starts inside the window counts whole;
one that exits inside it is lost for that window (``server_processes_exited`` says how many).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from serve_app.plan.ingress import HAPROXY, kind_of

KINDS: tuple[str, ...] = (
    "replica",
    "haproxy",
    "ray-serve-control",
    "ray-daemons",
    "litserve-http",
    "other",
)
CLIENT_NAMES = frozenset({"wrk", "taskset"})
# Ray sets its workers' titles to "ray::<actor class>"; these are Serve's control plane and
# serve_app's registry actor (serve_app/serving/registry.py), all Serve-side, none per request.
_CONTROL_ACTORS = (
    "ray::ServeController",
    "ray::ProxyActor",
    "ray::HAProxyManager",
    "ray::Registry",
)
_DAEMON_ACTORS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::IDLE")
_DAEMON_BINARIES = frozenset({"gcs_server", "raylet"})
_DAEMON_PATHS = ("/ray/dashboard/", "/ray/_private/", "/ray/autoscaler/")


def classify(name: str, cmdline: Sequence[str], litserve: bool = False) -> str:
    """The kind of a server process from its name and command line. ``litserve``: the process is
    in a LitServe server's tree, where the spawned inference workers are the replicas and the
    rest (the forked uvicorn API servers, the main process, its queue manager and ZeroMQ
    broker) serve HTTP and pass requests on."""
    title = cmdline[0] if cmdline else ""
    base = os.path.basename(title.split(" ", 1)[0])
    joined = " ".join(cmdline)
    # HAProxy as the planner's ingress reading knows it; Ray's proxy is Serve's control plane
    # here (the planner charges it to the ingress on purpose).
    if kind_of(name, cmdline) == HAPROXY:
        return "haproxy"
    if litserve:
        return "replica" if "spawn_main" in joined else "litserve-http"
    if title.startswith("ray::ServeReplica"):
        return "replica"
    if title.startswith(_CONTROL_ACTORS):
        return "ray-serve-control"
    if (
        title.startswith(_DAEMON_ACTORS)
        or name in _DAEMON_BINARIES
        or base in _DAEMON_BINARIES
        or any(p in joined for p in _DAEMON_PATHS)
        or name.startswith("ray-dashboard")
    ):
        return "ray-daemons"
    return "other"


@dataclass(frozen=True)
class ProcCpu:
    """One process at one moment: its kind, user + system CPU seconds, and start time (which
    tells a pid reused by a new process from the one seen before)."""

    pid: int
    kind: str
    cpu_s: float
    create_time_s: float
    title: str = ""  # its command line's start, or its name (first_seconds' busiest processes)


def snapshot(
    roots: Iterable[int],
    exclude: Iterable[int] = (),
    litserve_roots: Iterable[int] = (),
    count_roots: bool = True,
) -> dict[int, ProcCpu]:
    """Every live descendant of ``roots`` (and the roots themselves when ``count_roots``), less
    ``exclude`` and their descendants and any wrk: pid -> ProcCpu. ``litserve_roots``' trees
    are classified as LitServe's."""
    import psutil

    def tree(pid: int) -> list[psutil.Process]:
        try:
            p = psutil.Process(pid)
            return [p, *p.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return []

    roots = list(roots)
    skip = {p.pid for pid in exclude for p in tree(pid)} | (set() if count_roots else set(roots))
    lit = {p.pid for pid in litserve_roots for p in tree(pid)}
    out: dict[int, ProcCpu] = {}
    for root in roots:
        for p in tree(root):
            if p.pid in skip or p.pid in out:
                continue
            try:
                with p.oneshot():
                    name, cmdline = p.name(), p.cmdline()
                    t = p.cpu_times()
                    created = p.create_time()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if name in CLIENT_NAMES:
                continue
            kind = classify(name, cmdline, litserve=p.pid in lit)
            title = " ".join(cmdline)[:80] or name
            out[p.pid] = ProcCpu(p.pid, kind, float(t.user + t.system), float(created), title)
    return out


def _in_kind_order(by_kind: Mapping[str, Any]) -> list[str]:
    """The kinds of ``by_kind`` in KINDS' order, any others after them, sorted."""
    return [k for k in KINDS if k in by_kind] + sorted(set(by_kind) - set(KINDS))


def psutil_now_s() -> float:
    """Now on the clock of psutil's ``create_time``: the boot time (whole seconds, from
    /proc/stat) plus the time since boot. Against ``time.time()`` a process's start time can be
    up to a second early, and one started in a window then looks started before it."""
    import psutil

    return float(psutil.boot_time()) + time.clock_gettime(time.CLOCK_BOOTTIME)


def same_process(before: ProcCpu | None, after: ProcCpu) -> bool:
    """Whether ``after`` is the process ``before`` read (not a new one under a reused pid)."""
    return before is not None and abs(before.create_time_s - after.create_time_s) < 0.5


def cpu_delta(
    before: Mapping[int, ProcCpu], after: Mapping[int, ProcCpu], window_start_s: float
) -> dict[str, Any]:
    """CPU seconds the server's processes used between two snapshots, in all and by kind. A
    process in ``after`` only (or under a reused pid) counts whole when it started after
    ``window_start_s`` (on psutil's clock: ``psutil_now_s``); one that the first snapshot missed
    although it was already running cannot be judged and is left out
    (``server_processes_unmeasured``, with its kind in ``server_processes_unmeasured_kinds``)."""
    by_kind: dict[str, float] = {}
    count: dict[str, int] = {}
    started = unmeasured = 0
    unmeasured_kinds: list[str] = []
    for pid, a in after.items():
        b = before.get(pid)
        if b is not None and same_process(b, a):
            used = a.cpu_s - b.cpu_s
        elif a.create_time_s >= window_start_s - 0.5:
            used, started = a.cpu_s, started + 1
        else:
            unmeasured += 1
            unmeasured_kinds.append(
                f"{a.kind}, started {window_start_s - a.create_time_s:.1f} s before"
            )
            continue
        by_kind[a.kind] = by_kind.get(a.kind, 0.0) + max(0.0, used)
        count[a.kind] = count.get(a.kind, 0) + 1
    ordered = _in_kind_order(by_kind)
    return {
        "server_cpu_s": round(sum(by_kind.values()), 3),
        "server_cpu_s_by_kind": {k: round(by_kind[k], 3) for k in ordered},
        "server_processes_by_kind": {k: count[k] for k in ordered},
        "server_processes_started": started,
        "server_processes_exited": sum(1 for pid in before if pid not in after),
        "server_processes_unmeasured": unmeasured,
        "server_processes_unmeasured_kinds": unmeasured_kinds,
    }


def per_1000_requests(delta: Mapping[str, Any], requests: int, window_s: float) -> dict[str, Any]:
    """The window's figures per 1,000 requests answered in it, and the mean number of cores
    the server kept busy (``server_cpu_s`` over the window's seconds)."""
    cpu_s = float(delta["server_cpu_s"])
    scale = 1000.0 / requests if requests > 0 else None
    return {
        **delta,
        "server_cpu_window_s": round(window_s, 3),
        "server_cpu_requests": requests,
        "server_cores_busy": round(cpu_s / window_s, 3) if window_s > 0 else None,
        "server_cpu_s_per_1000_requests": round(cpu_s * scale, 4) if scale else None,
        "server_cpu_s_per_1000_requests_by_kind": {
            k: round(v * scale, 4) for k, v in delta["server_cpu_s_by_kind"].items()
        }
        if scale
        else None,
    }


def combined(windows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several windows' figures as one (their CPU seconds, requests and seconds summed): more
    requests than any one holds, so fewer of /proc's 10 ms ticks lost to rounding."""
    measured = [w for w in windows if w.get("server_cpu_s") is not None]
    if not measured:
        return {}
    by_kind: dict[str, float] = {}
    count: dict[str, int] = {}
    for w in measured:
        for k, v in w.get("server_cpu_s_by_kind", {}).items():
            by_kind[k] = by_kind.get(k, 0.0) + float(v)
        for k, n in w.get("server_processes_by_kind", {}).items():
            count[k] = max(count.get(k, 0), int(n))
    ordered = _in_kind_order(by_kind)
    delta = {
        "server_cpu_s": round(sum(float(w["server_cpu_s"]) for w in measured), 3),
        "server_cpu_s_by_kind": {k: round(by_kind[k], 3) for k in ordered},
        "server_processes_by_kind": {k: count.get(k, 0) for k in ordered},
        **{
            key: sum(int(w.get(key, 0)) for w in measured)
            for key in (
                "server_processes_started",
                "server_processes_exited",
                "server_processes_unmeasured",
            )
        },
        "server_processes_unmeasured_kinds": [
            k for w in measured for k in w.get("server_processes_unmeasured_kinds", [])
        ],
    }
    requests = sum(int(w.get("server_cpu_requests", 0)) for w in measured)
    window_s = sum(float(w.get("server_cpu_window_s", 0.0)) for w in measured)
    return per_1000_requests(delta, requests, window_s)


class ServerCpu:
    """The server's processes, sampled around a client run: ``start()`` before, ``stop(n)``
    after, with the number of requests answered in between."""

    def __init__(
        self,
        roots: Iterable[int],
        exclude: Iterable[int] = (),
        litserve_roots: Iterable[int] = (),
        count_roots: bool = True,
    ) -> None:
        self.roots, self.exclude = list(roots), list(exclude)
        self.litserve_roots, self.count_roots = list(litserve_roots), count_roots
        self._before: dict[int, ProcCpu] = {}
        self.last: tuple[dict[int, ProcCpu], dict[int, ProcCpu]] = ({}, {})  # stop's snapshots
        self._t0 = 0.0  # on psutil's clock (psutil_now_s), as process start times are

    def snapshot(self) -> dict[int, ProcCpu]:
        return snapshot(self.roots, self.exclude, self.litserve_roots, self.count_roots)

    def start(self) -> None:
        self._t0 = psutil_now_s()
        self._before = self.snapshot()

    def stop(self, requests: int) -> dict[str, Any]:
        after = self.snapshot()
        window_s = psutil_now_s() - self._t0
        self.last = (self._before, after)
        return per_1000_requests(cpu_delta(self._before, after, self._t0), requests, window_s)
