"""The HAProxy that Serve runs on each node: its processes, its per-node files and the state of
its servers, read from its admin socket."""

from __future__ import annotations

import csv
import io
import socket
from pathlib import Path

from serve_app import env

__all__ = ["haproxy_node_path", "haproxy_pids", "haproxy_servers"]


def haproxy_pids(session_dir: str) -> list[int]:
    """HAProxy processes started by this Ray session (their parent chain names its directory)."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["name"]):
        if "haproxy" not in (proc.info.get("name") or ""):
            continue
        try:
            ancestors = proc.parents()[:4]
            if any(session_dir in " ".join(p.cmdline()) for p in ancestors):
                pids.append(proc.pid)
        except psutil.Error:
            continue
    return pids


def haproxy_node_path(path: str, node_id: str) -> Path:
    """Serve keeps each node's HAProxy files in a folder named after the node, beside ``path``."""
    p = Path(path)
    return p.parent / node_id / p.name


def haproxy_servers(node_id: str, timeout_s: float = 5.0) -> dict[str, dict[str, str]]:
    """The state of every server of this node's HAProxy, from its admin socket's ``show stat``:
    ``{"backend/server": {"status": "UP", ...}}``. Serve marks a replica RUNNING before HAProxy
    has it UP; the fault tests wait for both."""
    sock_path = haproxy_node_path(env.haproxy_socket_path(), node_id)
    chunks = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(sock_path))
        sock.sendall(b"show stat\n")
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    text = b"".join(chunks).decode().lstrip("# ")
    servers = {}
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("svname") not in ("FRONTEND", "BACKEND", None):
            servers[f"{row['pxname']}/{row['svname']}"] = row
    return servers
