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
