"""A local serve_app cluster for the load tools, and what they read from it.

``start_cluster``: Ray and Serve on 127.0.0.1 as ``serve-app run`` starts them (HAProxy
ingress, serve_app.ops.launch's settings) and ``replicas`` of an application, returned once every
replica is UP in HAProxy. Then: HAProxy's view of the replicas (``haproxy_up``, ``UpLog``), the
replicas' pids (``replica_pids``, ``pick_victim``), ``wait_whole``, the reliability settings in
force, private HAProxy files (so that a cluster runs beside another and its HAProxy can be told
apart: ``kill_matching``), ``wait_answer`` for a first 2xx and each replica's memory report.
Only 127.0.0.1 is targeted; every wait is bounded.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from serve_app.control.monitor import pid_alive

APP = "faults"
WHOLE_TIMEOUT_S = 120.0
# The fault suite's app: the queue is bounded small so that 3x overload meets the bound in
# seconds (the default application of start_cluster).
ARGS = {
    "adapter": "embeddings",
    "max_batch_size": 16,
    "batch_wait_timeout_s": 0.0,
    "max_queued_items": 256,
    "queue_deadline_s": 2.0,
    "request_timeout_s": 10.0,
}


@dataclass
class Target:
    base: str  # http://127.0.0.1:PORT/faults
    node_id: str
    replicas: int = 2
    app: str = APP  # the Serve application (and its route prefix, /APP)

    @property
    def url(self) -> str:
        return f"{self.base}/v1/embeddings"


def start_cluster(
    replicas: int = 2,
    args: dict[str, Any] | None = None,
    actor_options: dict[str, Any] | None = None,
    num_gpus: int = 0,
    num_cpus: int = 8,
    timeout_s: float = WHOLE_TIMEOUT_S,
) -> Target:
    """Ray and Serve on 127.0.0.1 (HAProxy, launch.start_ray's settings) and ``replicas`` of
    the app; returns once every replica is UP in HAProxy."""
    from serve_app.ops import launch, ports
    from serve_app.startup import warmpool

    ports.private_haproxy_ports()
    # A harness cluster runs beside a server or a test session: never their metrics port.
    os.environ[launch.METRICS_PORT_VAR] = str(ports.free_port())
    port = ports.free_port()
    from serve_app.config.args import parse_args

    app_args = parse_args(args or ARGS)
    launch.start_ray(
        num_gpus,
        True,
        num_cpus,
        request_timeout_s=app_args.request_timeout_s,
        system_config=warmpool.system_config([app_args.adapter], app_args.warm_workers),
    )
    import ray

    launch.start_serve(port)  # and the registry first, as serve-app run starts it
    node_id = ray.get_runtime_context().get_node_id()
    target = _deploy(f"http://127.0.0.1:{port}", node_id, APP, replicas, app_args, actor_options)
    launch.wait_ready(target.base, timeout_s)
    wait_whole(target, timeout_s=timeout_s)
    return target


def _deploy(
    root: str,
    node_id: str,
    name: str,
    replicas: int,
    app_args: Any,
    actor_options: dict[str, Any] | None,
) -> Target:
    """``replicas`` of serve_app's replica with ``app_args`` (config.args.AppArgs) as Serve
    application ``name`` at route prefix /NAME on the running Serve; its Target, not waited on."""
    from ray import serve

    from serve_app.serving.replica import ModelServer

    app = ModelServer.options(  # type: ignore[attr-defined]
        num_replicas=replicas, ray_actor_options=actor_options or {"num_cpus": 0.5}
    ).bind(app_args.model_dump())
    serve.run(app, name=name, route_prefix=f"/{name}")
    return Target(f"{root}/{name}", node_id, replicas, app=name)


def add_app(
    beside: Target,
    name: str,
    replicas: int,
    args: dict[str, Any],
    actor_options: dict[str, Any],
    timeout_s: float = WHOLE_TIMEOUT_S,
) -> Target:
    """A second application ``name`` (route prefix /NAME) on ``beside``'s running cluster, with
    its own args and actor options; returns once its ``replicas`` are UP in HAProxy."""
    from serve_app.config.args import parse_args
    from serve_app.ops import launch

    root = beside.base.rsplit("/", 1)[0]
    target = _deploy(root, beside.node_id, name, replicas, parse_args(args), actor_options)
    launch.wait_ready(target.base, timeout_s)
    if wait_whole(target, timeout_s=timeout_s) is None:
        raise RuntimeError(f"{name}: {replicas} replicas not all UP in HAProxy in {timeout_s} s")
    return target


def haproxy_processes(node_id: str | None = None) -> list[Any]:
    """This node's HAProxy processes (psutil): two while a reload's old one drains (Ray starts
    the new one with ``-sf OLD``), one otherwise. ``node_id``: the connected driver's node."""
    import psutil

    from serve_app import env
    from serve_app.ops.haproxy import haproxy_node_path

    if node_id is None:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
    cfg = str(haproxy_node_path(env.haproxy_config_path(), node_id))
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "haproxy" and cfg in (proc.info["cmdline"] or []):
            found.append(proc)
    return found


def wait_one_haproxy(timeout_s: float = 60.0, node_id: str | None = None) -> int:
    """Wait (at most ``timeout_s``) until a reload's old HAProxy process has drained and one is
    left; returns how many there are at the end (1, or 0 at once where the node runs none,
    or more when it timed out)."""
    deadline = time.monotonic() + timeout_s
    procs = haproxy_processes(node_id)
    while len(procs) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
        procs = haproxy_processes(node_id)
    return len(procs)


def haproxy_rows(target: Target) -> dict[str, dict[str, str]]:
    """Replica id -> HAProxy's ``show stat`` row, for this app's replicas."""
    from serve_app.ops.haproxy import haproxy_servers

    prefix = f"http-{target.app}/SERVE_REPLICA_{target.app}-model-"
    servers = haproxy_servers(target.node_id)
    return {name[len(prefix) :]: s for name, s in servers.items() if name.startswith(prefix)}


def haproxy_up(target: Target) -> dict[str, str]:
    """Replica id -> HAProxy status, for this app's replicas."""
    return {rid: row["status"] for rid, row in haproxy_rows(target).items()}


def wait_whole(
    target: Target,
    replicas: int | None = None,
    timeout_s: float = WHOLE_TIMEOUT_S,
    exclude: frozenset[str] | set[str] = frozenset(),
) -> float | None:
    """Seconds until /readyz shows nothing degraded and HAProxy has ``replicas`` (default: the
    target's) UP, not counting ``exclude`` (replicas known dead, which HAProxy may show UP for a
    moment); None if that did not happen within ``timeout_s``."""
    want = target.replicas if replicas is None else replicas
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            ready = httpx.get(f"{target.base}/readyz", timeout=10.0).json()
            up = [r for r, s in haproxy_up(target).items() if s == "UP" and r not in exclude]
            if ready.get("ready") and not ready.get("degraded") and len(up) >= want:
                return time.monotonic() - t0
        except (httpx.HTTPError, OSError, ValueError):
            pass
        time.sleep(0.25)
    return None


def replica_pids(target: Target) -> dict[str, int]:
    """Replica id -> pid, for the replicas that reported lately (a dead one may linger for
    REPORT_MAX_AGE_S: check the pid before trusting it)."""
    report = httpx.get(f"{target.base}/v1/memory", timeout=30.0).json()["replicas"]
    return {r["replica_id"]: int(r["pid"]) for r in report}


def reliability_env() -> dict[str, str | None]:
    """The reliability settings this run had (ops.cluster_env.reliability_env's names)."""
    from serve_app.ops import cluster_env

    return {name: os.environ.get(name) for name in cluster_env.reliability_env(0.0)}


# ---- HAProxy watching ---------------------------------------------------------------------


class UpLog:
    """Polls HAProxy every 0.2 s in a thread: when each replica was first seen UP, and when
    first seen not UP (DOWN, MAINT or gone) since it was last UP: a replica that flaps and comes
    back forgets its earlier exit, so the exit recorded is the one after its last UP (a stale one
    gave GPU fault run 2 a kill taken out of rotation "-4.64 s" after it)."""

    def __init__(self, target: Target):
        self.target = target
        self.first_up: dict[str, float] = {}
        self.first_out: dict[str, float] = {}
        self.initial: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def poll(self) -> dict[str, str]:
        try:
            states = haproxy_up(self.target)
        except OSError:
            return {}
        now = time.monotonic()
        with self._lock:
            for rid, status in states.items():
                if status.startswith("UP"):
                    self.first_up.setdefault(rid, now)
                    self.first_out.pop(rid, None)
            for rid in self.first_up:
                if not states.get(rid, "gone").startswith("UP"):
                    self.first_out.setdefault(rid, now)
        return states

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.poll()

    def up(self, exclude: set[str]) -> list[str]:
        return [r for r, s in self.poll().items() if s == "UP" and r not in exclude]

    def __enter__(self) -> UpLog:
        self.initial = set(self.poll())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def new_replicas(self) -> list[tuple[float, str]]:
        """(first UP time, id) of every replica that was not there at the start, in order."""
        with self._lock:
            return sorted((t, r) for r, t in self.first_up.items() if r not in self.initial)


def pick_victim(target: Target, up: list[str], exclude: set[str]) -> tuple[str, int] | None:
    """A replica UP in HAProxy, reported with a live pid, not already hit."""
    try:
        pids = replica_pids(target)
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    for rid in up:
        pid = pids.get(rid)
        if rid not in exclude and pid is not None and pid_alive(pid):
            return rid, pid
    return None


# ---- private HAProxy files, cleanup, answers ----------------------------------------------


def private_haproxy_files(scratch: Path) -> None:
    """HAProxy's files default to a shared /tmp/haproxy-serve and its side ports are fixed.
    Private ones (set before ray.init) let this cluster run beside another Serve and tell its
    HAProxy apart by its config path (see kill_matching)."""
    os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"] = str(scratch / "haproxy.cfg")
    os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"] = str(scratch / "admin.sock")
    os.environ["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] = str(scratch)
    os.environ["RAY_SERVE_HAPROXY_SERVER_STATE_FILE"] = str(scratch / "server-state")
    from serve_app.ops.ports import private_haproxy_ports

    private_haproxy_ports()


def kill_matching(marker: str, names: Sequence[str] = ()) -> list[int]:
    """Terminate (then kill) processes whose command line contains `marker` (and, when
    `names` is given, whose name contains one of them). Returns their PIDs."""
    import psutil

    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = " ".join(proc.info.get("cmdline") or [])
            name = proc.info.get("name") or ""
            if proc.pid == me or marker not in cmd:
                continue
            if names and not any(n in name or n in cmd.split(" ")[0] for n in names):
                continue
            found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for proc in found:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(found, timeout=5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return [p.pid for p in found]


def wait_answer(request: Any, timeout_s: float) -> float:
    """Send the real request until it gets a 2xx (HAProxy reloads after deploy; the first
    forward pass initialises the GPU). Returns the seconds it took."""
    t0 = time.monotonic()
    last = ""
    with httpx.Client(timeout=30.0) as http:
        while time.monotonic() - t0 < timeout_s:
            try:
                resp = http.request(
                    request.method, request.url, headers=request.headers, content=request.content
                )
                if 200 <= resp.status_code < 300:
                    return time.monotonic() - t0
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.3)
    raise TimeoutError(f"{request.url} gave no 2xx within {timeout_s:.0f} s; last: {last}")


def server_memory(base_url: str) -> list[dict[str, Any]]:
    """Each replica's memory report (GET /v1/memory), the fields a benchmark keeps."""
    keep = (
        "replica_id",
        "pid",
        "node_id",
        "gpu_uuid",
        "budget_bytes",
        "cap_bytes",
        "torch_fraction",
        "reserved_bytes",
        "peak_reserved_bytes",
        "non_torch_overhead_bytes",
        "nvml_process_bytes",
        "calibrated_batch_size",
        "calibration_peak_bytes",
        "max_batch_size",
        "largest_batch",
        "batches",
        "batched_items",
        "batch_busy_s",
        "queued_items",
        "warmup_s",
        "cuda_graphs",
        "cuda_graph_pool_bytes",
        "cuda_graph_capture_s",
        "cuda_graph_replays",
        "oom_recoveries",
        "cache_policy",
        "cache_frees",
    )
    try:
        reps = httpx.get(f"{base_url}/v1/memory", timeout=10.0).json().get("replicas", [])
        return [{k: r.get(k) for k in keep} for r in reps if isinstance(r, dict)]
    except Exception as exc:  # noqa: BLE001 - the report is extra, not the measurement
        return [{"error": repr(exc)}]
