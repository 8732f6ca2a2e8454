"""TCP ports for a local cluster: the HTTP port's check, and private ports for HAProxy's side
listeners so that two clusters on one machine do not collide."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable

__all__ = [
    "DEFAULT_HOST",
    "HAPROXY_SIDE_PORT_VARS",
    "SIDE_PORT_RANGE",
    "free_port",
    "haproxy_side_ports",
    "port_is_free",
    "private_haproxy_ports",
    "side_port",
]

DEFAULT_HOST = "127.0.0.1"

HAPROXY_SIDE_PORT_VARS = (
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
)

# Above Ray's worker ports (10002-19999), below Serve's replica ports (30000 up) and the kernel's
# ephemeral range (32768 up): an ephemeral port free a moment ago can be taken by any outgoing
# connection before HAProxy binds it (seen with two clusters starting at once on the GPU host).
SIDE_PORT_RANGE = (20000, 29999)


def port_is_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


_HANDED_OUT: set[int] = set()


def _pick(free: Callable[[int], bool], taken: set[int], attempts: int) -> int | None:
    """A random port of SIDE_PORT_RANGE, not in ``taken`` nor handed out before in this process,
    for which ``free`` holds; None after ``attempts`` draws. Two calls before either port is
    bound never get the same one."""
    for _ in range(attempts):
        port = random.randint(*SIDE_PORT_RANGE)
        if port not in taken and port not in _HANDED_OUT and free(port):
            _HANDED_OUT.add(port)
            return port
    return None


def free_port(host: str = DEFAULT_HOST, attempts: int = 200) -> int:
    """A TCP port that is free on ``host`` right now, from SIDE_PORT_RANGE: not one the kernel
    would pick (port 0), which an outgoing connection can take before the server binds it (a
    soak's HAProxy once failed to start so)."""
    port = _pick(lambda p: port_is_free(host, p), set(), attempts)
    if port is None:
        raise RuntimeError(
            f"no free port on {host} in {SIDE_PORT_RANGE[0]}-{SIDE_PORT_RANGE[1]} after "
            f"{attempts} tries; set the port in the config"
        )
    return port


def _binds_everywhere(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))  # HAProxy's stats listeners bind all interfaces
        except OSError:
            return False
    return True


def side_port(taken: set[int], attempts: int = 200) -> int:
    """A port in SIDE_PORT_RANGE, not in ``taken``, that binds on every interface now."""
    port = _pick(_binds_everywhere, taken, attempts)
    if port is None:
        raise RuntimeError(
            f"no free port in {SIDE_PORT_RANGE[0]}-{SIDE_PORT_RANGE[1]} for HAProxy's side "
            f"listeners after {attempts} tries; set RAY_SERVE_HAPROXY_* ports yourself"
        )
    return port


def haproxy_side_ports() -> dict[str, str]:
    """Free ports (from SIDE_PORT_RANGE) for HAProxy's stats and metrics listeners and Serve's
    fallback proxy, which are fixed by default (8404, 9101, 8500, 9500), by variable name."""
    taken: set[int] = set()
    for _ in HAPROXY_SIDE_PORT_VARS:
        taken.add(side_port(taken))
    return dict(zip(HAPROXY_SIDE_PORT_VARS, (str(p) for p in sorted(taken)), strict=True))


def private_haproxy_ports() -> dict[str, str]:
    """``haproxy_side_ports`` set in this process's environment before Ray starts, so that a
    second cluster on the machine does not collide with the first; and HAProxy's files in a
    fresh private directory (``haproxy.use_private_files``; ``launch.shutdown`` removes it)."""
    from serve_app.ops.haproxy import use_private_files

    ports = haproxy_side_ports()
    os.environ.update(ports)
    use_private_files()
    return ports
