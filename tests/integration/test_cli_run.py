"""`serve-app run` as a user runs it: a subprocess, /readyz, one request, SIGINT, exit 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from serve_app.env import haproxy_config_path
from serve_app.ops.launch import METRICS_PORT_VAR
from serve_app.ops.ports import free_port, haproxy_side_ports
from tests.helpers import wait_http

ROOT = Path(__file__).resolve().parents[2]


def test_run_serves_and_stops_on_sigint(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    port = free_port()
    doc["http_options"]["port"] = port
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(doc))
    env = dict(os.environ)
    env.pop("SERVE_APP_FAKE_NVML", None)
    env.update(haproxy_side_ports())
    env[METRICS_PORT_VAR] = str(free_port())  # not the pinned default another server may hold
    haproxy_root = Path(haproxy_config_path()).parent
    dirs_before = set(haproxy_root.iterdir()) if haproxy_root.is_dir() else set()
    log = (tmp_path / "run.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "serve_app", "run", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/readyz", 240.0)
        deadline = time.monotonic() + 60.0  # the CLI prints the URL once its own check passes
        while f"serving at {url}" not in Path(log.name).read_text():
            assert time.monotonic() < deadline and proc.poll() is None, "no 'serving at' line"
            time.sleep(0.2)
        resp = httpx.post(f"{url}/v1/embeddings", json={"input": "hello"}, timeout=30.0)
        assert resp.status_code == 200 and len(resp.json()["data"][0]["embedding"]) == 384
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        assert code == 0, f"exit code {code}"
        assert time.monotonic() - started < 30.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.seek(0)
        output = log.read()
    assert "No CUDA GPU found: serving on the CPU." in output, output[-3000:]
    assert f"serving at {url}" in output
    assert f"Metrics (Prometheus): http://127.0.0.1:{env[METRICS_PORT_VAR]}/metrics" in output
    # HAProxy's per-node folder went with it.
    dirs_after = set(haproxy_root.iterdir()) if haproxy_root.is_dir() else set()
    assert dirs_after <= dirs_before, dirs_after - dirs_before
    # Nothing is left listening on the port: no orphaned HAProxy.
    with httpx.Client() as client:
        try:
            client.get(f"{url}/healthz", timeout=2.0)
            raise AssertionError("something still answers on the port after shutdown")
        except httpx.HTTPError:
            pass


def test_check_reports_field_paths(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "applications": [
                    {
                        "name": "x",
                        "import_path": "serve_app.app:build_app",
                        "args": {"max_batch_size": 0, "memory": {"cache_policy": "sometimes"}},
                    }
                ]
            }
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "serve_app", "check", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 2
    assert "applications[0].args.max_batch_size" in out.stderr
    assert "applications[0].args.memory.cache_policy" in out.stderr
    assert "'always', 'threshold' or 'never'" in out.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "serve_app", "check", "configs/default.yaml"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
