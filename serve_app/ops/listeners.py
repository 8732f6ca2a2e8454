"""The TCP sockets a process and its descendants listen on (psutil), named by process: what
``serve-app run`` checks after Ray starts, so that a listener beyond loopback is said, not
found later with ``ss``. Ray's own processes are named as Ray names them (``ray::DashboardAgent``)
or by their program (``raylet``, ``gcs_server``, ``dashboard.py``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Listener", "beyond_loopback", "is_loopback_ip", "listening_sockets", "process_name"]


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
            conns = proc.net_connections(kind="tcp")
            label = process_name(proc.cmdline(), proc.name())
        except psutil.Error:  # gone, or another user's: not ours to list
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN and conn.laddr:
                found.add(Listener(conn.laddr.ip, conn.laddr.port, proc.pid, label))
    return sorted(found, key=lambda item: (item.port, item.ip, item.pid))


def beyond_loopback(listeners: list[Listener]) -> list[Listener]:
    """The listeners another machine may reach."""
    return [item for item in listeners if not is_loopback_ip(item.ip)]
