"""ops.listeners: loopback as Ray binds it, process names, and a real socket found by psutil."""

from __future__ import annotations

import os
import socket

import pytest

from serve_app.ops import listeners


@pytest.mark.parametrize(
    ("ip", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.53", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),  # Ray's gRPC servers on a loopback node
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.2", False),
        ("::ffff:192.0.2.2", False),
    ],
)
def test_loopback_as_ray_binds_it(ip: str, loopback: bool) -> None:
    assert listeners.is_loopback_ip(ip) is loopback


@pytest.mark.parametrize(
    ("cmdline", "name", "want"),
    [
        (["ray::DashboardAgent"], "ray::DashboardA", "ray::DashboardAgent"),
        (
            ["ray::ServeReplica:embeddings:model extra"],
            "ray::ServeRepli",
            "ray::ServeReplica:embeddings:model",
        ),
        (
            ["/venv/bin/python", "-u", "/venv/ray/dashboard/dashboard.py", "--host=1"],
            "python",
            "dashboard.py",
        ),
        (["/venv/ray/core/src/ray/raylet/raylet", "--x=1"], "raylet", "raylet"),
        ([], "haproxy", "haproxy"),
    ],
)
def test_process_names(cmdline: list[str], name: str, want: str) -> None:
    assert listeners.process_name(cmdline, name) == want


def test_a_listening_socket_of_this_process_is_found_and_judged() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        found = [item for item in listeners.listening_sockets(os.getpid()) if item.port == port]
        assert [(item.ip, item.pid) for item in found] == [("127.0.0.1", os.getpid())]
        assert listeners.beyond_loopback(found) == []
    wide = listeners.Listener("0.0.0.0", 1234, 1, "raylet")
    assert listeners.beyond_loopback([wide]) == [wide]
    assert wide.describe() == "0.0.0.0:1234 (raylet)"
    assert listeners.Listener("::", 5, 1, "x").describe() == "[::]:5 (x)"


@pytest.mark.parametrize(
    ("reads", "want", "count"),
    [
        # At rest: a second read agrees.
        (["ray::ServeReplica:a:m", "ray::ServeReplica:a:m"], "ray::ServeReplica:a:m", 2),
        # Caught inside a task: the title at rest comes back, twice.
        (
            ["ray::ServeReplica:a:m.check_health", "ray::ServeReplica:a:m"]
            + ["ray::ServeReplica:a:m"],
            "ray::ServeReplica:a:m",
            3,
        ),
        # Inside one task, then another, then at rest for the last read only.
        (
            ["ray::R.f", "ray::R.g", "ray::R.f", "ray::R.g", "ray::R"],
            "ray::R",
            5,
        ),
        # Never at rest in five reads: the last read, as read.
        (["ray::R.f", "ray::R.g"] * 3, "ray::R.f", 5),
        # Not a Ray title: read once.
        (["raylet", "raylet"], "raylet", 1),
    ],
)
def test_a_ray_title_read_inside_a_task_settles_on_the_actors_own(
    reads: list[str], want: str, count: int
) -> None:
    it = iter(reads)
    calls: list[str] = []

    def read() -> str:
        calls.append(next(it))
        return calls[-1]

    assert listeners.settled_name(read, pause_s=0.0) == want
    assert len(calls) == count
