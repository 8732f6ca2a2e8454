"""``serve-app node``: start a Ray node for serve_app in one command, a head or a worker joining
one, with what ``serve-app run`` gives its own Ray: ops.cluster_env's variables (HAProxy, its
retries, health checks and server timeout, the force stop, same-thread handlers), the warm
workers' preload list (head only: Ray's system config is the head's), and Ray's token
authentication (ops.ray_auth). ``--check`` reads those variables back from every alive node of
a running cluster and names what differs.

It runs ``ray start`` (Ray's CLI does the rest: ports, the dashboard on 127.0.0.1, joining).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from serve_app.ops import haproxy, ray_auth
from serve_app.ops.cluster_env import cluster_env

__all__ = [
    "DEFAULT_GCS_PORT",
    "NodeSpec",
    "check_cluster",
    "env_differences",
    "node_environ",
    "ray_cli",
    "ray_start_command",
    "start_node",
]

DEFAULT_GCS_PORT = 6379  # Ray's own default for `ray start --head`


@dataclass(frozen=True)
class NodeSpec:
    """What ``serve-app node`` was asked for: a head (``head``) or a worker joining
    ``address``, and the ``ray start`` options serve_app passes on."""

    head: bool
    address: str | None = None
    port: int = DEFAULT_GCS_PORT
    node_ip_address: str | None = None
    num_cpus: float | None = None
    num_gpus: int | None = None
    system_config: Mapping[str, object] = field(default_factory=dict)
    ray_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.head == (self.address is not None):
            raise ValueError("a node is a head (--head) or joins one (--address), not both")


def ray_cli() -> list[str]:
    """The ``ray`` CLI of this interpreter's environment, else one on PATH, else Ray's CLI module
    through this interpreter."""
    beside = os.path.join(os.path.dirname(sys.executable), "ray")
    found = beside if os.path.exists(beside) else shutil.which("ray")
    return [found] if found else [sys.executable, "-m", "ray.scripts.scripts"]


def ray_start_command(cli: Sequence[str], spec: NodeSpec) -> list[str]:
    """``ray start`` for ``spec``. A head keeps Ray's dashboard on 127.0.0.1 (Ray's default
    ``--dashboard-host``, said here so a changed default cannot widen it; ``serve deploy``
    talks to it there) and sends no usage stats."""
    cmd = [*cli, "start"]
    if spec.head:
        cmd += ["--head", "--port", str(spec.port), "--dashboard-host", "127.0.0.1"]
        if spec.system_config:
            cmd += ["--system-config", json.dumps(dict(spec.system_config), sort_keys=True)]
    else:
        cmd += ["--address", str(spec.address)]
    if spec.node_ip_address:
        cmd += ["--node-ip-address", spec.node_ip_address]
    if spec.num_cpus is not None:
        cmd += ["--num-cpus", f"{spec.num_cpus:g}"]
    if spec.num_gpus is not None:
        cmd += ["--num-gpus", str(spec.num_gpus)]
    return [*cmd, "--disable-usage-stats", *spec.ray_args]


def env_differences(environ: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str]:
    """``name -> what differs`` for each of ``wanted``'s variables that ``environ`` lacks or
    sets to another value."""
    out = {}
    for name, value in wanted.items():
        have = environ.get(name)
        if have != value:
            got = "unset" if have is None else repr(have)
            out[name] = f"{got}, serve_app sets {value!r}"
    return out


def node_environ(
    environ: Mapping[str, str],
    *,
    head: bool,
    request_timeout_s: float | None = None,
    insecure: bool = False,
) -> tuple[dict[str, str], ray_auth.RayAuth, dict[str, str]]:
    """The environment ``ray start`` gets: ``environ`` with cluster_env's variables where it
    has none (a user's own value wins, and is returned among the differences), and token auth
    (a head writes a token when none exists; a worker must have the head's).

    Raises:
        StartupError: from ray_auth.setup_token_auth.
    """
    env = {k: v for k, v in environ.items() if k != "RAY_ADDRESS"}
    auth = ray_auth.setup_token_auth(env, insecure=insecure, create=head)
    wanted = cluster_env(request_timeout_s)
    differs = {k: why for k, why in env_differences(env, wanted).items() if k in env}
    for name, value in wanted.items():
        env.setdefault(name, value)
    return env, auth, differs


def start_node(
    spec: NodeSpec,
    environ: Mapping[str, str],
    *,
    request_timeout_s: float | None = None,
    insecure: bool = False,
    dry_run: bool = False,
) -> int:
    """Print what the node gets, then run ``ray start`` (unless ``dry_run``); its exit code."""
    env, auth, differs = node_environ(
        environ, head=spec.head, request_timeout_s=request_timeout_s, insecure=insecure
    )
    cmd = ray_start_command(ray_cli(), spec)
    print(auth.note, flush=True)
    for warning in auth.warnings:
        print(f"{'!' * 78}\n{warning}\n{'!' * 78}", file=sys.stderr, flush=True)
    for name, why in differs.items():
        print(f"note: {name} is {why}; the environment's value is kept", flush=True)
    print(
        "Ray's ports listen on this node's IP (Ray needs them reachable by the other nodes); "
        f"close them to all but the cluster's nodes: {ray_auth.SECURITY_DOC}.",
        flush=True,
    )
    print("$ " + " ".join(cmd), flush=True)
    if dry_run:
        return 0
    # HAProxy's admin socket and files private to this node's user, its stats on loopback.
    for name, value in haproxy.node_private_files().items():
        if name == haproxy.BINARY_VAR or not env.get(name):
            env[name] = value
    code = subprocess.call(cmd, env=env)
    if code == 0 and spec.head and auth.enabled:
        print(
            "Deploy with `RAY_AUTH_MODE=token serve deploy CONFIG` on this node (Ray's CLI "
            f"sends the token only in token mode; it reads it from {auth.source}), and check "
            "the nodes with `serve-app node --check ADDRESS`.",
            flush=True,
        )
    return code


def _node_env_probe(names: Sequence[str]) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in names}


def check_cluster(
    address: str, request_timeout_s: float | None = None, *, insecure: bool = False
) -> dict[str, Any]:
    """Connect to the cluster at ``address`` (with the token, as setup_token_auth finds it) and
    read, on every alive node, the variables of cluster_env and ``RAY_AUTH_MODE`` (a task
    pinned to the node: its worker inherits the node's environment).
    ``{node_id: {"ip": ..., "differs": {name: why}}}``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from serve_app.startup import ray_compat

    # Ray sends its token only in token mode, and never turns it on for an explicit address.
    ray_auth.setup_token_auth(os.environ, insecure=insecure, create=False)
    ray_compat.reread_auth_mode()
    wanted = {**cluster_env(request_timeout_s), ray_auth.AUTH_MODE_VAR: "token"}
    ray.init(address=address, log_to_driver=False)
    try:
        probe = ray.remote(num_cpus=0)(_node_env_probe)
        nodes = [n for n in ray.nodes() if n["Alive"]]
        refs = [
            probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(list(wanted))
            for n in nodes
        ]
        found = ray.get(refs, timeout=120)
    finally:
        ray.shutdown()
    return {
        n["NodeID"]: {
            "ip": n["NodeManagerAddress"],
            "differs": env_differences({k: v for k, v in seen.items() if v is not None}, wanted),
        }
        for n, seen in zip(nodes, found, strict=True)
    }
