"""/readyz and an application's first roll-out, on the shared cluster with real Ray and HTTP.

The application asks for two replicas of which the cluster can place only one (each wants
0.6 of its CPUs): the placed one serves requests, but /readyz stays 503 and names the first
roll-out. Once every replica it asks for has run (here after a redeploy to one), it is
settled: asked for two again, with one left pending, it is ready and degraded, not unready.
And when both replicas fit, /readyz first answers 200 only once HAProxy routes to both: Serve
marks a replica RUNNING before HAProxy has it UP.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.helpers import wait_for, wait_http
from tests.integration.conftest import LOGICAL_CPUS

NAME = "rollout"
PREFIX = "/rollout"
# Its own name: the registry keeps "rollout" settled once the test above settled it (a deleted
# application is forgotten only when a replica sees it gone).
JOINED = "joined"
ARGS = {"adapter": "embeddings", "max_batch_size": 8, "batch_wait_timeout_s": 0.0}
CPUS_PER_REPLICA = LOGICAL_CPUS * 0.6  # one fits the cluster, two never do
TIMEOUT_S = 180.0


def deploy(
    replicas: int, wait_running: bool, cpus: float = CPUS_PER_REPLICA, name: str = NAME
) -> None:
    from ray import serve

    from serve_app.config.args import parse_args
    from serve_app.serving.replica import ModelServer

    options: dict[str, Any] = {
        "num_replicas": replicas,
        "ray_actor_options": {"num_cpus": cpus},
    }
    bound = ModelServer.options(**options).bind(parse_args(ARGS).model_dump())
    serve.run_many(
        [serve.RunTarget(bound, name=name, route_prefix=f"/{name}")],
        wait_for_applications_running=wait_running,
    )


def readyz(base: str) -> tuple[int, dict[str, Any]]:
    try:
        resp = httpx.get(f"{base}/readyz", timeout=10.0)
    except httpx.HTTPError as exc:
        return 0, {"error": repr(exc)}
    try:
        return resp.status_code, resp.json()
    except ValueError:  # before the route exists: HAProxy's or Serve's own page
        return resp.status_code, {"text": resp.text[:200]}


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


def test_the_first_200_comes_once_haproxy_routes_to_every_replica(cluster) -> None:
    """The second replica starts once the first serves (CPUs held until then), so that it joins
    HAProxy by a reload of its own, as the last replicas of a larger roll-out do."""
    import ray

    from serve_app.ops.haproxy import haproxy_servers
    from serve_app.startup import ray_compat

    base = cluster.url(f"/{JOINED}", "")
    cluster.wait_deleted(JOINED)
    cpus = 0.5
    holds = hold_all_but(1.5 * cpus)  # room for one replica, not two
    deploy(2, wait_running=False, cpus=cpus, name=JOINED)
    try:
        wait_for(
            "/readyz to name the first roll-out",
            lambda: readyz(base),
            lambda sb: "1 of 2 running" in str(sb[1].get("reason")),
            TIMEOUT_S,
        )
        for hold in holds:
            ray.kill(hold)
        status, body = wait_for(
            "/readyz 200", lambda: readyz(base), lambda sb: sb[0] == 200, TIMEOUT_S, 0.02
        )
        servers = haproxy_servers(ray.get_runtime_context().get_node_id())
        model = ray_compat.serve_details()["applications"][JOINED]["deployments"]["model"]
        names = [ray_compat.haproxy_server_key(JOINED, r["actor_name"]) for r in model["replicas"]]
        states = {name: (servers.get(name) or {}).get("status") for name in names}
        assert len(states) == 2 and all(str(s).startswith("UP") for s in states.values()), (
            states,
            body,
        )
    finally:
        for hold in holds:
            ray.kill(hold)
        cluster.delete(JOINED)


def hold_all_but(room: float) -> list[Any]:
    """Actors that hold every free CPU but ``room``. A deleted replica's CPUs can come back after
    free_cpus has seen them steady (a CI run then started both replicas at once), so the free
    CPUs are read again once the first holder has its share, and the rest taken too."""
    import ray

    holds: list[Any] = []
    for _ in range(5):
        excess = free_cpus() - room
        if excess < 0.01:
            return holds
        holds.append(ray.remote(num_cpus=0)(Holder).options(num_cpus=excess).remote())
        ray.get(holds[-1].ready.remote())
    raise AssertionError(f"free CPUs kept coming back: {free_cpus()} free, {room} wanted")


def free_cpus() -> float:
    """The cluster's free CPUs once they stop changing (a deleted replica's come back late)."""
    import ray

    seen = [ray.available_resources().get("CPU", 0.0)]
    while len(seen) < 150 and (len(seen) < 10 or len(set(seen[-10:])) > 1):
        time.sleep(0.2)
        seen.append(ray.available_resources().get("CPU", 0.0))
    return float(seen[-1])


class Holder:
    """Holds the CPUs it is given, so that a replica waits for them."""

    def ready(self) -> bool:
        return True
