"""Start a local Ray, deploy a config, wait until it serves, and shut everything down cleanly.

The CLI (`serve-app run`) is a thin shell over these functions; tests call them directly.
"""

from __future__ import annotations

import copy
import ipaddress
import logging
import math
import os
import random
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from serve_app import env
from serve_app.config.deploy import check_deploy_config, enforcements
from serve_app.errors import ConfigError, StartupError
from serve_app.gpu import mps
from serve_app.startup import warmpool

logger = logging.getLogger("serve_app")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


@dataclass
class Deployment:
    """What ``serve-app run`` started: the URL and the notes it printed."""

    url: str
    notes: list[str] = field(default_factory=list)
    haproxy: bool = False
    warnings: list[str] = field(default_factory=list)


# The MPS control daemon `run` found or started, for `shutdown` (which stops only one it started).
_mps_daemon: mps.Daemon | None = None


def start_mps_if_needed(doc: dict[str, Any], gpus: int) -> str | None:
    """Find or start the node's MPS control daemon when an application's memory.enforcement is
    mps or both (before Ray, whose processes inherit its pipe directory); a note saying which,
    or None when no application needs MPS."""
    global _mps_daemon
    needing = sorted(name for name, e in enforcements(doc).items() if mps.uses_mps(e))
    if not needing:
        return None
    if gpus == 0:
        raise StartupError(
            f"application(s) {', '.join(needing)} set memory.enforcement mps or both, which "
            f"needs an NVIDIA GPU, and this machine has none; {mps.TORCH_HINT}"
        )
    _mps_daemon = mps.ensure_daemon()
    return f"{_mps_daemon.describe()}, for {', '.join(needing)}."


def gpu_count() -> int:
    """The CUDA GPUs this process may use. Read through NVML (``nvml.visible_cuda_devices``),
    not torch: importing torch alone took 1.9 to 2.5 s on the H200 host, and ``serve-app run``
    decides this before Ray starts, so every cold start waited for it. Where NVML cannot be
    read (no NVIDIA driver), torch answers."""
    from serve_app.gpu import devices, nvml

    count = devices.visible_cuda_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not isinstance(count, nvml.NvmlError):
        return count
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpu_fallback(doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """With no GPU, drop every deployment's GPU request so it runs on the CPU (said, not silent)."""
    doc = copy.deepcopy(doc)
    notes = []
    for app in doc.get("applications", []):
        for dep in app.get("deployments") or []:
            opts = dep.get("ray_actor_options") or {}
            if opts.get("num_gpus"):
                notes.append(
                    f"no GPU: deployment {app.get('name', 'default')}/{dep.get('name')} asks for "
                    f"num_gpus={opts['num_gpus']}; running it on the CPU instead"
                )
                opts["num_gpus"] = 0
    return doc, notes


def http_address(doc: dict[str, Any]) -> tuple[str, int]:
    opts = doc.get("http_options") or {}
    return str(opts.get("host", DEFAULT_HOST)), int(opts.get("port", DEFAULT_PORT))


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name or 0.0.0.0-like wildcard: assume it is reachable from outside


def exposure_warning(host: str, keys_configured: bool) -> str | None:
    """The warning `serve-app run` prints when it would serve beyond this machine with no API
    key; None when it binds a loopback address or keys are set."""
    if is_loopback(host) or keys_configured:
        return None
    return (
        f"WARNING: http_options.host is {host!r}, reachable from other machines, and no API "
        f"key is configured: anyone who can reach it can run inference and read /v1/memory. "
        f"Set {env.API_KEYS_VAR} (comma-separated) or {env.API_KEYS_FILE_VAR} (one per line) "
        "before starting, or bind 127.0.0.1."
    )


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


HAPROXY_SIDE_PORT_VARS = (
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
)


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# Run the replica's request handlers on the event loop of Serve's own HTTP server instead of a
# second loop in another thread. serve_app's handlers never block their loop (decoding runs in a
# thread, batches in the predict thread, and Serve runs sync methods such as check_health in
# its thread pool), so the second loop only added a cross-thread hop to every request:
# measured on 2 CPU cores, 5.73 -> 5.05 ms of replica CPU per request and +12% requests/s.
SAME_THREAD_VAR = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"

# Inference is idempotent, so a request whose replica dies before answering can be sent again.
# Ray 2.60 retries only `conn-failure` (nothing was sent) by default. `empty-response` covers a
# replica killed mid-request (the connection closes with nothing answered: SIGKILL, OOM kill, a
# crash), and `response-timeout` one that stops answering, when a server timeout is set
# (RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S; unset by default, so that token is dormant). Ray's
# template already has `option redispatch 1`, so the retry goes to another replica. One retry,
# not HAProxy's default 3: a request that kills its replica can take down at most two.
# 503s are not retried: they are our deliberate back-pressure.
#
# HAProxy replays only a request it held whole when it first sent it: it drops the request's
# retry flag if the body had not all arrived by then (http_ana/stream: msg_state !=
# HTTP_MSG_DONE), and keeps one buffer's copy (tune.bufsize, 16 KiB in Ray:
# RAY_SERVE_HAPROXY_TUNE_BUFSIZE), so larger bodies, such as most images, are never retried.
# httpx (and so the OpenAI client) writes the headers and the body in two sends; measured on
# 2 CPU replicas under 8 clients, 5 SIGKILLs lost 24 requests with Ray's default, 8 with the
# retry tokens alone (forwarded before their body arrived), and 0 in 6 kills with
# `option http-buffer-request`, which makes HAProxy wait for the whole body (up to a buffer)
# before it picks a server. Ray 2.60 has no setting for it, but renders
# RAY_SERVE_HAPROXY_RETRY_ON verbatim as a line of its `defaults` section, so the option rides
# on that value as a line of its own (checked in tests/integration/test_reliability.py).
HAPROXY_RETRY_ON = "conn-failure empty-response response-timeout"
HAPROXY_BUFFER_REQUEST_LINE = "\n    option http-buffer-request"
HAPROXY_RETRY_DEFAULTS = {
    "RAY_SERVE_HAPROXY_RETRY_ON": HAPROXY_RETRY_ON + HAPROXY_BUFFER_REQUEST_LINE,
    "RAY_SERVE_HAPROXY_RETRIES": "1",
}

# A hung replica (SIGSTOP, a wedged event loop, a lost node) must leave rotation fast. Ray 2.60
# gives every replica server `check` with `inter 5s fall 2 rise 2 fastinter 250ms downinter
# 250ms` (RAY_SERVE_HAPROXY_HEALTH_CHECK_*; GET /-/healthz, answered by the replica's event
# loop) and `observe layer4 ... on-error mark-down`, which a stopped process never trips: the
# kernel still accepts its connections. Ray sets no `timeout check`, so each check may take up
# to `inter`. A replica stopped just after a passing check: the next check comes `inter` later
# and times out after `inter`, a second one `fastinter` later after another `inter`: DOWN after
# 3 x inter + fastinter at worst. Measured on 2 CPU replicas: 13.1 s with Ray's 5 s. With
# `inter 2s` it is 6.25 s at worst; a working replica answers /-/healthz in milliseconds (the
# event loop never runs a batch), would need two checks in a row over 2 s to be marked down,
# and would be back UP 0.5 s later (rise 2 x downinter). Four replicas cost 2 checks/s.
HAPROXY_HEALTH_CHECK_DEFAULTS = {"RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER": "2s"}
# Serve's controller force-stops (SIGKILLs) a replica that failed its health check instead of
# draining it for graceful_shutdown_timeout_s (20 s): a replica that fails check_health is
# hung or its CUDA context is poisoned, and would answer nothing useful while draining. Its
# unanswered requests are replayed by HAProxy (empty-response).
FORCE_STOP_UNHEALTHY_VAR = "RAY_SERVE_FORCE_STOP_UNHEALTHY_REPLICAS"
# A request held by a hung replica: HAProxy gives up on it after `timeout server` (unset in
# Ray: forever) and, with `retry-on response-timeout`, replays it on another replica. A replica
# that works answers every request within its app's request_timeout_s (a 504 of its own at
# worst: http.guarded), however slow a loaded GPU makes inference, so the timeout is that plus
# a margin: shorter would replay, and so double, legitimate slow work under load.
TIMEOUT_SERVER_VAR = "RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"
TIMEOUT_SERVER_MARGIN_S = 5


def haproxy_timeout_server_s(request_timeout_s: float) -> str:
    """HAProxy's ``timeout server`` for apps whose longest request_timeout_s is this, in whole
    seconds as Ray reads it: the request timeout rounded up, plus TIMEOUT_SERVER_MARGIN_S."""
    return str(math.ceil(request_timeout_s) + TIMEOUT_SERVER_MARGIN_S)


def longest_request_timeout_s(doc: dict[str, Any]) -> float:
    """The largest ``args.request_timeout_s`` of the config's applications (the default where
    an application sets none)."""
    from serve_app.config.args import AppArgs

    default = float(AppArgs.model_fields["request_timeout_s"].default)
    values = [
        float((app.get("args") or {}).get("request_timeout_s", default))
        for app in doc.get("applications") or []
    ]
    return max(values, default=default)


def reliability_env(request_timeout_s: float) -> dict[str, str]:
    """Every variable start_ray sets for HAProxy and Serve (retries, health checks, the force
    stop, the server timeout) unless the user's environment already has it."""
    return {
        **HAPROXY_RETRY_DEFAULTS,
        **HAPROXY_HEALTH_CHECK_DEFAULTS,
        FORCE_STOP_UNHEALTHY_VAR: "1",
        TIMEOUT_SERVER_VAR: haproxy_timeout_server_s(request_timeout_s),
    }


# HAProxy's side ports come from here: above Ray's worker ports (10002-19999), below Serve's
# replica ports (30000 up) and the kernel's ephemeral range (32768 up). An ephemeral port that
# was free a moment ago can be taken by any outgoing connection before HAProxy binds it (seen
# on the GPU host with two clusters starting at once); nothing takes these without binding.
SIDE_PORT_RANGE = (20000, 29999)


def side_port(taken: set[int], attempts: int = 200) -> int:
    """A port in SIDE_PORT_RANGE, not in ``taken``, that binds on every interface now."""
    for _ in range(attempts):
        port = random.randint(*SIDE_PORT_RANGE)
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("0.0.0.0", port))  # HAProxy's stats listeners bind all interfaces
            except OSError:
                continue
        return port
    raise RuntimeError(
        f"no free port in {SIDE_PORT_RANGE[0]}-{SIDE_PORT_RANGE[1]} for HAProxy's side "
        f"listeners after {attempts} tries; set RAY_SERVE_HAPROXY_* ports yourself"
    )


def haproxy_side_ports() -> dict[str, str]:
    """Free ports (from SIDE_PORT_RANGE) for HAProxy's stats and metrics listeners and Serve's
    fallback proxy, which are fixed by default (8404, 9101, 8500, 9500), by variable name."""
    taken: set[int] = set()
    for _ in HAPROXY_SIDE_PORT_VARS:
        taken.add(side_port(taken))
    return dict(zip(HAPROXY_SIDE_PORT_VARS, (str(p) for p in sorted(taken)), strict=True))


def private_haproxy_ports() -> dict[str, str]:
    """``haproxy_side_ports`` set in this process's environment before Ray starts, so that a
    second cluster on the machine does not collide with the first."""
    ports = haproxy_side_ports()
    os.environ.update(ports)
    return ports


def cluster_env(request_timeout_s: float | None = None) -> dict[str, str]:
    """The variables every Ray node serving serve_app needs in its environment, as
    ``serve-app run`` sets them: the HAProxy ingress, its retry and health-check settings, and
    the replicas' handlers on Serve's own loop. A cluster started another way (``ray start``,
    KubeRay: deploy/kuberay/rayservice.yaml) sets these on every node before Ray starts.
    ``request_timeout_s``: the longest of the apps (default: AppArgs' default)."""
    if request_timeout_s is None:
        request_timeout_s = longest_request_timeout_s({})
    return {
        env.HA_PROXY_VAR: "1",
        SAME_THREAD_VAR: "0",
        **reliability_env(request_timeout_s),
    }


def start_ray(
    num_gpus: int,
    haproxy: bool,
    num_cpus: int | None = None,
    request_timeout_s: float | None = None,
    system_config: dict[str, Any] | None = None,
) -> None:
    """A local Ray with every port on 127.0.0.1. Env vars are set first so that Serve's
    controller and proxy processes inherit them. ``request_timeout_s``: the longest of the
    apps to be deployed (default: AppArgs' default), for HAProxy's server timeout.
    ``system_config``: Ray's own settings for the cluster (warmpool.system_config: the
    modules every worker imports as it starts)."""
    import ray

    wanted = cluster_env(request_timeout_s)
    if haproxy:
        os.environ[env.HA_PROXY_VAR] = wanted.pop(env.HA_PROXY_VAR)
    else:
        wanted.pop(env.HA_PROXY_VAR)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # HAProxy keeps a removed replica draining for 30 s by default; on one node its config
    # reloads in well under a second, and a long drain makes Ctrl-C slow.
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "2")
    for name, value in wanted.items():
        os.environ.setdefault(name, value)  # a user's own setting wins
    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=False,
        _node_ip_address=DEFAULT_HOST,
        namespace="serve_app",
        log_to_driver=True,
        _system_config=system_config or None,
    )


def deploy(doc: dict[str, Any]) -> None:
    """Deploy a whole Serve config (what ``serve deploy`` does, without the dashboard), and
    return once Serve's proxies are up.

    On a cluster without Serve, this starts Serve's controller as ``serve.start`` does, but
    sends the deploy before it waits for the proxies (Serve's own start waits first): the
    application's build and its replicas then start while the proxies do, which took seconds
    off every cold start. A proxy that does not come up is a StartupError all the same.
    """
    from ray.serve._private import api as serve_api
    from ray.serve._private.client import ServeControllerClient
    from ray.serve._private.constants import HTTP_PROXY_TIMEOUT
    from ray.serve.context import _get_global_client, _set_global_client
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate(doc)
    client = _get_global_client(raise_if_no_controller_running=False)
    proxies: list[Any] = []
    if client is None:
        controller, proxies = serve_api._create_controller_and_proxy_refs(
            config.http_options.model_dump(),
            None,
            None,
            None,
            serve_api._coerce_controller_options(None),
            config.proxy_location,
        )
        client = ServeControllerClient(controller)
        _set_global_client(client)
    client.deploy_apps(config, _blocking=False)
    if proxies:
        import ray

        try:
            ray.get(proxies, timeout=HTTP_PROXY_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - a timeout or the proxy actor's own error
            raise StartupError(
                f"Serve's proxies did not come up within {HTTP_PROXY_TIMEOUT} s "
                f"({type(exc).__name__}: {str(exc)[:300]}); see the proxy logs under "
                "/tmp/ray/session_latest/logs/serve/"
            ) from None


def wait_ready(url: str, timeout_s: float) -> None:
    """Poll ``/readyz?verbose=1`` until every deployment runs its target replicas (ready, and
    none degraded: a start-up waits for the whole deployment, while the probe itself is 200
    as soon as each deployment can serve), or raise StartupError with Serve's own status."""
    from ray import serve

    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        for name, app in serve.status().applications.items():
            if app.status == "DEPLOY_FAILED":
                raise StartupError(f"application {name!r} failed to deploy:\n{app.message}")
        try:
            resp = httpx.get(f"{url}/readyz", params={"verbose": "1"}, timeout=5.0)
            if resp.status_code == 200 and not resp.json().get("degraded"):
                return
            last = resp.text
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: a 200 that is not JSON
            last = str(exc)
        time.sleep(0.5)
    raise StartupError(f"not ready after {timeout_s:.0f} s; last /readyz answer: {last[:500]}")


def run(doc: dict[str, Any], *, haproxy: bool = True, ready_timeout_s: float = 300.0) -> Deployment:
    """Validate, start Ray, deploy and wait. Raises ConfigError / StartupError."""
    errors = check_deploy_config(doc)
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
    notes = []
    gpus = gpu_count()
    if gpus == 0:
        doc, fallback = cpu_fallback(doc)
        notes.append("No CUDA GPU found: serving on the CPU.")
        notes.extend(fallback)
    else:
        notes.append(f"Serving on {gpus} GPU(s).")
    host, port = http_address(doc)
    doc.setdefault("http_options", {}).update({"host": host, "port": port})
    keys = env.api_keys()  # read here too: a bad key file fails before Ray starts
    warning = exposure_warning(host, bool(keys))
    warnings = [warning] if warning else []
    if warning:
        logger.warning(warning)  # now, before the minutes of start-up, and again at the end
    elif keys:
        notes.append(
            f"API keys: {len(keys)} configured; inference, /v1/models and /v1/memory need one."
        )
    if not port_is_free(host, port):
        raise StartupError(
            f"{host}:{port} is already in use (another server, or an HAProxy left by a killed "
            "run: `pkill haproxy`); free it or set http_options.port in the config"
        )
    mps_note = start_mps_if_needed(doc, gpus)
    if mps_note:
        notes.append(mps_note)
    start_ray(
        gpus,
        haproxy,
        request_timeout_s=longest_request_timeout_s(doc),
        system_config=warmpool.system_config(*warmpool.app_settings(doc)),
    )
    deploy(doc)
    url = f"http://{host}:{port}"
    wait_ready(url, ready_timeout_s)
    return Deployment(url=url, notes=notes, haproxy=haproxy, warnings=warnings)


def haproxy_pids(session_dir: str) -> list[int]:
    """HAProxy processes started by this Ray session (their parent chain names its directory)."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["name"]):
        if "haproxy" not in (proc.info.get("name") or ""):
            continue
        try:
            ancestors = proc.parents()[:4]
            if any(session_dir in " ".join(p.cmdline()) for p in ancestors):
                pids.append(proc.pid)
        except psutil.Error:
            continue
    return pids


def haproxy_node_path(path: str, node_id: str) -> Path:
    """Serve keeps each node's HAProxy files in a folder named after the node, beside ``path``."""
    p = Path(path)
    return p.parent / node_id / p.name


def haproxy_servers(node_id: str, timeout_s: float = 5.0) -> dict[str, dict[str, str]]:
    """The state of every server of this node's HAProxy, from its admin socket's ``show stat``:
    ``{"backend/server": {"status": "UP", ...}}``. Serve marks a replica RUNNING before HAProxy
    has it UP; the fault tests wait for both."""
    import csv
    import io

    sock_path = haproxy_node_path(env.haproxy_socket_path(), node_id)
    chunks = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(sock_path))
        sock.sendall(b"show stat\n")
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    text = b"".join(chunks).decode().lstrip("# ")
    servers = {}
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("svname") not in ("FRONTEND", "BACKEND", None):
            servers[f"{row['pxname']}/{row['svname']}"] = row
    return servers


def shutdown() -> None:
    """Stop Serve and Ray, then any HAProxy that Serve started and Ray left behind."""
    import psutil
    import ray
    from ray import serve

    before: set[int] = set()
    node = ray._private.worker.global_worker.node if ray.is_initialized() else None
    haproxy_dir: Path | None = None
    if node is not None:
        before = set(haproxy_pids(node.get_session_dir_path()))
        # Serve's HAProxy keeps its config, socket and state files in a per-node folder
        # beside its config path, and leaves it behind.
        node_id = ray.get_runtime_context().get_node_id()
        haproxy_dir = haproxy_node_path(env.haproxy_config_path(), node_id).parent
    try:
        if ray.is_initialized():
            serve.shutdown()
    finally:
        ray.shutdown()
    for pid in before:
        try:
            proc = psutil.Process(pid)
            proc.terminate()
            proc.wait(timeout=5)
        except psutil.NoSuchProcess:
            continue
        except psutil.TimeoutExpired:
            proc.kill()
    if haproxy_dir is not None and haproxy_dir.is_dir():
        shutil.rmtree(haproxy_dir, ignore_errors=True)
    global _mps_daemon
    mps.stop_daemon(_mps_daemon)  # after Ray: its replicas were the daemon's clients
    _mps_daemon = None
