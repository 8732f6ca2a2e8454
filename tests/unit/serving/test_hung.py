"""The hung-replica watch's decision (serving/hung.py): which HAProxy servers it ends, probed
against real sockets; the whole path under load is tests/integration/test_reliability.py."""

from __future__ import annotations

import http.server
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from serve_app.serving import hung


def row(status: str, port: int, svname: str = "SERVE_REPLICA_app-model-abc") -> dict[str, str]:
    return {
        "svname": svname,
        "status": status,
        "addr": f"127.0.0.1:{port}",
        "check_status": "L7TOUT",
    }


def test_only_replica_servers_fully_down_are_candidates() -> None:
    rows = {
        "http-app/SERVE_REPLICA_app-model-a": row("DOWN", 30001),
        "http-app/SERVE_REPLICA_app-model-b": row("DOWN 1/2", 30002),  # coming back up
        "http-app/SERVE_REPLICA_app-model-c": row("UP", 30003),
        "http-app/SERVE_REPLICA_app-model-d": row("MAINT", 30004),  # Serve's own doing
        "http-app/fallback": row("DOWN", 30005, svname="fallback"),
    }
    found = hung.down_replicas(rows)
    assert [(d.name, d.host, d.port) for d in found] == [
        ("http-app/SERVE_REPLICA_app-model-a", "127.0.0.1", 30001)
    ]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A socket that listens and never answers: the kernel accepts, nobody reads (a SIGSTOPped
    process's listener)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


@pytest.fixture
def http_port() -> Iterator[int]:
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_probe_tells_hung_from_live_and_gone(silent_port: int, http_port: int) -> None:
    assert hung.answers("127.0.0.1", silent_port, timeout_s=0.2) is False
    assert hung.answers("127.0.0.1", http_port, timeout_s=2.0) is True  # any answer, even a 501
    assert hung.answers("127.0.0.1", closed_port(), timeout_s=0.2) is None


def test_listener_pid_finds_this_process_and_it_is_no_replica(silent_port: int) -> None:
    assert hung.listener_pid(silent_port) == os.getpid()
    assert hung.is_replica(os.getpid()) is False


class Fakes:
    def __init__(self, rows: dict[str, dict[str, str]], probe: dict[int, bool | None]):
        self.rows = rows
        self.probes = probe
        self.killed: list[int] = []

    def reaper(self, replicas: set[int], own_pid: int = 1) -> hung.Reaper:
        return hung.Reaper(
            read_servers=lambda: self.rows,
            probe=lambda host, port: self.probes[port],
            find_pid=lambda port: port + 100_000,  # a pid per port
            check_replica=lambda pid: pid in replicas,
            kill=self.killed.append,
            own_pid=own_pid,
        )


def test_sweep_kills_only_a_local_hung_replica_never_itself() -> None:
    rows = {
        "b/SERVE_REPLICA_a-m-hung": row("DOWN", 1),
        "b/SERVE_REPLICA_a-m-gone": row("DOWN", 2),
        "b/SERVE_REPLICA_a-m-answers": row("DOWN", 3),
        "b/SERVE_REPLICA_a-m-notreplica": row("DOWN", 4),
        "b/SERVE_REPLICA_a-m-self": row("DOWN", 5),
        "b/SERVE_REPLICA_a-m-remote": {**row("DOWN", 6), "addr": "10.0.0.7:6"},
    }
    fakes = Fakes(rows, {1: False, 2: None, 3: True, 4: False, 5: False, 6: False})
    replicas = {100_001, 100_002, 100_003, 100_005, 100_006}
    killed = fakes.reaper(replicas, own_pid=100_005).sweep()
    assert fakes.killed == [100_001]
    assert [(d.name, pid) for d, pid in killed] == [("b/SERVE_REPLICA_a-m-hung", 100_001)]


def test_sweep_without_haproxy_does_nothing() -> None:
    def no_socket() -> dict[str, dict[str, str]]:
        raise FileNotFoundError("no admin socket")

    killed: list[int] = []
    assert hung.Reaper(read_servers=no_socket, kill=killed.append).sweep() == []
    assert killed == []
