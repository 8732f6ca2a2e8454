"""The environment every Ray node serving serve_app needs: the HAProxy ingress, its retries,
health checks and server timeout, Serve's force stop of unhealthy replicas, and the replicas'
handlers on Serve's own event loop. ``serve-app run`` sets these before Ray starts; a cluster
started another way (``ray start``, KubeRay: deploy/kuberay/rayservice.yaml) sets them on every
node. Why each value: docs/reliability.md; how they were measured:
benchmarks/journal/2026-11-30-haproxy-retries-and-health-checks.md.
"""

from __future__ import annotations

import math
from typing import Any

from serve_app import env
from serve_app.startup import ray_compat

__all__ = [
    "FORCE_STOP_UNHEALTHY_VAR",
    "HAPROXY_BUFFER_REQUEST_OPTION",
    "HAPROXY_HEALTH_CHECK_DEFAULTS",
    "HAPROXY_RETRY_DEFAULTS",
    "HAPROXY_RETRY_ON",
    "SAME_THREAD_VAR",
    "TIMEOUT_SERVER_MARGIN_S",
    "TIMEOUT_SERVER_VAR",
    "cluster_env",
    "haproxy_timeout_server_s",
    "longest_request_timeout_s",
    "reliability_env",
]

# "0": the replica's handlers run on Serve's own event loop, not on a second loop in another
# thread. They never block their loop, so the second loop only added a cross-thread hop to every
# request: about 12% of a CPU replica's time per request (benchmarks/journal/
# 2026-11-29-side-by-side-and-cuda-graphs.md, "One event loop instead of two").
SAME_THREAD_VAR = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"

# Inference is idempotent, so a request whose replica died before answering is sent again, once,
# to another replica (Ray's template has `option redispatch 1`): `empty-response` is a replica
# killed mid-request, `response-timeout` a hung one (with TIMEOUT_SERVER_VAR). One retry, not 3:
# a request that kills its replica takes down at most two. 503s are our back-pressure: not retried.
HAPROXY_RETRY_ON = "conn-failure empty-response response-timeout"
# HAProxy replays only a request whose body it held whole when it first sent it, and httpx sends
# headers and body apart: this makes it wait for the body first. It holds one buffer (16 KiB in
# Ray), so larger bodies, most images, are never replayed. Ray has no setting for the option:
# it rides on the retry-on value (ray_compat.haproxy_retry_on_with_lines).
HAPROXY_BUFFER_REQUEST_OPTION = "option http-buffer-request"
# A client that sends its headers (or, with the option above, its first buffer of body) slowly
# holds one of HAProxy's connections (maxconn, 4096 in Ray) for `timeout client`: an hour in
# Ray. Past this HAProxy answers 408 and closes it. 10 s is the HAProxy manual's own example;
# idle keep-alive connections keep their own timeout (http_options.keep_alive_timeout_s).
HAPROXY_HTTP_REQUEST_TIMEOUT = "timeout http-request 10s"
HAPROXY_RETRY_DEFAULTS = {
    ray_compat.HAPROXY_RETRY_ON_VAR: ray_compat.haproxy_retry_on_with_lines(
        HAPROXY_RETRY_ON, HAPROXY_BUFFER_REQUEST_OPTION, HAPROXY_HTTP_REQUEST_TIMEOUT
    ),
    "RAY_SERVE_HAPROXY_RETRIES": "1",
}

# A hung replica (SIGSTOP, a wedged loop) leaves rotation after 3 x inter + fastinter at worst,
# since Ray sets no `timeout check`: 6.25 s with 2 s, against 15.25 s with Ray's 5 s. A working
# replica answers /-/healthz from its event loop in milliseconds, so 2 s marks none down.
HAPROXY_HEALTH_CHECK_DEFAULTS = {"RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER": "2s"}
# A replica that failed its health check is hung or has a poisoned CUDA context: Serve kills it
# at once instead of draining it for graceful_shutdown_timeout_s; HAProxy replays what it held.
FORCE_STOP_UNHEALTHY_VAR = "RAY_SERVE_FORCE_STOP_UNHEALTHY_REPLICAS"
# HAProxy gives up on a request held by a hung replica after `timeout server` (unset in Ray:
# forever) and replays it. A working replica answers within its request_timeout_s (its own 504
# at worst), so the timeout is that plus a margin: shorter would double slow work under load.
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


def cluster_env(request_timeout_s: float | None = None) -> dict[str, str]:
    """The variables every Ray node serving serve_app needs in its environment, as
    ``serve-app run`` sets them. ``request_timeout_s``: the longest of the apps (default:
    AppArgs' default)."""
    if request_timeout_s is None:
        request_timeout_s = longest_request_timeout_s({})
    return {
        env.HA_PROXY_VAR: "1",
        SAME_THREAD_VAR: "0",
        **reliability_env(request_timeout_s),
    }
