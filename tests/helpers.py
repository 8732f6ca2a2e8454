"""Helpers shared by the integration tests and the GPU tests."""

from __future__ import annotations

import time

import httpx


def wait_http(url: str, timeout_s: float = 60.0) -> None:
    """Poll ``url`` until it answers 200; fail the test with the last answer after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            resp = httpx.get(url, timeout=5.0)
            if resp.status_code == 200:
                return
            last = f"{resp.status_code} {resp.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.3)
    raise AssertionError(f"{url} not answering 200 after {timeout_s:.0f} s: {last}")
