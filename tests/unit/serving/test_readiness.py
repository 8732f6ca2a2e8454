"""serving.readiness: ready once each application's first roll-out is done and while every
deployment has a RUNNING replica; degraded listed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from serve_app.serving.readiness import (
    NOT_READY_MAX_AGE_S,
    STALE_READY_S,
    CachedReadiness,
    Readiness,
    SettledApps,
    decide,
    full_now,
    routing_gaps,
)


def dep(status: str, target: int, *states: str) -> dict[str, Any]:
    """One deployment in the shape of Serve's instance details."""
    return {
        "status": status,
        "target_num_replicas": target,
        "replicas": [{"state": s, "replica_id": f"r{i}"} for i, s in enumerate(states)],
    }


def details(**apps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "applications": {
            name: {"status": "RUNNING", "deployments": deps} for name, deps in apps.items()
        }
    }


def test_nothing_deployed_is_not_ready() -> None:
    for empty in ({}, {"applications": {}}):
        state = decide(empty)
        assert (state.ready, state.reason) == (False, "no application is deployed")
        assert state.to_json() == {
            "ready": False,
            "reason": "no application is deployed",
            "degraded": [],
        }


def test_all_replicas_running_is_ready_and_not_degraded() -> None:
    state = decide(details(emb={"model": dep("HEALTHY", 2, "RUNNING", "RUNNING")}))
    assert state.ready is True
    assert state.reason == "every deployment runs its target replicas"
    assert state.to_json() == {
        "ready": True,
        "reason": "every deployment runs its target replicas",
        "degraded": [],
    }


def test_one_dead_replica_of_four_is_still_ready_but_degraded() -> None:
    four = dep("UNHEALTHY", 4, "RUNNING", "RUNNING", "RUNNING", "STARTING")
    state = decide(details(emb={"model": four}))
    assert state.ready is True
    assert state.reason == "every deployment has a RUNNING replica; 1 degraded"
    body = state.to_json(verbose=True)
    assert body["degraded"] == ["emb/model"]
    assert body["deployments"] == [
        {
            "app": "emb",
            "deployment": "model",
            "status": "UNHEALTHY",
            "running": 3,
            "target": 4,
            "replica_states": {"RUNNING": 3, "STARTING": 1},
            "reasons": ["3 of 4 replicas running", "status UNHEALTHY"],
            "degraded": True,
        }
    ]


def test_a_deployment_with_no_running_replica_makes_it_unready() -> None:
    state = decide(
        details(
            emb={"model": dep("HEALTHY", 1, "RUNNING")},
            images={"model": dep("UPDATING", 1, "STARTING")},
        )
    )
    assert state.ready is False
    assert state.reason == "images/model has no RUNNING replica"
    assert state.to_json()["degraded"] == ["images/model"]


def test_updating_counts_as_degraded_even_at_target() -> None:
    state = decide(details(emb={"model": dep("UPDATING", 1, "RUNNING", "STOPPING")}))
    assert state.ready is True
    assert [d.reasons for d in state.degraded] == [["status UPDATING"]]


def test_an_application_without_deployments_yet_is_not_ready() -> None:
    raw = {"applications": {"emb": {"status": "DEPLOYING", "deployments": {}}}}
    state = decide(raw)
    assert (state.ready, state.reason) == (False, "emb has no deployment yet (DEPLOYING)")


def test_scaled_to_zero_target_with_no_replica_is_not_ready() -> None:
    # Nothing can answer, whatever the target says.
    state = decide(details(emb={"model": dep("HEALTHY", 0)}))
    assert state.ready is False and state.degraded == []


def test_enum_values_are_read_as_their_strings() -> None:
    from ray.serve._private.common import DeploymentStatus, ReplicaState

    raw = details(
        emb={
            "model": {
                "status": DeploymentStatus.HEALTHY,
                "target_num_replicas": 1,
                "replicas": [{"state": ReplicaState.RUNNING}],
            }
        }
    )
    state = decide(raw)
    assert state.ready is True
    assert state.deployments[0].status == "HEALTHY"
    assert state.deployments[0].replica_states == {"RUNNING": 1}


def test_an_application_in_its_first_roll_out_is_not_ready_until_every_replica_runs() -> None:
    starting = details(emb={"model": dep("UPDATING", 4, "RUNNING", "RUNNING", "STARTING")})
    state = decide(starting, settled=set())
    assert state.ready is False
    assert state.reason == "emb is in its first roll-out (emb/model 2 of 4 running)"
    assert state.to_json()["degraded"] == ["emb/model"]
    # Once every replica ran, it is settled: a replica lost later leaves it ready, degraded.
    assert decide(starting, settled={"emb"}).ready is True
    full = details(emb={"model": dep("HEALTHY", 4, *["RUNNING"] * 4)})
    assert full_now(full) == {"emb"} and decide(full, settled=set()).ready is True
    # Without the settled set (None) the first roll-out is not part of the decision.
    assert decide(starting).ready is True


def test_full_now_needs_every_deployment_at_its_target_and_one_replica_at_least() -> None:
    raw = details(
        rag={"embed": dep("HEALTHY", 1, "RUNNING"), "rerank": dep("UPDATING", 2, "RUNNING")},
        cls={"model": dep("HEALTHY", 0)},
        emb={"model": dep("HEALTHY", 2, "RUNNING", "RUNNING", "STOPPING")},
    )
    assert full_now(raw) == {"emb"}
    state = decide(raw, settled={"cls"})
    assert state.reason == (
        "cls/model has no RUNNING replica; rag is in its first roll-out "
        "(rag/embed 1 of 1 running, rag/rerank 1 of 2 running)"
    )


def registry() -> Any:
    """The registry actor's own class, outside Ray: its ``settle`` is the one replicas call."""
    from serve_app.serving.registry import Registry

    return Registry.__ray_actor_class__()


def test_settled_apps_ask_the_registry_only_about_what_they_have_not_seen_settle() -> None:
    actor = registry()
    actor.settle(["old"])
    asked: list[list[str]] = []

    def settle(new: list[str], deployed: list[str], read_at_s: float) -> list[str]:
        asked.append(new)
        return actor.settle(new, deployed, read_at_s)  # type: ignore[no-any-return]

    apps = SettledApps(settle)
    # A replica started after "old" settled learns it from the registry (a replacement).
    assert apps.update(["old", "emb"], full=[]) == {"old"}
    assert apps.update(["old", "emb"], full=["emb"]) == {"old", "emb"}
    assert actor.settle([]) == ["emb", "old"] and asked == [[], ["emb"]]
    # Everything deployed is known: no more calls, whatever runs now.
    assert apps.update(["old", "emb"], full=[]) == {"old", "emb"}
    assert len(asked) == 2


def test_a_deleted_application_is_forgotten_and_its_next_deployment_rolls_out_anew() -> None:
    actor = registry()
    apps = SettledApps(actor.settle)
    assert apps.update(["emb"], full=["emb"]) == {"emb"}
    # Deleted: Serve no longer lists it, so the registry and this replica forget it; deployed
    # again under the same name, it is not settled until every replica runs again.
    assert apps.update([], full=[]) == set() and actor.settle([]) == []
    assert apps.update(["emb"], full=[]) == set()
    assert apps.update(["emb"], full=["emb"]) == {"emb"}


def test_a_stale_list_does_not_forget_an_application_that_settled_after_it() -> None:
    actor = registry()
    before = time.time() - 1.0  # a list read before "img" was deployed
    actor.settle(["img"])
    assert actor.settle([], ["emb"], before) == ["img"]
    assert actor.settle([], ["emb"], time.time() + 1.0) == []


def test_settled_apps_keep_what_they_saw_when_the_registry_fails(caplog) -> None:
    def settle(new: list[str], deployed: list[str], read_at_s: float) -> list[str]:
        raise TimeoutError("registry gone")

    apps = SettledApps(settle)
    assert apps.update(["emb", "img"], full=["emb"]) == {"emb"}
    assert "the registry did not answer (TimeoutError: registry gone)" in caplog.text
    assert apps.update(["img"], full=[]) == set()  # and forget what was deleted


def routed_app(app: str, *states: str, ingress: str = "model") -> dict[str, Any]:
    """An application whose ingress deployment runs ``states``, each replica with the actor
    name Serve gives it, in Serve's instance-details shape."""
    replicas = [
        {"state": s, "replica_id": f"r{i}", "actor_name": f"SERVE_REPLICA::{app}#{ingress}#r{i}"}
        for i, s in enumerate(states)
    ]
    deps = {
        ingress: {"status": "HEALTHY", "target_num_replicas": len(states), "replicas": replicas}
    }
    return {
        "status": "RUNNING",
        "route_prefix": "/",
        "deployment_topology": {"ingress_deployment": ingress},
        "deployments": deps,
    }


def up(app: str, *replica_ids: str, status: str = "UP") -> dict[str, dict[str, str]]:
    """HAProxy's ``show stat`` rows for these replicas, named as Serve names them."""
    safe = app.replace(" ", "_")
    return {f"http-{safe}/SERVE_REPLICA_{safe}-model-{r}": {"status": status} for r in replica_ids}


def test_a_running_replica_haproxy_does_not_route_to_yet_is_a_routing_gap() -> None:
    raw = {"applications": {"emb app": routed_app("emb app", "RUNNING", "RUNNING", "STARTING")}}
    assert routing_gaps(raw, ["emb app"], up("emb app", "r0", "r1")) == {}
    # "UP 1/2" takes traffic; "DOWN 1/2" (checks passing, not up yet) and a missing one do not.
    assert routing_gaps(raw, ["emb app"], up("emb app", "r0", "r1", status="UP 1/2")) == {}
    want = {"emb app": "HAProxy routes to 1 of 2 running emb app/model"}
    assert routing_gaps(raw, ["emb app"], up("emb app", "r0")) == want
    assert (
        routing_gaps(
            raw, ["emb app"], {**up("emb app", "r0"), **up("emb app", "r1", status="DOWN 1/2")}
        )
        == want
    )
    # Only the applications asked about; one without an HTTP route has no backend to wait for.
    assert routing_gaps(raw, [], {}) == {}
    raw["applications"]["emb app"]["route_prefix"] = None
    assert routing_gaps(raw, ["emb app"], {}) == {}


def test_the_first_roll_out_ends_only_once_haproxy_routes_to_every_running_replica(
    monkeypatch,
) -> None:
    from serve_app.serving import readiness

    raw = {"applications": {"emb": routed_app("emb", "RUNNING", "RUNNING")}}
    monkeypatch.setattr(readiness, "serve_details", lambda: raw)
    views = [up("emb", "r0"), up("emb", "r0", "r1")]
    settled = SettledApps(lambda new, deployed, at: new)

    state = readiness.current(settled, read_servers=lambda: views[0])
    assert state.ready is False and settled.known == set()
    assert (
        state.reason == "emb is in its first roll-out (HAProxy routes to 1 of 2 running emb/model)"
    )
    assert readiness.current(settled, read_servers=lambda: views[1]).ready is True
    assert settled.known == {"emb"}

    # Settled: HAProxy is not read again, and a replica it drops later leaves it ready.
    def unread() -> dict[str, dict[str, str]]:
        raise AssertionError("HAProxy read after the first roll-out")

    assert readiness.current(settled, read_servers=unread).ready is True


def test_an_unanswering_haproxy_holds_the_first_roll_out_and_none_on_the_node_does_not(
    monkeypatch,
) -> None:
    from serve_app.serving import readiness

    raw = {"applications": {"emb": routed_app("emb", "RUNNING")}}
    monkeypatch.setattr(readiness, "serve_details", lambda: raw)

    def refused() -> dict[str, dict[str, str]]:
        raise ConnectionRefusedError("reloading")

    state = readiness.current(SettledApps(lambda new, deployed, at: new), read_servers=refused)
    assert state.ready is False
    assert state.reason == (
        "emb is in its first roll-out "
        "(HAProxy's admin socket did not answer: ConnectionRefusedError)"
    )
    # No HAProxy on this node (or none at all): RUNNING is all there is to wait for.
    assert readiness.current(
        SettledApps(lambda new, deployed, at: new), read_servers=lambda: None
    ).ready


def test_the_haproxy_view_is_none_without_haproxy_and_where_its_socket_is_missing(
    monkeypatch, tmp_path
) -> None:
    from serve_app import env
    from serve_app.serving import readiness

    monkeypatch.delenv(env.HA_PROXY_VAR, raising=False)
    assert readiness.haproxy_view() is None
    monkeypatch.setenv(env.HA_PROXY_VAR, "1")
    monkeypatch.setenv("RAY_SERVE_HAPROXY_SOCKET_PATH", str(tmp_path / "admin.sock"))
    import ray

    monkeypatch.setattr(
        ray, "get_runtime_context", lambda: type("C", (), {"get_node_id": lambda self: "n1"})()
    )
    assert readiness.haproxy_view() is None  # no socket: this node runs no HAProxy


def test_an_unreadable_status_is_not_ready(monkeypatch) -> None:
    from serve_app.serving import readiness

    def unreachable() -> dict[str, Any]:
        raise ConnectionError("controller gone")

    monkeypatch.setattr(readiness, "serve_details", unreachable)
    state = readiness.current()
    assert state.ready is False
    assert state.reason == "cannot read Serve's status: ConnectionError: controller gone"


@pytest.mark.anyio
async def test_readyz_burst_makes_one_controller_call_a_second() -> None:
    now = [100.0]
    gate = threading.Event()
    calls: list[float] = []

    def fetch() -> Readiness:  # a slow controller: every caller of a burst waits on one call
        calls.append(now[0])
        gate.wait(5)
        return decide(details(app={"model": dep("HEALTHY", 1, "RUNNING")}))

    cached = CachedReadiness(fetch, max_age_s=1.0, clock=lambda: now[0])
    burst = [asyncio.ensure_future(cached.get()) for _ in range(200)]
    await asyncio.sleep(0.05)
    gate.set()
    answers = await asyncio.gather(*burst)
    assert len(calls) == 1 and all(a.ready for a in answers)
    now[0] += 0.9  # within the second: the kept answer
    await asyncio.gather(*(cached.get() for _ in range(200)))
    assert len(calls) == 1
    now[0] += 0.2  # past it: one more call for the next burst (the kept answer meanwhile)
    await asyncio.gather(*(cached.get() for _ in range(200)))
    await wait_for_calls(lambda: len(calls) == 2)
    assert calls == pytest.approx([100.0, 101.1]) and cached.calls == 2


async def wait_for_calls(done: Callable[[], bool]) -> None:
    for _ in range(200):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the refresh never ran")


@pytest.mark.anyio
async def test_a_ready_answer_past_its_age_is_given_while_one_call_refreshes_it() -> None:
    now = [0.0]
    gate = threading.Event()
    answers = iter(
        [
            decide(details(app={"model": dep("HEALTHY", 1, "RUNNING")})),
            decide({}),  # the controller's next answer: not ready
            decide(details(app={"model": dep("HEALTHY", 1, "RUNNING")})),
        ]
    )

    def fetch() -> Readiness:
        if cached.calls > 1:
            gate.wait(5)  # a slow controller, from the second call on
        return next(answers)

    cached = CachedReadiness(fetch, clock=lambda: now[0])
    assert (await cached.get()).ready and cached.calls == 1
    now[0] = 5.0  # stale, under STALE_READY_S: answered at once, a refresh starts behind it
    assert (await asyncio.wait_for(cached.get(), 1.0)).ready and cached.calls == 2
    assert (await asyncio.wait_for(cached.get(), 1.0)).ready and cached.calls == 2  # one call
    gate.set()
    await wait_for_calls(lambda: cached._pending is None)
    assert not (await cached.get()).ready  # the refreshed answer, and never given stale
    now[0] = 5.0 + NOT_READY_MAX_AGE_S + 1.0
    gate.clear()
    late = asyncio.ensure_future(cached.get())  # not ready is not given stale: it waits
    await asyncio.sleep(0.05)
    assert not late.done()
    gate.set()
    assert (await late).ready and cached.calls == 3


@pytest.mark.anyio
async def test_a_ready_answer_too_old_waits_for_the_call() -> None:
    now = [0.0]
    gate = threading.Event()
    answers = iter([decide(details(app={"model": dep("HEALTHY", 1, "RUNNING")})), decide({})])

    def fetch() -> Readiness:
        if cached.calls > 1:
            gate.wait(5)
        return next(answers)

    cached = CachedReadiness(fetch, clock=lambda: now[0])
    assert (await cached.get()).ready
    now[0] = STALE_READY_S + 1.0  # a controller silent this long is not vouched for
    late = asyncio.ensure_future(cached.get())
    await asyncio.sleep(0.05)
    assert not late.done()
    gate.set()
    assert not (await late).ready


@pytest.mark.anyio
async def test_a_caller_that_goes_does_not_cancel_the_call_the_others_wait_on() -> None:
    gate = threading.Event()

    def fetch() -> Readiness:
        gate.wait(5)
        return decide({})

    cached = CachedReadiness(fetch)
    first = asyncio.ensure_future(cached.get())
    second = asyncio.ensure_future(cached.get())
    await asyncio.sleep(0.01)
    first.cancel()
    gate.set()
    assert (await second).reason == "no application is deployed"
    assert cached.calls == 1


@pytest.mark.anyio
async def test_not_ready_is_kept_only_a_tenth_of_a_second() -> None:
    now = [0.0]
    answers = iter([decide({}), decide(details(app={"model": dep("HEALTHY", 1, "RUNNING")}))])
    cached = CachedReadiness(lambda: next(answers), clock=lambda: now[0])
    assert not (await cached.get()).ready
    now[0] = 0.05
    assert not (await cached.get()).ready and cached.calls == 1
    now[0] = 0.15  # start-up is waiting: the next probe asks again
    assert (await cached.get()).ready and cached.calls == 2
    now[0] = 1.0
    assert (await cached.get()).ready and cached.calls == 2
