"""The ingress of a local Ray cluster and the CPU seconds it spends: HAProxy's processes (the
HTTP ingress ``serve-app run`` starts, which passes each request to a replica's own server) and
Ray Serve's ProxyActor (on the path under Serve's Python proxy; beside HAProxy it still runs, and
its CPU is counted as the ingress's too). ``serve-app plan --measure`` reads them at a window's
edges, as it reads the replica's, so that the solver can charge the ingress per request.

Which processes: those whose name or title says HAProxy or ``ray::ProxyActor`` (the rule of
load_tests/benchmarks/throughput/proccpu.py's ``classify``) and whose parent chain names the Ray
session's directory (the raylet's command line holds it; HAProxy is a child of Serve's
HAProxyManager actor, a child of the raylet), so that other clusters on the host are not
counted. A process seen at both edges counts its difference; one started inside the window
counts whole; one that exits inside it is lost (``lost`` says how many).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

HAPROXY, RAY_PROXY = "haproxy", "ray-proxy"
ANCESTORS = 4  # haproxy -> HAProxyManager -> raylet, with room for a launcher in between


def kind_of(name: str, cmdline: Sequence[str]) -> str | None:
    """``HAPROXY``, ``RAY_PROXY``, or None for any other process."""
    title = cmdline[0] if cmdline else ""
    if name == "haproxy" or os.path.basename(title.split(" ", 1)[0]) == "haproxy":
        return HAPROXY
    if title.startswith("ray::ProxyActor"):
        return RAY_PROXY
    return None


@dataclass(frozen=True)
class ProcCpu:
    """One process at one moment: its kind, user + system CPU seconds, and start time (which
    tells a reused pid from the process seen before)."""

    kind: str
    cpu_s: float
    create_time_s: float


def find(session_dir: str) -> dict[int, str]:
    """The ingress's processes of the Ray session in ``session_dir``: pid -> kind."""
    import psutil

    # The directory itself, not a longer name that starts with it.
    named = re.compile(re.escape(session_dir.rstrip("/")) + r"(?=/|\s|$)")
    found = {}
    for proc in psutil.process_iter(["name", "cmdline"]):
        kind = kind_of(proc.info.get("name") or "", proc.info.get("cmdline") or [])
        if kind is None:
            continue
        try:
            if any(named.search(" ".join(p.cmdline())) for p in proc.parents()[:ANCESTORS]):
                found[proc.pid] = kind
        except psutil.Error:
            continue
    return found


def read(pids: Mapping[int, str]) -> dict[int, ProcCpu]:
    """Each of ``pids`` (pid -> kind) that is still alive, read now."""
    import psutil

    out = {}
    for pid, kind in pids.items():
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                t = p.cpu_times()
                out[pid] = ProcCpu(kind, float(t.user + t.system), float(p.create_time()))
        except psutil.Error:
            continue
    return out


def snapshot(session_dir: str) -> dict[int, ProcCpu]:
    """The session's ingress processes and their CPU seconds, now."""
    return read(find(session_dir))


@dataclass(frozen=True)
class IngressCpu:
    """The ingress's CPU seconds over a window, by kind, and how many processes each kind had."""

    cpu_s_by_kind: dict[str, float]
    processes_by_kind: dict[str, int]
    lost: int  # processes that exited inside the window (their last seconds not counted)

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu_s_by_kind.values())


def delta(
    before: Mapping[int, ProcCpu], after: Mapping[int, ProcCpu], window_start_s: float
) -> IngressCpu:
    """The CPU seconds between two snapshots (see the module docstring); ``window_start_s`` a
    Unix time. A process in ``after`` only that started before the window is left out: the
    first snapshot missed it, and its seconds then cannot be told from the window's."""
    used: dict[str, float] = {}
    count: dict[str, int] = {}
    for pid, a in after.items():
        b = before.get(pid)
        if b is not None and abs(b.create_time_s - a.create_time_s) < 0.5:
            spent = a.cpu_s - b.cpu_s
        elif a.create_time_s >= window_start_s - 0.5:
            spent = a.cpu_s
        else:
            continue
        used[a.kind] = used.get(a.kind, 0.0) + max(0.0, spent)
        count[a.kind] = count.get(a.kind, 0) + 1
    lost = sum(1 for pid in before if pid not in after)
    return IngressCpu(dict(sorted(used.items())), dict(sorted(count.items())), lost)
