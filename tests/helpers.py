"""Helpers shared by the integration tests and the GPU tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def wait_for(
    what: str,
    probe: Callable[[], T],
    ok: Callable[[T], bool],
    timeout_s: float,
    period_s: float = 0.25,
) -> T:
    """Poll ``probe`` every ``period_s`` until ``ok``; on timeout fail with the last value seen."""
    deadline = time.monotonic() + timeout_s
    last = probe()
    while not ok(last):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(period_s)
        last = probe()
    return last


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


@dataclass
class ServeAppRun:
    """A `serve-app run CONFIG` child process on free ports, its output in a file."""

    proc: subprocess.Popen[str]
    url: str
    port: int
    env: dict[str, str]
    log: IO[str]

    def stop(self) -> str:
        """Kill it if it still runs; its whole output."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.seek(0)
        return self.log.read()


def start_serve_app_run(
    doc: dict[str, Any],
    tmp_path: Path,
    drop_env: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> ServeAppRun:
    """Start `python -m serve_app run` with the config ``doc`` on a free HTTP port, free HAProxy
    side ports and a free metrics port (not the pinned default another server may hold), from
    the repository root, without the test doubles' variables (and with ``extra_env``)."""
    from serve_app.ops.launch import METRICS_PORT_VAR
    from serve_app.ops.ports import free_port, haproxy_side_ports

    port = free_port()
    doc["http_options"]["port"] = port
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(doc))
    env = {k: v for k, v in os.environ.items() if k not in ("SERVE_APP_FAKE_NVML", *drop_env)}
    env.update(haproxy_side_ports())
    env[METRICS_PORT_VAR] = str(free_port())
    env.update(extra_env or {})
    log = (tmp_path / "run.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "serve_app", "run", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
        text=True,
    )
    return ServeAppRun(proc, f"http://127.0.0.1:{port}", port, env, log)
