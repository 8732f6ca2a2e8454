"""Waiting for Serve's proxies by their status, once Serve has replaced one.

Serve's controller replaces a proxy that misses three readiness checks in a row, and gives each
replacement longer (linear backoff: 5, 10, 15 s a check). ``serve-app run`` first waits on the
proxies' own readiness calls; when a proxy dies there, this waits for the statuses Serve reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from serve_app.errors import StartupError

PROXY_RESTART_WAIT_S = 120.0  # a replaced proxy's checks take 10 s, the next one's 15 s


def wait_proxies(
    read: Callable[[], Mapping[str, str]],
    timeout_s: float,
    period_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Until every proxy ``read`` lists (node id to Serve's status) is HEALTHY, or a
    StartupError naming each one's status after ``timeout_s``."""
    deadline = clock() + timeout_s
    statuses: Mapping[str, str] = {}
    while True:
        statuses = read()
        if statuses and all(s == "HEALTHY" for s in statuses.values()):
            return
        if clock() >= deadline:
            break
        sleep(period_s)
    said = ", ".join(f"{node[:8]}: {status}" for node, status in statuses.items()) or "none"
    raise StartupError(
        f"Serve's proxies were not HEALTHY {timeout_s:g} s after Serve replaced one that "
        f"missed its readiness checks (now {said}); the host may be too busy starting replicas: "
        "set RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S higher, or start fewer applications at once. "
        "The proxy logs are under /tmp/ray/session_latest/logs/serve/"
    )
