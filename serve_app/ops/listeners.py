"""The TCP sockets a process and its descendants listen on (psutil), named by process: what
``serve-app run`` checks after Ray starts, so that a listener beyond loopback is said, not
found later with ``ss``. Ray's own processes are named as Ray names them (``ray::DashboardAgent``)
or by their program (``raylet``, ``gcs_server``, ``dashboard.py``)."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

__all__ = [
    "Listener",
    "beyond_loopback",
    "is_loopback_ip",
    "listening_sockets",
    "process_name",
    "settled_name",
]

# Ray retitles an actor's process while each of its tasks runs ("ray::Class.method", then
# "ray::Class" again): reads of a Ray process's title, at most this many, this far apart.
TITLE_READS = 5
TITLE_PAUSE_S = 0.02


@dataclass(frozen=True)
class Listener:
    ip: str
    port: int
    pid: int
    process: str

    def describe(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{host}:{self.port} ({self.process})"


def is_loopback_ip(ip: str) -> bool:
    """127.0.0.0/8, ::1, and IPv4-mapped loopback (``::ffff:127.0.0.1``, as Ray's gRPC servers
    bind it); a wildcard (0.0.0.0, ::) is not."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def process_name(cmdline: list[str], name: str) -> str:
    """A short name: Ray's worker title (``ray::X``), else the program (the script for a
    Python process), else psutil's name."""
    if cmdline and cmdline[0].startswith("ray::"):
        return cmdline[0].split()[0]
    if name.startswith("ray::"):
        return name
    args = [a for a in cmdline if not a.startswith("-")]
    if args and Path(args[0]).name.startswith("python") and len(args) > 1:
        return Path(args[1]).name
    return Path(args[0]).name if args else name


def settled_name(
    read: Callable[[], str], reads: int = TITLE_READS, pause_s: float = TITLE_PAUSE_S
) -> str:
    """A process's name from ``read`` (``process_name`` of a fresh read), the actor's own title
    for a Ray process caught inside one of its tasks: the title at rest is a prefix of a task's
    (``ray::ServeReplica:app:model`` of ``ray::ServeReplica:app:model.check_health``). Reads
    again, up to ``reads`` in all, until two in a row agree; then the shortest read that every
    other read extends, else the last."""
    seen = [read()]
    while seen[-1].startswith("ray::") and len(seen) < reads:
        time.sleep(pause_s)
        seen.append(read())
        if seen[-1] == seen[-2]:
            break
    shortest = min(seen, key=len)
    if all(name == shortest or name.startswith(shortest + ".") for name in seen):
        return shortest
    return seen[-1]


def _title(proc: Any) -> str:
    return process_name(proc.cmdline(), proc.name())


def listening_sockets(root_pid: int) -> list[Listener]:
    """Every TCP listener of ``root_pid`` and its descendants, sorted by port."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    found = set()
    for proc in procs:
        try:
            conns = [c for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
            if not conns:
                continue
            label = settled_name(partial(_title, proc))
        except psutil.Error:  # gone, or another user's: not ours to list
            continue
        for conn in conns:
            if conn.laddr:
                found.add(Listener(conn.laddr.ip, conn.laddr.port, proc.pid, label))
    return sorted(found, key=lambda item: (item.port, item.ip, item.pid))


def beyond_loopback(listeners: list[Listener]) -> list[Listener]:
    """The listeners another machine may reach."""
    return [item for item in listeners if not is_loopback_ip(item.ip)]
