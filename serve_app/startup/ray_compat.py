"""Every private Ray API that serve_app uses, behind one module.

Read from Ray 2.60.0 (``RAY_VERSION``; pyproject.toml pins it). Each name below says which Ray
source it depends on. On a Ray upgrade, re-read those sources, run
tests/unit/startup/test_ray_compat.py (it checks the copied values and the template against
the installed Ray) and the integration tests each function names.

Nothing here imports Ray when this module is imported: each function imports what it needs,
so ``serve-app check`` and the planner's unit tests stay free of Ray's import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from contextvars import ContextVar

    from ray import ObjectRef
    from ray.serve.schema import ServeDeploySchema

__all__ = [
    "CONTROL_LOOP_INTERVAL_S",
    "DEFAULT_LOOK_BACK_PERIOD_S",
    "DEFAULT_METRICS_INTERVAL_S",
    "HAPROXY_RETRY_ON_VAR",
    "LOOPBACK_NODE_VAR",
    "METRIC_RECORD_INTERVAL_FACTOR",
    "RAY_VERSION",
    "SERVE_REPLICA_MODULE",
    "deploy_config",
    "haproxy_server_key",
    "haproxy_retry_on_with_lines",
    "keep_node_on_loopback",
    "metrics_export_port",
    "prestart_request",
    "prestart_workers",
    "proxy_start_timeout_s",
    "raylet_address",
    "reread_auth_mode",
    "serve_details",
    "serve_echoes_request_id",
    "serve_request_context",
    "session_dir",
]

RAY_VERSION = "2.60.0"

# Ray Serve's replica implementation, which every replica imports: a warm worker preloads it.
# Source: ray/serve/_private/replica.py (the module Serve's replica actor class lives in).
SERVE_REPLICA_MODULE = "ray.serve._private.replica"

# Serve's autoscaling timing, copied (the policy and `serve-app check` use them without
# importing Ray). Sources: ray/serve/config.py (AutoscalingConfig.metrics_interval_s and
# look_back_period_s defaults); ray/serve/_private/constants.py
# (RAY_SERVE_AUTOSCALING_METRIC_RECORD_INTERVAL_FACTOR, CONTROL_LOOP_INTERVAL_S). A replica
# records a metrics point every min(look_back_period_s x factor, metrics_interval_s), pushes
# its points every metrics_interval_s, and the controller runs each policy once per loop.
DEFAULT_METRICS_INTERVAL_S = 10.0
DEFAULT_LOOK_BACK_PERIOD_S = 30.0
METRIC_RECORD_INTERVAL_FACTOR = 0.2
CONTROL_LOOP_INTERVAL_S = 0.1

HAPROXY_RETRY_ON_VAR = "RAY_SERVE_HAPROXY_RETRY_ON"


def _haproxy_safe_name(name: str) -> str:
    import re

    name = name.replace("#", "-").replace("/", ".")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def haproxy_server_key(app_name: str, replica_actor_name: str) -> str:
    """How HAProxy's ``show stat`` names an HTTP application's replica (``backend/server``):
    Serve names the backend ``http-<app>`` and the server after the replica's actor name,
    both through one rule. Source: ray/serve/_private/haproxy.py (HAProxyManager.get_safe_name,
    _generate_backend_name, _generate_server_name)."""
    backend = _haproxy_safe_name(f"http-{app_name}")
    return f"{backend}/{_haproxy_safe_name(replica_actor_name)}"


# "0" keeps a single-node Ray's node IP on 127.0.0.1: ray.init swaps a loopback
# _node_ip_address for the routable IP (ray/_private/services.py: resolve_ip_for_localhost ->
# get_node_ip_address) unless this is off (ray/_private/ray_constants.py: ENABLE_RAY_CLUSTER,
# read when Ray is imported), and the GCS, raylet, workers and agents bind the node IP's
# interfaces (ray/dashboard/agent.py, http_server_agent.py). It also makes `ray start --address`
# refuse to join (ray/scripts/scripts.py), so only a one-node cluster may set it.
LOOPBACK_NODE_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def keep_node_on_loopback() -> None:
    """Make a single-node Ray started by this process keep every listener on 127.0.0.1: the
    variable for Ray's processes, and Ray's constant for this one (read when Ray was imported,
    perhaps before)."""
    import os

    from ray._private import ray_constants

    os.environ[LOOPBACK_NODE_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def reread_auth_mode() -> None:
    """Make this process see the ``RAY_AUTH_MODE`` its environment has now, before it starts
    Ray. Ray's C++ config reads it once, when Ray is imported; Ray refreshes it the same way
    when it turns token auth on itself (ray/_private/authentication/
    authentication_token_setup.py: _enable_token_auth). Nothing to do when the mode seen is
    already the environment's (re-reading resets the whole config, so not while connected)."""
    import os

    import ray
    from ray._raylet import (  # type: ignore[attr-defined]
        AuthenticationMode,
        Config,
        get_authentication_mode,
    )

    token = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    if (get_authentication_mode() == AuthenticationMode.TOKEN) == token:
        return
    if ray.is_initialized():
        raise RuntimeError("RAY_AUTH_MODE changed while this process is connected to Ray")
    Config.initialize("")


def serve_request_context() -> tuple[ContextVar[Any], type[Any]]:
    """Serve's per-request context variable and its dataclass (``request_id``, ``route``,
    ``app_name``, ...). Serve's log filter stamps each record of the ``ray.serve`` logger with
    the ``request_id`` it holds (ray/serve/_private/logging_utils.py: ServeContextFilter);
    direct ingress sets it from the ``x-request-id`` header as sent, or a new uuid4
    (ray/serve/_private/replica.py: the direct-ingress ``request_id``). Source:
    ray/serve/context.py (``_serve_request_context``, ``_RequestContext``). Checked by
    tests/integration/test_request_ids.py."""
    from ray.serve import context

    return context._serve_request_context, context._RequestContext


# Serve wraps every HTTP server it runs (the proxy's, and each replica's under direct ingress) in
# its RequestIdMiddleware, which gives the app a ``send`` that appends ``X-Request-ID`` with the
# id the request came with, as sent (ray/serve/_private/http_util.py: RequestIdMiddleware,
# _apply_middlewares; start_asgi_http_server applies it). Direct ingress hands the app its own
# ``send`` around that one (ray/serve/_private/replica.py: send_user_message, a closure over
# ``send``).
SERVE_ECHO_SEND = "RequestIdMiddleware.__call__.<locals>.send_with_request_id"
SEND_WRAPS_MAX = 4


def serve_echoes_request_id(send: Any, request_id: str) -> bool:
    """Find Serve's RequestIdMiddleware ``send`` behind ``send`` (through closures over a
    ``send``) and make it append ``request_id`` (its closure's ``request_id``), so that a
    replaced id is what the client sees and a bad one is never echoed. False when there is
    none within reach. Checked by tests/unit/serving/test_requestid.py on Serve's middleware
    and by tests/integration/test_request_ids.py on a replica's server."""
    fn = send
    for _ in range(SEND_WRAPS_MAX):
        code = getattr(fn, "__code__", None)
        if code is None or not fn.__closure__:
            return False
        if fn.__qualname__ == SERVE_ECHO_SEND:
            cell = fn.__closure__[code.co_freevars.index("request_id")]
            if cell.cell_contents != request_id:
                cell.cell_contents = request_id
            return True
        if "send" not in code.co_freevars:
            return False
        fn = fn.__closure__[code.co_freevars.index("send")].cell_contents
    return False


def haproxy_retry_on_with_lines(retry_on: str, *lines: str) -> str:
    """A value for ``RAY_SERVE_HAPROXY_RETRY_ON`` that also adds ``lines`` (such as
    ``option http-buffer-request``) to the ``defaults`` section of Serve's HAProxy config.

    Ray has no setting for those lines, but renders the variable verbatim after ``retry-on`` in
    that section (ray/serve/_private/haproxy_templates.py: ``retry-on {{ config.retry_on }}``;
    ray/serve/_private/constants.py reads the variable), so each line rides on the value after
    a newline, indented as the section is. Checked against Ray's template in
    tests/unit/startup/test_ray_compat.py and on a real HAProxy in
    tests/integration/test_reliability.py.
    """
    return "".join([retry_on, *(f"\n    {line}" for line in lines)])


class _RayNode(Protocol):
    """The parts of ``ray._private.node.Node`` used here (ray/_private/node.py)."""

    @property
    def node_ip_address(self) -> str: ...

    @property
    def node_manager_port(self) -> int: ...

    @property
    def metrics_export_port(self) -> int: ...

    def get_session_dir_path(self) -> str: ...


def _node() -> _RayNode | None:
    """This process's Ray node, or None when it is not connected.
    Source: ray/_private/worker.py (``global_worker.node``, set by ``connect``)."""
    import ray

    node: _RayNode | None = ray._private.worker.global_worker.node
    return node


def session_dir() -> str | None:
    """This Ray session's directory (``/tmp/ray/session_...``), or None when not connected.
    Ray's public runtime context does not name it; the node object does."""
    node = _node()
    return None if node is None else node.get_session_dir_path()


def metrics_export_port() -> int | None:
    """The port this node's Ray metrics agent exports Prometheus metrics on, or None when
    not connected (ray/_private/node.py: ``Node.metrics_export_port``)."""
    node = _node()
    return None if node is None else int(node.metrics_export_port)


def raylet_address() -> str:
    """``host:port`` of this node's raylet gRPC server.

    Raises:
        RuntimeError: not connected to Ray.
    """
    node = _node()
    if node is None:
        raise RuntimeError("not connected to Ray")
    return f"{node.node_ip_address}:{node.node_manager_port}"


def prestart_request(count: int, runtime_env: str, job_id: str, keep_alive_s: int) -> Any:
    """The raylet's ``PrestartWorkersRequest`` for ``count`` Python workers (a generated
    protobuf message: no type stubs). Source: src/ray/protobuf/node_manager.proto as generated
    into ray/core/generated/node_manager_pb2.py."""
    from ray.core.generated import common_pb2, node_manager_pb2

    request = node_manager_pb2.PrestartWorkersRequest(  # type: ignore[attr-defined]
        language=common_pb2.PYTHON,  # type: ignore[attr-defined]
        keep_alive_duration_secs=keep_alive_s,
        num_workers=count,
    )
    if job_id:
        request.job_id = bytes.fromhex(job_id)
    if runtime_env not in ("", "{}"):
        request.runtime_env_info.serialized_runtime_env = runtime_env
    return request


def prestart_workers(
    count: int, runtime_env: str, job_id: str, keep_alive_s: int, timeout_s: float
) -> None:
    """Ask this node's raylet for ``count`` idle Python workers with ``runtime_env`` (a
    serialized runtime environment) in the job ``job_id`` (hex; "" for none), kept alive
    ``keep_alive_s`` against idle-worker reaping: the call Ray's own worker prestart makes.
    Sources: ray/core/generated/node_manager_pb2_grpc.py (``NodeManagerServiceStub``
    ``.PrestartWorkers``), ray/_private/grpc_utils.py (``init_grpc_channel``: TLS and auth as
    Ray configures them). On a cluster: tests/integration/test_warm_workers.py.

    Raises:
        RuntimeError: not connected to Ray.
        grpc.RpcError: the raylet refused or did not answer.
    """
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import node_manager_pb2_grpc

    channel = init_grpc_channel(raylet_address())
    try:
        stub = node_manager_pb2_grpc.NodeManagerServiceStub(channel)
        stub.PrestartWorkers(
            prestart_request(count, runtime_env, job_id, keep_alive_s), timeout=timeout_s
        )
    finally:
        channel.close()


def proxy_start_timeout_s() -> float:
    """How long ``serve.start`` waits for Serve's proxies
    (ray/serve/_private/constants.py: ``HTTP_PROXY_TIMEOUT``)."""
    from ray.serve._private.constants import HTTP_PROXY_TIMEOUT

    return float(HTTP_PROXY_TIMEOUT)


def deploy_config(config: ServeDeploySchema) -> list[ObjectRef[Any]]:
    """Send a whole Serve config to the controller, starting the controller first if none
    runs, as ``serve.start`` would but without waiting for the proxies first (the caller waits
    on the returned proxy readiness refs; empty when Serve was running already).

    Sources: ray/serve/_private/api.py (``_create_controller_and_proxy_refs``,
    ``_coerce_controller_options``: what ``serve.start`` runs), ray/serve/_private/client.py
    (``ServeControllerClient.deploy_apps``), ray/serve/context.py (``_get_global_client``,
    ``_set_global_client``). On a cluster: every integration test (tests/integration/conftest.py).
    """
    from ray.serve._private import api as serve_api
    from ray.serve._private.client import ServeControllerClient
    from ray.serve.context import _get_global_client, _set_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    proxies: list[ObjectRef[Any]] = []
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
    return proxies


def node_cpus() -> float:
    """The CPU cores Ray gives a node it starts here (its cgroup's share in a container):
    ray/_private/utils.py ``get_num_cpus``, what ``ray.init`` uses without ``num_cpus``."""
    from ray._private.utils import get_num_cpus

    return float(get_num_cpus())


def proxy_statuses() -> dict[str, str]:
    """Serve's proxies by node id, each with its status (``STARTING``, ``HEALTHY``,
    ``UNHEALTHY``, ...), from the instance details (ray/serve/schema.py: ``ProxyDetails``)."""
    proxies = serve_details().get("proxies") or {}
    return {
        str(node): str(getattr(p["status"], "value", p["status"])) for node, p in proxies.items()
    }


def serve_details() -> dict[str, Any]:
    """Serve's instance details from its controller, as ``serve.status()`` reads them but
    without rebuilding its pydantic models; {} when no controller runs (blocking).
    Sources: ray/serve/context.py (``_get_global_client``), ray/serve/_private/client.py
    (``ServeControllerClient.get_serve_details``)."""
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:
        return {}
    details: dict[str, Any] = client.get_serve_details()
    return details
