"""Start a local Ray, deploy a config, wait until it serves, and shut everything down cleanly.

The CLI (`serve-app run`) is a thin shell over these functions; tests call them directly. The
environment the cluster gets is ops.cluster_env's; HAProxy's ports and processes, ops.ports'
and ops.haproxy's.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from serve_app import env
from serve_app.config.cores import cores_error
from serve_app.config.deploy import check_deploy_config, doubles_warning, enforcements
from serve_app.config.walk import deployments
from serve_app.errors import ConfigError, StartupError
from serve_app.gpu import mps
from serve_app.ops import ray_auth
from serve_app.ops.cluster_env import cluster_env, longest_request_timeout_s
from serve_app.ops.exposure import (
    exposure_warning,
    is_loopback,
    ray_exposure_note,
    ray_listeners_beyond_loopback,
)
from serve_app.ops.haproxy import (
    free_stale_port,
    haproxy_node_path,
    haproxy_pids,
    own_haproxies,
    release_private_files,
    stop_own_haproxy,
    use_private_files,
)
from serve_app.ops.ports import DEFAULT_HOST, port_is_free
from serve_app.ops.proxies import PROXY_RESTART_WAIT_S, wait_proxies
from serve_app.startup import ray_compat, warmpool

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "Deployment",
    "cpu_fallback",
    "deploy",
    "exposure_warning",
    "gpu_count",
    "http_address",
    "is_loopback",
    "ray_exposure_note",
    "ray_listeners_beyond_loopback",
    "run",
    "shutdown",
    "start_mps_if_needed",
    "start_ray",
    "start_registry",
    "start_serve",
    "wait_ready",
]

logger = logging.getLogger("serve_app")
DEFAULT_PORT = 8000
# Ray's Prometheus endpoint (every metric, serve_app's included: docs/metrics.md), pinned so that
# a scrape config can name it; on 127.0.0.1 as Ray's other ports. SERVE_APP_METRICS_PORT moves it.
DEFAULT_METRICS_PORT = 8080
METRICS_PORT_VAR = "SERVE_APP_METRICS_PORT"


def metrics_port() -> int:
    """The port Ray exports metrics on: SERVE_APP_METRICS_PORT, or DEFAULT_METRICS_PORT."""
    value = os.environ.get(METRICS_PORT_VAR, str(DEFAULT_METRICS_PORT))
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ConfigError(f"{METRICS_PORT_VAR}={value!r} is not a TCP port; set 1 to 65535")
    return int(value)


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
    """The CUDA GPUs this process may use. Read through NVML (``devices.visible_cuda_devices``),
    not torch: ``serve-app run`` decides this before Ray starts, and importing torch takes
    seconds (benchmarks/results/startup/import_probe_h200_*.json). Where NVML cannot be read
    (no NVIDIA driver), torch answers."""
    from serve_app.gpu import devices, nvml

    count = devices.visible_cuda_devices(env.get("CUDA_VISIBLE_DEVICES"))
    if not isinstance(count, nvml.NvmlError):
        return count
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpu_fallback(doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """With no GPU, drop every deployment's GPU request so it runs on the CPU (said, not silent)."""
    doc = copy.deepcopy(doc)
    notes = []
    for d in deployments(doc):
        opts = d.actor_options
        if opts.get("num_gpus"):
            notes.append(
                f"no GPU: deployment {d.name} asks for "
                f"num_gpus={opts['num_gpus']}; running it on the CPU instead"
            )
            opts["num_gpus"] = 0
    return doc, notes


def http_address(doc: dict[str, Any]) -> tuple[str, int]:
    opts = doc.get("http_options") or {}
    return str(opts.get("host", DEFAULT_HOST)), int(opts.get("port", DEFAULT_PORT))


def start_ray(
    num_gpus: int,
    haproxy: bool,
    num_cpus: int | None = None,
    request_timeout_s: float | None = None,
    system_config: Mapping[str, object] | None = None,
    auth: ray_auth.RayAuth | None = None,
) -> ray_auth.RayAuth:
    """A local Ray with every port on 127.0.0.1 and token authentication on. Env vars are set
    first so that Serve's controller and proxy processes inherit them. ``request_timeout_s``:
    the longest of the apps to be deployed (default: AppArgs' default), for HAProxy's server
    timeout. ``system_config``: Ray's own settings for the cluster (warmpool.system_config: the
    modules every worker imports as it starts). ``auth``: ray_auth.setup_token_auth's answer
    when the caller already set it up (``serve-app run`` does, to fail before anything starts);
    returned, set up here otherwise."""
    import ray

    if auth is None:
        auth = ray_auth.setup_token_auth(os.environ)
    ray_compat.reread_auth_mode()  # Ray read RAY_AUTH_MODE when it was imported, maybe before
    # Ray would swap 127.0.0.1 for the routable IP and bind its agents there (issue 25).
    ray_compat.keep_node_on_loopback()
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
    metrics_at = metrics_port()
    if not port_is_free(DEFAULT_HOST, metrics_at):
        raise StartupError(
            f"the metrics port {DEFAULT_HOST}:{metrics_at} is taken (another server's?); "
            f"set {METRICS_PORT_VAR} to a free port"
        )
    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=False,
        _node_ip_address=DEFAULT_HOST,
        namespace="serve_app",
        log_to_driver=True,
        _system_config=dict(system_config) if system_config else None,
        _metrics_export_port=metrics_at,
    )
    return auth


def deploy(doc: dict[str, Any]) -> list[str]:
    """Deploy a whole Serve config (what ``serve deploy`` does, without the dashboard), and
    return once Serve's proxies are up, with a note for the user when one had to be replaced.

    On a cluster without Serve, this starts Serve's controller as ``serve.start`` does, but
    sends the deploy before it waits for the proxies (Serve's own start waits first): the
    application's build and its replicas then start while the proxies do, which took seconds
    off every cold start. A proxy that does not come up is a StartupError; one that dies is
    not: Serve replaces a proxy that misses three readiness checks of 5 s (as four applications
    starting on two cores made it), and gives the next one longer.
    """
    import ray
    from ray.exceptions import RayActorError
    from ray.serve.schema import ServeDeploySchema

    proxies = ray_compat.deploy_config(ServeDeploySchema.model_validate(doc))
    if not proxies:
        return []
    timeout_s = ray_compat.proxy_start_timeout_s()
    try:
        ray.get(proxies, timeout=timeout_s)
        return []
    except RayActorError:
        pass  # replaced by Serve's controller: wait for its status below
    except Exception as exc:  # noqa: BLE001 - a timeout or the proxy actor's own error
        raise StartupError(
            f"Serve's proxies did not come up within {timeout_s:g} s "
            f"({type(exc).__name__}: {str(exc)[:300]}); see the proxy logs under "
            "/tmp/ray/session_latest/logs/serve/"
        ) from None
    wait_proxies(ray_compat.proxy_statuses, PROXY_RESTART_WAIT_S)
    return [
        "Serve replaced a proxy that missed its readiness checks while the host was busy "
        "starting; its replacement is up (RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S gives each "
        "check longer)."
    ]


def start_registry() -> None:
    """Serve_app's registry actor, before any replica: its worker's start and imports then end
    before serving does, not on a replica's first ``/readyz`` (which waits up to 5 s for it)."""
    from serve_app.serving.registry import get_registry

    get_registry()


def start_serve(port: int) -> None:
    """Serve on 127.0.0.1:``port``, its proxy on the head node, then the registry, for callers
    that deploy by Ray Serve's API rather than by ``deploy`` (the test and benchmark clusters)."""
    from ray import serve

    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    start_registry()


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


def run(
    doc: dict[str, Any],
    *,
    haproxy: bool = True,
    ready_timeout_s: float = 300.0,
    insecure_no_ray_auth: bool = False,
    say: Callable[[str], None] | None = None,
) -> Deployment:
    """Validate (this host's GPUs and cores too), start Ray, deploy and wait; ConfigError or
    StartupError. ``insecure_no_ray_auth``: Ray without token auth (ray_auth.INSECURE_FLAG).
    ``say``: where the device used is said at once, before Ray's start-up logs (else a note)."""
    gpus = gpu_count()  # unpinned shares must fit on them (one on the CPU, which drops them)
    errors = check_deploy_config(doc, gpus=max(gpus, 1))
    cores = cores_error(doc, ray_compat.node_cpus())  # this host's cores
    if cores:
        errors.append(cores)
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
    if gpus == 0:
        doc, fallback = cpu_fallback(doc)
        notes = ["No CUDA GPU found: serving on the CPU.", *fallback]
    else:
        notes = [f"Serving on {gpus} GPU(s)."]
    if say is not None:  # said now, so not again at the end
        for line in notes:
            say(line)
        notes = []
    host, port = http_address(doc)
    doc.setdefault("http_options", {}).update({"host": host, "port": port})
    # Read here too: a key variable that yields no key, or a bad file, fails before Ray starts.
    keys = env.api_keys()
    auth = ray_auth.setup_token_auth(os.environ, insecure=insecure_no_ray_auth)
    notes.append(auth.note)
    early_warning = exposure_warning(host, bool(keys))
    warnings = [early_warning] if early_warning else []
    if early_warning:
        logger.warning(early_warning)  # now, before the minutes of start-up, and again at the end
    elif keys:
        notes.append(
            f"API keys: {len(keys)} configured; inference, /v1/models and /v1/memory need one."
        )
    for extra in (env.api_keys_file_warning(), doubles_warning(doc)):
        if extra:
            logger.warning(extra)
            warnings.append(extra)
    if not port_is_free(host, port):
        # An HAProxy left by a killed run of ours is stopped (its pid file names it); any
        # other holder is a StartupError saying who, where it can tell.
        notes.append(free_stale_port(host, port))
    mps_note = start_mps_if_needed(doc, gpus)
    if mps_note:
        notes.append(mps_note)
    if haproxy:
        use_private_files()  # a fresh 0700 directory; shutdown removes it
    start_ray(
        gpus,
        haproxy,
        request_timeout_s=longest_request_timeout_s(doc),
        system_config=warmpool.system_config(*warmpool.app_settings(doc)),
        auth=auth,
    )
    start_registry()
    notes.extend(deploy(doc))
    notes.append(
        f"Metrics (Prometheus): http://{DEFAULT_HOST}:{metrics_port()}/metrics "
        f"({METRICS_PORT_VAR} moves it; docs/metrics.md)."
    )
    url = f"http://{host}:{port}"
    wait_ready(url, ready_timeout_s)
    # Once the replicas run: what Ray (and HAProxy) placed beyond loopback, said with the rest.
    exposed = ray_listeners_beyond_loopback(port)
    warning = exposure_warning(
        host, bool(keys), ray_auth_enabled=auth.enabled, ray_listeners=exposed
    )
    # The full exposure warning replaces the early one (HTTP only); the others stay.
    warnings = ([warning] if warning else []) + [w for w in warnings if w != early_warning]
    note = ray_exposure_note(exposed) if auth.enabled else None
    if note:
        notes.append(note)
    warnings.extend(auth.warnings)
    return Deployment(url=url, notes=notes, haproxy=haproxy, warnings=warnings)


def shutdown() -> None:
    """Stop Serve and Ray, then any HAProxy that Serve started and Ray left behind."""
    import psutil
    import ray
    from ray import serve

    before: set[int] = set()
    session = ray_compat.session_dir() if ray.is_initialized() else None
    haproxy_dir: Path | None = None
    if session is not None:
        before = set(haproxy_pids(session))
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
    for own in own_haproxies():  # this run's, had the session not named it
        if own.owner_pid == os.getpid():
            stop_own_haproxy(own)
    release_private_files()
    global _mps_daemon
    mps.stop_daemon(_mps_daemon)  # after Ray: its replicas were the daemon's clients
    _mps_daemon = None
