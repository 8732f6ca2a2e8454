"""The LitServe peer as a subprocess of the serve worker: on the server cores (the worker's
affinity, inherited) and its GPU, in its own process group so that stopping it stops its
workers and API servers too. Its command line carries the serve worker's scratch directory, so
that the harness finds it after a crash (workers.wait_worker's kill_matching)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from load_tests.harness.meta import ROOT


class LitServeProcess:
    """``python -m load_tests.benchmarks.throughput.litserve_app`` with ``workers`` workers on
    one device, on a free loopback port."""

    def __init__(self, workers: int, cfg: Mapping[str, Any], scratch: Path) -> None:
        from serve_app.ops.ports import free_port

        self.port = free_port()
        self.log_path = scratch / f"litserve-{self.port}.log"
        cmd = [sys.executable, "-m", "load_tests.benchmarks.throughput.litserve_app"]
        cmd += ["--port", str(self.port), "--device", str(cfg["device"])]
        cmd += ["--workers", str(workers), "--max-batch-size", str(cfg["peer_max_batch_size"])]
        cmd += ["--batch-timeout-s", str(cfg["peer_batch_wait_s"]), "--marker", str(scratch)]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n_bytes: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_bytes:]
        except OSError:
            return ""

    def wait_healthy(self, timeout_s: float) -> None:
        """Until ``GET /health`` answers 200 (every worker set up), or raise with its log."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"LitServe exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"LitServe not healthy after {timeout_s:.0f} s: {self.log_tail()}")

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to its process group, SIGKILL after ``timeout_s``; returns once every
        process of its tree is gone (their GPU memory with them)."""
        import psutil

        try:
            tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(True)]
        except psutil.NoSuchProcess:
            tree = []
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            for p in tree:  # a worker that left the group still goes
                try:
                    p.send_signal(sig)
                except psutil.NoSuchProcess:
                    pass
            _, alive = psutil.wait_procs(tree, timeout=timeout_s)
            if not alive:
                break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
