"""ops.ports: HAProxy's side ports are distinct, bindable, and outside Ray's and the kernel's
port ranges; a bound port is not free."""

import os
import random
import socket
import tempfile
from pathlib import Path

import pytest

from serve_app.ops import haproxy, ports


def test_private_ports_are_distinct_and_in_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", dict(os.environ))  # it sets HAProxy's variables
    for var in ports.HAPROXY_SIDE_PORT_VARS:
        monkeypatch.delenv(var, raising=False)
    try:
        chosen = ports.private_haproxy_ports()
        assert os.environ[haproxy.BINARY_VAR].startswith(tempfile.gettempdir())
    finally:
        haproxy.release_private_files()
    assert set(chosen) == set(ports.HAPROXY_SIDE_PORT_VARS)
    values = [int(v) for v in chosen.values()]
    assert len(set(values)) == len(values)
    low, high = ports.SIDE_PORT_RANGE
    assert all(low <= p <= high for p in values)
    assert all(os.environ[k] == v for k, v in chosen.items())


def test_side_port_skips_taken_and_busy_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        busy_port = ports.side_port(set())
        busy.bind(("0.0.0.0", busy_port))
        busy.listen()
        taken_port = ports.side_port({busy_port})
        # The draw offers the busy port, then the taken one, then random ones: one fixed
        # port could be held by the Ray tests that CI runs beside these (it failed so once).
        draws = iter([busy_port, taken_port])
        real_randint = random.randint

        def fake_randint(low: int, high: int) -> int:
            return next(draws, 0) or real_randint(low, high)

        monkeypatch.setattr(ports.random, "randint", fake_randint)
        chosen = ports.side_port({taken_port})
        assert chosen not in (busy_port, taken_port)


def test_side_port_gives_up_with_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports.random, "randint", lambda low, high: 25000)
    with pytest.raises(RuntimeError, match="RAY_SERVE_HAPROXY_"):
        ports.side_port({25000}, attempts=3)


def test_port_is_free_until_bound() -> None:
    port = ports.free_port()
    assert ports.port_is_free(ports.DEFAULT_HOST, port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((ports.DEFAULT_HOST, port))
        sock.listen()
        assert not ports.port_is_free(ports.DEFAULT_HOST, port)


def test_free_ports_come_from_outside_the_kernels_ephemeral_range() -> None:
    low, high = ports.SIDE_PORT_RANGE
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert high < ephemeral_low  # an outgoing connection never takes one of ours
    got = [ports.free_port() for _ in range(50)]
    assert all(low <= p <= high for p in got) and len(set(got)) == 50  # never the same twice


def test_free_port_gives_up_with_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "port_is_free", lambda host, port: False)
    with pytest.raises(RuntimeError, match="set the port in the config"):
        ports.free_port(attempts=3)
