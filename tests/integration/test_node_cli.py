"""`serve-app node --head` as a user runs it: a head started through the command, with none of
serve_app's variables in the caller's environment, joined by `serve-app node --check`, which must
find them all on the node (and Ray's token mode), then stopped by process group.

No `ray stop` (it would stop every Ray on the machine): the head's process group and what it
started are killed (load_tests.harness.ray_nodes.stop_group). About 15 s on the 2-core machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from load_tests.harness import ray_nodes
from serve_app.ops import cluster_env, ports
from serve_app.startup import ray_compat

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    ray_nodes.ray_cli() is None, reason="the `ray` CLI is not installed"
)


def test_serve_app_node_starts_a_head_that_check_finds_set() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    for name in [*cluster_env.cluster_env(), ray_compat.LOOPBACK_NODE_VAR, "RAY_AUTH_MODE"]:
        env.pop(name, None)  # serve-app node must set each itself
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    assert env.get("RAY_AUTH_TOKEN"), "tests/conftest.py gives the session a token"
    tmp = Path(tempfile.mkdtemp(prefix="san-", dir="/tmp"))  # short: Ray's socket paths
    port = ports.free_port()
    address = f"127.0.0.1:{port}"
    ray_opts = ["--block", "--include-dashboard", "false", "--temp-dir", str(tmp / "ray")]
    ray_opts += ["--ray-client-server-port", str(ports.free_port())]
    ray_opts += ["--object-store-memory", str(ray_nodes.OBJECT_STORE_BYTES)]
    cmd = [sys.executable, "-m", "serve_app", "node", "--head", "--port", str(port)]
    cmd += ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--num-gpus", "0", "--"]
    head = ray_nodes.start_node([*cmd, *ray_opts], env, tmp / "head.log")
    known: list[int] = []
    try:
        check_env = {**env, "RAY_AUTH_MODE": "token"}
        ray_nodes.wait_nodes(address, check_env, 1, 60.0)
        known = ray_nodes.descendants(head.pid)
        done = subprocess.run(
            [sys.executable, "-m", "serve_app", "node", "--check", address],
            env=env,  # no RAY_AUTH_MODE: the check turns token mode on itself
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "1 node(s); all set" in done.stdout, done.stdout
        log = (tmp / "head.log").read_text()
        assert "token authentication on (RAY_AUTH_MODE=token)" in log, log[-2000:]
        assert "the RAY_AUTH_TOKEN variable" in log and env["RAY_AUTH_TOKEN"] not in log
    finally:
        ray_nodes.stop_group(head, known)
        shutil.rmtree(tmp, ignore_errors=True)
