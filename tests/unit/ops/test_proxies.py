"""ops.proxies.wait_proxies: Serve's proxy statuses read until every one is HEALTHY (a scripted
reader and clock)."""

from __future__ import annotations

import pytest

from serve_app.errors import StartupError
from serve_app.ops.proxies import wait_proxies


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, s: float) -> None:
        self.now_s += s


def test_wait_proxies_returns_once_every_proxy_is_healthy() -> None:
    reads = iter([{}, {"n1": "STARTING"}, {"n1": "HEALTHY", "n2": "STARTING"}])
    seen: list[dict[str, str]] = []

    def read() -> dict[str, str]:
        seen.append(next(reads, {"n1": "HEALTHY", "n2": "HEALTHY"}))
        return seen[-1]

    clock = _Clock()
    wait_proxies(read, 10.0, period_s=0.5, clock=clock, sleep=clock.sleep)
    assert len(seen) == 4 and clock.now_s == 1.5


def test_wait_proxies_names_each_status_when_it_gives_up() -> None:
    clock = _Clock()
    with pytest.raises(StartupError) as info:
        wait_proxies(lambda: {"0123456789abcdef": "UNHEALTHY"}, 3.0, clock=clock, sleep=clock.sleep)
    assert "01234567: UNHEALTHY" in info.value.message
    assert "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S" in info.value.message
    assert clock.now_s == 3.0
