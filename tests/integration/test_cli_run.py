"""`serve-app run` as a user runs it: a subprocess, /readyz, one request, what it listens on and
Ray's token at the dashboard agent's job API, SIGINT, exit 0."""

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
from serve_app.ops import listeners
from serve_app.ops.launch import METRICS_PORT_VAR
from tests.helpers import start_serve_app_run, wait_http

ROOT = Path(__file__).resolve().parents[2]

# The programs of Ray's own processes, as listeners.process_name names them: its C++ servers,
# its Python daemons, and every worker and agent (``ray::`` titles).
RAY_PROGRAMS = {"gcs_server", "raylet", "dashboard.py", "monitor.py", "log_monitor.py"}
JOB_API = "/api/job_agent/jobs/"  # the dashboard agent's job submission (ShadowRay's door)
SERVE_REPLICA = "ray::ServeReplica:"


AGENT_HTTP_PORT = 52365  # ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT


def listeners_on(port: int) -> list[listeners.Listener]:
    """Whoever listens on ``port`` on this machine (any process of this user)."""
    import psutil

    found = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            try:
                proc = psutil.Process(conn.pid)
                name = listeners.process_name(proc.cmdline(), proc.name())
            except (psutil.Error, ValueError):
                continue
            found.append(listeners.Listener(conn.laddr.ip, port, conn.pid, name))
    return found


def is_rays(listener: listeners.Listener) -> bool:
    return listener.process in RAY_PROGRAMS or listener.process.startswith("ray::")


def grpc_refuses_without_token(port: int) -> bool:
    """Whether Serve's inter-deployment gRPC server on ``port`` answers a call that carries no
    token with UNAUTHENTICATED (Ray's interceptor, before the request is handled)."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/ray.serve.ASGIService/HandleRequest")
        try:
            call(b"", timeout=10.0)
        except grpc.RpcError as exc:
            return bool(exc.code() == grpc.StatusCode.UNAUTHENTICATED)
    return False


def check_listeners_and_job_api(root_pid: int, http_port: int, side_ports: set[int]) -> list[str]:
    """Every listener of the server's processes beyond loopback is Ray's own: a replica's
    inter-deployment gRPC server, which Serve binds to every interface ("[::]:0" in
    ray/serve/_private/replica.py) and which refuses a call without Ray's token; every other Ray
    listener is on loopback (serve-app keeps its node on 127.0.0.1). The dashboard agent's job
    API refuses a POST without the token and takes one with it. Returns the replicas' ports."""
    found = listeners.listening_sockets(root_pid)
    beyond = listeners.beyond_loopback(found)
    # HAProxy's stats and Prometheus listeners (``side_ports``) are up, on loopback only
    # (serve-app's HAProxy launcher rewrites Ray's `bind *:PORT`: ops/haproxy.py).
    assert side_ports <= {i.port for i in found if i.process == "haproxy"}, found
    others = beyond
    assert all(is_rays(item) for item in others), [i.describe() for i in others]
    forced = [i for i in others if i.process.startswith(SERVE_REPLICA)]
    assert others == forced and len(forced) == 1, [i.describe() for i in others]
    assert all(grpc_refuses_without_token(item.port) for item in forced)
    names = {item.process for item in found}
    assert {"gcs_server", "raylet", "ray::DashboardAgent"} <= names, names
    assert any(item.port == http_port for item in found)
    token = os.environ["RAY_AUTH_TOKEN"]  # tests/conftest.py's, which serve-app inherited
    answers = {}
    agents = [item for item in found if item.process == "ray::DashboardAgent"]
    if AGENT_HTTP_PORT not in {item.port for item in agents}:
        # Ray's agent serves its job API on a fixed port (no ray.init setting moves it): in a
        # full test session the session cluster, started by the same launch.start_ray, holds
        # it first, and this server's agent runs without one. Check that cluster's.
        agents = [i for i in listeners_on(AGENT_HTTP_PORT) if i.process == "ray::DashboardAgent"]
    for item in agents:
        url = f"http://127.0.0.1:{item.port}{JOB_API}"
        try:
            metrics = httpx.get(f"http://127.0.0.1:{item.port}/metrics", timeout=5.0)
        except httpx.HTTPError:
            continue  # one of the agent's gRPC ports
        if metrics.status_code == 200:
            continue  # its Prometheus exporter: open, read-only, on loopback (docs/security.md)
        bare = httpx.post(url, json={}, timeout=5.0)
        with_token = httpx.post(
            url, json={}, headers={"Authorization": f"Bearer {token}"}, timeout=10.0
        )
        answers[item.port] = (bare.status_code, with_token.status_code)
    assert len(answers) == 1, ("the dashboard agent's HTTP server (its job API) not found", agents)
    for port, (bare, with_token) in answers.items():
        assert bare in (401, 403), (port, bare)
        assert with_token not in (401, 403), (port, with_token)
    return [str(item.port) for item in forced]


def test_run_serves_and_stops_on_sigint(tmp_path: Path) -> None:
    haproxy_root = Path(haproxy_config_path()).parent
    dirs_before = set(haproxy_root.iterdir()) if haproxy_root.is_dir() else set()
    run = start_serve_app_run(
        yaml.safe_load((ROOT / "configs" / "default.yaml").read_text()), tmp_path
    )
    proc, url, port, env = run.proc, run.url, run.port, run.env
    try:
        wait_http(f"{url}/readyz", 240.0)
        deadline = time.monotonic() + 60.0  # the CLI prints the URL once its own check passes
        while f"serving at {url}" not in Path(run.log.name).read_text():
            assert time.monotonic() < deadline and proc.poll() is None, "no 'serving at' line"
            time.sleep(0.2)
        resp = httpx.post(f"{url}/v1/embeddings", json={"input": "hello"}, timeout=30.0)
        assert resp.status_code == 200 and len(resp.json()["data"][0]["embedding"]) == 384
        haproxy_pages = {  # the stats page and Prometheus endpoint (the others are Serve's)
            int(env[name])
            for name in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")
        }
        grpc_ports = check_listeners_and_job_api(proc.pid, port, haproxy_pages)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        assert code == 0, f"exit code {code}"
        assert time.monotonic() - started < 30.0
    finally:
        output = run.stop()
    assert "No CUDA GPU found: serving on the CPU." in output, output[-3000:]
    # said first, not after a minute of Ray's start-up logs
    assert output.index("No CUDA GPU found") < output.index("Started a local Ray instance")
    assert "Ray: token authentication on (RAY_AUTH_MODE=token)" in output
    assert "the RAY_AUTH_TOKEN variable" in output
    # The replica's gRPC port is said, as behind the token, and no warning is printed for it.
    said = [line for line in output.splitlines() if "Ray listens beyond loopback" in line]
    assert f"]:{grpc_ports[0]} (ray::ServeReplica:embeddings:model)" in output, (grpc_ports, said)
    assert "needs Ray's token" in output and "authentication is OFF" not in output
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


def test_run_waits_for_the_proxy_serve_puts_in_place_of_one_that_missed_its_checks(
    tmp_path: Path,
) -> None:
    # Readiness checks of 0.5 s: no proxy's worker starts that fast, so Serve replaces the first
    # (and gives each replacement longer), as it did on a busy two-core host with four apps.
    run = start_serve_app_run(
        yaml.safe_load((ROOT / "configs" / "default.yaml").read_text()),
        tmp_path,
        extra_env={"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "0.5"},
    )
    try:
        deadline = time.monotonic() + 240.0
        while f"serving at {run.url}" not in Path(run.log.name).read_text():
            assert time.monotonic() < deadline and run.proc.poll() is None, "never served"
            time.sleep(0.5)
        resp = httpx.post(f"{run.url}/v1/embeddings", json={"input": "hello"}, timeout=30.0)
        assert resp.status_code == 200, resp.text
        run.proc.send_signal(signal.SIGINT)
        assert run.proc.wait(timeout=60) == 0
    finally:
        output = run.stop()
    assert "missed its readiness checks" in output and "replacement is up" in output, output[-3000:]


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
