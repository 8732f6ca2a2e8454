"""/readyz and an application's first roll-out, on the shared cluster with real Ray and HTTP.

The application asks for two replicas of which the cluster can place only one (each wants
0.6 of its CPUs): the placed one serves requests, but /readyz stays 503 and names the first
roll-out. Once every replica it asks for has run (here after a redeploy to one), it is
settled: asked for two again, with one left pending, it is ready and degraded, not unready.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.helpers import wait_for, wait_http
from tests.integration.conftest import LOGICAL_CPUS

NAME = "rollout"
PREFIX = "/rollout"
ARGS = {"adapter": "embeddings", "max_batch_size": 8, "batch_wait_timeout_s": 0.0}
CPUS_PER_REPLICA = LOGICAL_CPUS * 0.6  # one fits the cluster, two never do
TIMEOUT_S = 180.0


def deploy(replicas: int, wait_running: bool) -> None:
    from ray import serve

    from serve_app.config.args import parse_args
    from serve_app.serving.replica import ModelServer

    options: dict[str, Any] = {
        "num_replicas": replicas,
        "ray_actor_options": {"num_cpus": CPUS_PER_REPLICA},
    }
    bound = ModelServer.options(**options).bind(parse_args(ARGS).model_dump())
    serve.run_many(
        [serve.RunTarget(bound, name=NAME, route_prefix=PREFIX)],
        wait_for_applications_running=wait_running,
    )


def readyz(base: str) -> tuple[int, dict[str, Any]]:
    try:
        resp = httpx.get(f"{base}/readyz", timeout=10.0)
    except httpx.HTTPError as exc:
        return 0, {"error": repr(exc)}
    return resp.status_code, resp.json()


def test_not_ready_until_the_first_roll_out_is_done_then_degraded_is_still_ready(
    cluster,
) -> None:
    base = cluster.url(PREFIX, "")
    cluster.wait_deleted(NAME)
    deploy(2, wait_running=False)
    try:
        wait_http(f"{base}/healthz", TIMEOUT_S)  # the replica that could be placed runs
        resp = httpx.post(f"{base}/v1/embeddings", json={"input": "served"}, timeout=60.0)
        assert resp.status_code == 200, resp.text
        first = f"{NAME} is in its first roll-out ({NAME}/model 1 of 2 running)"
        status, body = wait_for(
            "/readyz to name the first roll-out",
            lambda: readyz(base),
            lambda sb: first in str(sb[1].get("reason")),
            60.0,
        )
        assert status == 503 and body["ready"] is False, body
        assert f"{NAME}/model" in body["degraded"]

        deploy(1, wait_running=True)  # every replica asked for now runs: settled
        wait_for("/readyz 200", lambda: readyz(base), lambda sb: sb[0] == 200, 60.0)

        deploy(2, wait_running=False)  # one short again, after the first roll-out
        status, body = wait_for(
            "/readyz to list the deployment degraded",
            lambda: readyz(base),
            lambda sb: sb[0] == 200 and f"{NAME}/model" in sb[1].get("degraded", []),
            60.0,
        )
        assert body["ready"] is True and "first roll-out" not in body["reason"], body
    finally:
        cluster.delete(NAME)
