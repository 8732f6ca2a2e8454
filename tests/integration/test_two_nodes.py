"""A real two-node Ray cluster on one host, on the CPU: a head and a worker, one logical GPU each.

Both nodes are started with the ``ray`` CLI (``ray start --head`` / ``ray start --address``), each
with its own scripted NVML (``SERVE_APP_FAKE_NVML``) naming one GPU, so a replica on the head
reports GPU A and a replica on the worker GPU B ("logical-scripted" mode). One application with
two replicas of ``num_gpus: 1`` must put one replica on each node. The test sends requests
through the head's HAProxy ingress, sees both replicas (and both nodes) answer, then SIGKILLs the
worker node's whole process group under load: the head keeps serving, the errors are counted
(HAProxy's retry settings are ops.cluster_env.HAPROXY_RETRY_DEFAULTS), and ``/v1/memory``
stops listing GPU B once its node monitor is gone.

Nothing here runs ``ray stop``: it stops every Ray process on the machine, other clusters
included (the session cluster of the other integration tests, or another checkout's). The test
ends the processes it started, by process group, and the HAProxy they started.

The driver side (``ray.init`` + deploy) runs in a subprocess, so this pytest process, which may
already hold the session cluster, never connects to the two-node cluster.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from load_tests.harness import ray_nodes
from serve_app import env as serve_env
from serve_app.ops import ports
from serve_app.ops.haproxy import haproxy_node_path
from tests.helpers import wait_http
from tests.integration.test_controller import Load, wait_for

GIB = 1 << 30
GPU_A = "GPU-aaaaaaaa-0000-4000-8000-00000000000a"  # the head's GPU
GPU_B = "GPU-bbbbbbbb-0000-4000-8000-00000000000b"  # the worker's GPU
TOTAL_BYTES = 80 * GIB
START_TIMEOUT_S = 60.0
DEPLOY_TIMEOUT_S = 120.0


pytestmark = pytest.mark.skipif(
    ray_nodes.ray_cli() is None, reason="the `ray` CLI is not installed"
)


def nvml_script(path: Path, uuid: str) -> Path:
    doc = {"devices": {uuid: {"total_bytes": TOTAL_BYTES, "free_bytes": TOTAL_BYTES - GIB}}}
    path.write_text(json.dumps(doc))
    return path


def serve_config(port: int) -> dict[str, Any]:
    return {
        "proxy_location": "HeadOnly",  # two proxies on one host would want the same port
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [
            {
                "name": "two",
                "route_prefix": "/",
                "import_path": "serve_app.app:build_app",
                "args": {"adapter": "embeddings", "max_batch_size": 4},
                "deployments": [
                    {
                        "name": "model",
                        "num_replicas": 2,
                        # One whole logical GPU each: the only way both fit is one per node.
                        "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 1},
                        "health_check_period_s": 1,
                        "health_check_timeout_s": 5,
                    }
                ],
            }
        ],
    }


DRIVER = """
import json, sys
import ray
from serve_app.ops import launch
ray.init(address=sys.argv[1], namespace="serve_app", log_to_driver=False)
launch.deploy(json.loads(sys.argv[2]))
"""


@dataclass
class TwoNodes:
    base_url: str
    gcs_address: str
    env: dict[str, str]
    head: subprocess.Popen[bytes]
    worker: subprocess.Popen[bytes]
    started: list[int] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)


def _node_env(script: Path, side_ports: dict[str, str]) -> dict[str, str]:
    return ray_nodes.node_env({"SERVE_APP_FAKE_NVML": str(script), **side_ports})


def _wait_nodes(address: str, env: dict[str, str], want: int) -> list[str]:
    try:
        return ray_nodes.wait_nodes(address, env, want, START_TIMEOUT_S)
    except TimeoutError as exc:
        pytest.fail(str(exc))
    return []


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodes]:
    cli = ray_nodes.ray_cli()
    assert cli is not None
    # Short paths: Ray's Unix sockets live under the temp dir (108-byte limit).
    tmp = Path(tempfile.mkdtemp(prefix="sa2n-", dir="/tmp"))
    side_ports = ports.haproxy_side_ports()
    head_env = _node_env(nvml_script(tmp / "nvml-a.json", GPU_A), side_ports)
    worker_env = _node_env(nvml_script(tmp / "nvml-b.json", GPU_B), side_ports)
    gcs_port, http_port = ports.free_port(), ports.free_port()
    address = f"127.0.0.1:{gcs_port}"
    t0 = time.monotonic()
    head = ray_nodes.start_node(
        ray_nodes.node_command(
            cli, num_cpus=2, num_gpus=1, head_port=gcs_port, temp_dir=tmp / "ray"
        ),
        head_env,
        tmp / "head.log",
    )
    worker: subprocess.Popen[bytes] | None = None
    known: dict[int, list[int]] = {}
    node_ids: list[str] = []
    try:
        _wait_nodes(address, head_env, 1)
        worker = ray_nodes.start_node(
            ray_nodes.node_command(cli, num_cpus=1, num_gpus=1, address=address),
            worker_env,
            tmp / "worker.log",
        )
        node_ids = _wait_nodes(address, head_env, 2)
        started_s = time.monotonic() - t0
        deploy = subprocess.run(
            [sys.executable, "-c", DRIVER, address, json.dumps(serve_config(http_port))],
            env=head_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert deploy.returncode == 0, deploy.stdout[-2000:] + deploy.stderr[-3000:]
        base = f"http://127.0.0.1:{http_port}"
        wait_http(f"{base}/readyz", DEPLOY_TIMEOUT_S)
        nodes = TwoNodes(base, address, head_env, head, worker)
        nodes.timings_s = {"start_nodes": started_s, "deployed": time.monotonic() - t0}
        known = {
            head.pid: ray_nodes.descendants(head.pid),
            worker.pid: ray_nodes.descendants(worker.pid),
        }
        yield nodes
    finally:
        for proc in (worker, head):
            if proc is not None:
                ray_nodes.stop_group(proc, known.get(proc.pid, []))
        shutil.rmtree(tmp, ignore_errors=True)
        for node_id in node_ids:  # Serve's HAProxy leaves its per-node folder behind
            folder = haproxy_node_path(serve_env.haproxy_config_path(), node_id).parent
            shutil.rmtree(folder, ignore_errors=True)
        print(f"two-node cluster up and torn down in {time.monotonic() - t0:.1f} s")


def memory_doc(base: str) -> dict[str, Any]:
    resp = httpx.get(f"{base}/v1/memory", timeout=15.0)
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


def test_serve_app_node_check_finds_its_settings_on_both_nodes(two_nodes: TwoNodes) -> None:
    """`serve-app node --check` reads serve_app's variables and Ray's auth mode back from every
    node: both were started as `serve-app node` starts them (ray_nodes), with token auth."""
    done = subprocess.run(
        [sys.executable, "-m", "serve_app", "node", "--check", two_nodes.gcs_address],
        env=two_nodes.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "2 node(s); all set" in done.stdout, done.stdout[-2000:]


def test_replicas_on_both_nodes_answer_and_the_head_survives_the_worker(
    two_nodes: TwoNodes,
) -> None:
    base = two_nodes.base_url
    t0 = time.monotonic()
    # Both replicas answer through the head's ingress, and each sits on its own node and GPU.
    reps = wait_for(
        "both replicas' memory reports",
        lambda: memory_doc(base)["replicas"],
        lambda r: len(r) == 2,
        60.0,
    )
    by_gpu = {r["gpu_uuid"]: r for r in reps}
    assert set(by_gpu) == {GPU_A, GPU_B}, reps
    assert by_gpu[GPU_A]["node_id"] != by_gpu[GPU_B]["node_id"], reps
    assert all(r["gpu_mode"] == "logical-scripted" for r in reps), reps
    seen: set[str] = set()
    with httpx.Client(timeout=30.0) as client:
        deadline = time.monotonic() + 30.0
        while len(seen) < 2 and time.monotonic() < deadline:
            resp = client.post(f"{base}/v1/embeddings", json={"input": "hello"})
            assert resp.status_code == 200, resp.text
            seen.add(resp.headers["x-serve-app-replica"])
    assert seen == {r["replica_id"] for r in reps}, (seen, reps)
    doc = memory_doc(base)
    gpus = {g["uuid"]: g for g in doc["gpus"]}
    assert set(gpus) == {GPU_A, GPU_B}, doc["gpus"]
    assert gpus[GPU_B]["node_id"] == by_gpu[GPU_B]["node_id"], doc["gpus"]
    assert gpus[GPU_A]["budgets_bytes"] == TOTAL_BYTES, doc["gpus"]  # num_gpus 1 x total

    # Kill the worker node under load; the head's replica keeps answering.
    load = Load(f"{base}/v1/embeddings", threads=4, max_s=90.0).start()
    try:
        wait_for("some load served", load.ok, lambda n: n >= 20, 30.0)
        before_kill = load.ok()
        killed_at = time.monotonic()
        ray_nodes.stop_group(two_nodes.worker, [])
        after = wait_for(
            "the head serving on after the kill", load.ok, lambda n: n >= before_kill + 50, 60.0
        )
        lost = wait_for(
            "/v1/memory to drop the worker's GPU and its replica (reports live 5 s)",
            lambda: memory_doc(base),
            lambda d: (
                GPU_B not in {g["uuid"] for g in d["gpus"]}
                and GPU_B not in {r["gpu_uuid"] for r in d["replicas"]}
            ),
            60.0,
        )
        noticed_s = time.monotonic() - killed_at
    finally:
        load.stop()
    failures = load.failures()
    print(
        f"two nodes: {two_nodes.timings_s}, served {after} requests, worker's GPU gone from "
        f"/v1/memory {noticed_s:.1f} s after the kill, {len(failures)} failed: {failures[:5]}"
        f", test body {time.monotonic() - t0:.1f} s; errors: {lost['errors']}"
    )
    assert [g["uuid"] for g in lost["gpus"]] == [GPU_A], lost["gpus"]
    assert [r["gpu_uuid"] for r in lost["replicas"]] == [GPU_A], lost["replicas"]
    # The worker's monitor is gone: once the GCS has marked the node dead (its health checks
    # take a few seconds) the report says so by name; before that, the call to it fails.
    worker_node = by_gpu[GPU_B]["node_id"]
    named = f"node {worker_node} is not alive: its GPUs are lost"
    assert any(e == named or e.startswith("monitor failed") for e in lost["errors"]), lost
    # HAProxy retries a request whose replica vanished (empty-response / conn-failure) once.
    # A node killed outright can still lose a request or two in flight; count, do not hide.
    assert len(failures) <= 2, failures
