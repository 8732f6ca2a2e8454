"""Ray nodes on one host, started with the ``ray`` CLI on 127.0.0.1 (a head, then workers), each
in its own process group, and stopped by group: the cluster of tests/integration/test_two_nodes.py
and of load_tests.benchmarks.multigpu's per-GPU grab (a node per GPU).

Nothing here runs ``ray stop``: it stops every Ray process on the machine, other clusters
included. ``stop_group`` ends a node's process group and every process it was seen to start
(HAProxy and Ray's workers may have left the group).
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from load_tests.harness.meta import ROOT
from serve_app.ops import cluster_env, node, ports
from serve_app.startup import ray_compat

OBJECT_STORE_BYTES = 200 * 1024 * 1024


def ray_cli() -> list[str] | None:
    """The ``ray`` CLI of this interpreter's environment, else one on PATH, else the same CLI
    through this interpreter (``pip install --target`` puts the script where neither looks, as
    on the GPU host); None when Ray is not installed."""
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.exists() else shutil.which("ray")
    if found:
        return [found]
    if importlib.util.find_spec("ray") is None:
        return None
    return [sys.executable, "-m", "ray.scripts.scripts"]


def node_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment for a node, as ``serve-app node`` builds it (ops.node:
    ops.cluster_env's variables and Ray's token auth, here with this process's token,
    RAY_AUTH_TOKEN, made when there is none, so every node and driver started from this process
    shares it), with cluster_env's values forced, no RAY_ADDRESS, the repository on PYTHONPATH,
    no usage stats, a 2 s HAProxy drain, then ``extra`` (side ports, a scripted NVML,
    CUDA_VISIBLE_DEVICES). Ray may join nodes: not the loopback switch a one-node
    ``serve-app run`` sets in this process (ray_compat.LOOPBACK_NODE_VAR)."""
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    mine = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    mine.pop(ray_compat.LOOPBACK_NODE_VAR, None)
    mine["RAY_AUTH_MODE"] = "token"
    env = node.node_environ(mine, head=False)[0]
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            "RAY_USAGE_STATS_ENABLED": "0",
            **cluster_env.cluster_env(),
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
            **extra,
        }
    )
    return env


def node_command(
    cli: Sequence[str],
    *,
    num_cpus: float,
    num_gpus: int,
    head_port: int | None = None,
    address: str | None = None,
    temp_dir: Path | None = None,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """``ray start --block`` for a head (``head_port``) or a worker (``address``) on 127.0.0.1,
    as ``serve-app node`` builds it (ops.node.ray_start_command), with this harness's options:
    no dashboard, a free Ray Client port, a small object store, the node's labels."""
    if (head_port is None) == (address is None):
        raise ValueError("give head_port for a head or address for a worker, not both")
    extra = ["--block", "--object-store-memory", str(OBJECT_STORE_BYTES)]
    if head_port is not None:
        extra += ["--include-dashboard", "false"]
        extra += ["--ray-client-server-port", str(ports.free_port())]
        if temp_dir is not None:
            extra += ["--temp-dir", str(temp_dir)]
    if labels:
        extra += ["--labels", ",".join(f"{k}={v}" for k, v in labels.items())]
    spec = node.NodeSpec(
        head=head_port is not None,
        address=address,
        port=head_port or node.DEFAULT_GCS_PORT,
        node_ip_address="127.0.0.1",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        ray_args=tuple(extra),
    )
    return node.ray_start_command(cli, spec)


def start_node(cmd: Sequence[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start a node in its own process group, its output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            list(cmd), env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def wait_nodes(address: str, env: Mapping[str, str], want: int, timeout_s: float) -> list[str]:
    """The IDs of the alive nodes once there are ``want`` of them; TimeoutError after
    ``timeout_s`` (with the probe's last output)."""
    probe = (
        "import ray,sys; ray.init(address=sys.argv[1], log_to_driver=False); "
        "print(' '.join(n['NodeID'] for n in ray.nodes() if n['Alive']))"
    )
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            got = subprocess.run(
                [sys.executable, "-c", probe, address],
                env=dict(env),
                capture_output=True,
                text=True,
                timeout=max(5.0, min(60.0, deadline - time.monotonic())),
            )
        except subprocess.TimeoutExpired as exc:
            last = f"probe timed out: {exc}"
            continue
        last = (got.stdout + got.stderr)[-500:]
        ids = (got.stdout.strip().splitlines() or [""])[-1].split()
        if got.returncode == 0 and len(ids) == want:
            return ids
        time.sleep(1.0)
    raise TimeoutError(f"{want} Ray nodes not alive after {timeout_s:.0f} s: {last}")


def descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def kill_pids(pids: Sequence[int]) -> None:
    import psutil

    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            continue


def stop_group(proc: subprocess.Popen[bytes], known: Sequence[int] = ()) -> None:
    """SIGKILL a node's process group and every process it was seen to start."""
    pids = list(known) + descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    kill_pids(pids)
    proc.wait(timeout=10)
