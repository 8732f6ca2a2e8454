"""Serve's HAProxy as the session cluster runs it (ops.haproxy.use_private_files, through
ports.private_haproxy_ports): its admin socket sits in a fresh 0700 directory of ours that no
other user can enter, and its stats page and Prometheus endpoint listen on 127.0.0.1 only."""

from __future__ import annotations

import os
import socket
import stat
import time
from pathlib import Path

import httpx
import psutil

from serve_app import env
from serve_app.ops.haproxy import PID_FILE, PRIVATE_PREFIX, haproxy_node_path

NOBODY_UID = 65534


def _admin_socket(timeout_s: float = 60.0) -> Path:
    import ray

    path = haproxy_node_path(env.haproxy_socket_path(), ray.get_runtime_context().get_node_id())
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"no HAProxy admin socket at {path}"
        time.sleep(0.2)
    return path


def _ask(path: Path, command: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5.0)
        sock.connect(str(path))
        sock.sendall(command + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _connect_as(uid: int, path: Path) -> int:
    """Connect to ``path`` from a child process running as ``uid``: 0 when it connects, the
    errno when it cannot."""
    pid = os.fork()
    if pid == 0:  # the child: no Python beyond syscalls, then _exit
        code = 0
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(path))
        except OSError as exc:
            code = exc.errno or 255
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_the_admin_socket_and_its_directory_are_private(cluster) -> None:
    sock = _admin_socket()
    private = Path(env.haproxy_socket_path()).parent
    assert private.name.startswith(PRIVATE_PREFIX), private
    st = private.lstat()
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
    assert st.st_uid == os.getuid()
    # Every directory between it and the socket is ours too (Serve adds a folder per node).
    for folder in [sock.parent, *sock.parent.parents]:
        if folder == private:
            break
        assert folder.lstat().st_uid == os.getuid(), folder
    assert stat.S_ISSOCK(sock.lstat().st_mode) and sock.lstat().st_uid == os.getuid()
    # Ray's template still opens it `mode 666 level admin`: the directory is what closes it.
    assert b"Name: HAProxy" in _ask(sock, b"show info")
    if os.getuid() == 0:  # as root, show it: another user cannot even reach the socket
        assert _connect_as(NOBODY_UID, sock) == 13  # EACCES
        assert _connect_as(0, sock) == 0


def test_stats_and_metrics_listen_on_loopback_and_the_pid_file_names_haproxy(cluster) -> None:
    _admin_socket()
    private = Path(env.haproxy_socket_path()).parent
    deadline = time.monotonic() + 30.0
    while True:  # a reload can be between its pid file and its listeners
        proc = psutil.Process(int((private / PID_FILE).read_text()))
        listening = {
            c.laddr.port: c.laddr.ip
            for c in proc.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        }
        stats_port = int(os.environ["RAY_SERVE_HAPROXY_STATS_PORT"])
        metrics_port = int(os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"])
        if stats_port in listening or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "haproxy" in proc.name() and any(a.startswith(f"{private}/") for a in proc.cmdline())
    assert listening.get(stats_port) == "127.0.0.1", listening
    assert listening.get(metrics_port) == "127.0.0.1", listening
    stats = httpx.get(f"http://127.0.0.1:{stats_port}/stats", timeout=5.0)
    metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5.0)
    assert stats.status_code == 200 and metrics.status_code == 200
    assert "haproxy_process_" in metrics.text
