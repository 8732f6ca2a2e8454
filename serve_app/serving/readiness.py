"""Readiness: can this Serve instance answer requests right now?

A pure decision over Serve's instance details (the dict that ``serve.status()`` is built from:
``applications -> deployments -> status, target_num_replicas, replicas[].state``), so it is
tested without a cluster; ``serve_details`` at the bottom is the one call that fetches them.

Ready means every application has finished its first roll-out (every deployment ran its target
replicas at once, at least once, and this node's HAProxy routed to each of the ingress
deployment's) and every deployment has at least one RUNNING replica now. The first roll-out is
waited for, as KubeRay waits for an application to be RUNNING, because until then the replicas
still starting share the GPU and the host with the ones serving (their graph capture,
calibration and imports) and HAProxy reloads as each joins: traffic sent then met p99s several
times the steady state's (docs/benchmarks.md, "The first seconds after /readyz"). Serve marks a
replica RUNNING about a second before HAProxy has it UP (its config is rewritten and reloaded
for each change), so RUNNING alone still let the first traffic go to fewer replicas than asked
for. After the first roll-out, a service that lost one replica of four still serves, so a load
balancer or Kubernetes must keep sending it traffic (Serve replaces the replica meanwhile).
Which applications have finished their first roll-out is kept cluster-wide by the registry
actor (``SettledApps``), so that a replica started later (a replacement, a scale-up) answers as
the others do. A deployment is *degraded* when it runs fewer replicas than its target, is
UNHEALTHY or DEPLOY_FAILED, or is UPDATING; degraded does not mean unready, and ``GET
/readyz?verbose=1`` lists it with its counts.

``/readyz`` is open to anyone who reaches the port (probes carry no key), so each replica
answers it from ``CachedReadiness``: at most one call to the Serve controller in flight, and
its answer reused for ``READYZ_MAX_AGE_S``, however many probes arrive.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

logger = logging.getLogger("serve_app")

RUNNING = "RUNNING"
HEALTHY = "HEALTHY"
# Deployment statuses that mark a deployment degraded whatever its replica counts say.
DEGRADED_STATUSES = frozenset({"UNHEALTHY", "DEPLOY_FAILED", "UPDATING"})


@dataclass(frozen=True)
class DeploymentHealth:
    """One deployment's replica counts and why it is degraded (empty when it is not)."""

    app: str
    deployment: str
    status: str
    running: int
    target: int
    replica_states: dict[str, int]
    reasons: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.app}/{self.deployment}"

    @property
    def degraded(self) -> bool:
        return bool(self.reasons)


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    deployments: list[DeploymentHealth]

    @property
    def degraded(self) -> list[DeploymentHealth]:
        return [d for d in self.deployments if d.degraded]

    def to_json(self, verbose: bool = False) -> dict[str, Any]:
        """The ``/readyz`` body: ``ready``, ``reason`` and the names of degraded deployments;
        ``verbose`` adds every deployment's status and counts."""
        body: dict[str, Any] = {
            "ready": self.ready,
            "reason": self.reason,
            "degraded": [d.name for d in self.degraded],
        }
        if verbose:
            body["deployments"] = [{**asdict(d), "degraded": d.degraded} for d in self.deployments]
        return body


def _status(value: Any) -> str:
    """An enum or its string value as the plain string ("RUNNING")."""
    return str(getattr(value, "value", value))


def deployment_health(app: str, name: str, details: Mapping[str, Any]) -> DeploymentHealth:
    """Counts and degradation reasons of one deployment from its Serve details."""
    states = Counter(_status(r.get("state")) for r in details.get("replicas") or [])
    running = states.get(RUNNING, 0)
    target = int(details.get("target_num_replicas") or 0)
    status = _status(details.get("status", "UNKNOWN"))
    reasons = []
    if running < target:
        reasons.append(f"{running} of {target} replicas running")
    if status in DEGRADED_STATUSES:
        reasons.append(f"status {status}")
    return DeploymentHealth(
        app=app,
        deployment=name,
        status=status,
        running=running,
        target=target,
        replica_states=dict(sorted(states.items())),
        reasons=reasons,
    )


def _at_target(healths: list[DeploymentHealth]) -> bool:
    """Every one of an application's deployments runs its target replicas (at least one)."""
    return bool(healths) and all(h.running >= max(1, h.target) for h in healths)


def full_now(details: Mapping[str, Any]) -> set[str]:
    """The applications every deployment of which runs its target replicas now (at least one)."""
    apps: Mapping[str, Any] = details.get("applications") or {}
    return {
        name
        for name, app in apps.items()
        if _at_target(
            [deployment_health(name, n, d) for n, d in (app.get("deployments") or {}).items()]
        )
    }


def routing_gaps(
    details: Mapping[str, Any], apps: Collection[str], servers: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """Of ``apps``, those whose ingress deployment has a RUNNING replica that HAProxy does not
    route to yet (its server missing from ``servers``, or not UP), each with why. ``servers``:
    HAProxy's ``show stat`` rows by ``backend/server`` (ops.haproxy.haproxy_servers). An
    application without an HTTP route has no HAProxy backend, so nothing to wait for."""
    from serve_app.startup.ray_compat import haproxy_server_key

    gaps = {}
    for name in sorted(apps):
        app = (details.get("applications") or {}).get(name) or {}
        deps: Mapping[str, Any] = app.get("deployments") or {}
        ingress = str((app.get("deployment_topology") or {}).get("ingress_deployment") or "")
        if not ingress and len(deps) == 1:
            ingress = next(iter(deps))
        if app.get("route_prefix") is None or ingress not in deps:
            continue
        running = [
            str(r["actor_name"])
            for r in deps[ingress].get("replicas") or []
            if _status(r.get("state")) == RUNNING and r.get("actor_name")
        ]
        # "UP 1/2": up and taking traffic, its checks counting towards down.
        up = sum(
            str((servers.get(haproxy_server_key(name, actor)) or {}).get("status", "")).startswith(
                "UP"
            )
            for actor in running
        )
        if up < len(running):
            gaps[name] = f"HAProxy routes to {up} of {len(running)} running {name}/{ingress}"
    return gaps


def decide(
    details: Mapping[str, Any],
    settled: Collection[str] | None = None,
    gaps: Mapping[str, str] | None = None,
) -> Readiness:
    """Ready when there is an application, every application has finished its first roll-out
    (is in ``settled``, or runs every target replica now and has no routing gap in ``gaps``)
    and every deployment of every application has at least one RUNNING replica. ``details`` is
    Serve's instance-details dict (or any mapping with its ``applications`` shape); ``settled``
    None leaves the first roll-out out of the decision; ``gaps``: ``routing_gaps``' answer."""
    apps: Mapping[str, Any] = details.get("applications") or {}
    if not apps:
        return Readiness(False, "no application is deployed", [])
    deployments: list[DeploymentHealth] = []
    blocking: list[str] = []
    for app_name, app in sorted(apps.items()):
        deps: Mapping[str, Any] = app.get("deployments") or {}
        if not deps:
            blocking.append(f"{app_name} has no deployment yet ({_status(app.get('status'))})")
        healths = [deployment_health(app_name, n, d) for n, d in sorted(deps.items())]
        deployments += healths
        blocking += [f"{h.name} has no RUNNING replica" for h in healths if h.running == 0]
        if settled is not None and app_name not in settled and deps:
            if not _at_target(healths):
                counts = ", ".join(f"{h.name} {h.running} of {h.target} running" for h in healths)
                blocking.append(f"{app_name} is in its first roll-out ({counts})")
            elif gaps and app_name in gaps:
                blocking.append(f"{app_name} is in its first roll-out ({gaps[app_name]})")
    if blocking:
        return Readiness(False, "; ".join(blocking), deployments)
    degraded = sum(d.degraded for d in deployments)
    reason = (
        f"every deployment has a RUNNING replica; {degraded} degraded"
        if degraded
        else "every deployment runs its target replicas"
    )
    return Readiness(True, reason, deployments)


# How long a replica waits for the registry's list of settled applications.
REGISTRY_TIMEOUT_S = 5.0


def _registry_settle(new: list[str], deployed: list[str], read_at_s: float) -> list[str]:
    """Adds ``new`` to the registry's settled applications, drops those no longer
    ``deployed`` (Serve's list read at ``read_at_s``) and returns them all (blocking)."""
    import ray

    from serve_app.serving.registry import get_registry

    call = get_registry().settle.remote(new, deployed, read_at_s)
    settled: list[str] = ray.get(call, timeout=REGISTRY_TIMEOUT_S)
    return settled


class SettledApps:
    """The applications that have finished their first roll-out. Each replica caches the set
    and asks the registry (``settle``: add these, forget the deleted, return all) only when an
    application it has not seen settle is deployed, one has just settled, or one it knew was
    deleted (a later deployment of the name starts its first roll-out again). If the registry
    does not answer, what this replica saw itself still counts, and it asks again next time."""

    def __init__(
        self, settle: Callable[[list[str], list[str], float], list[str]] = _registry_settle
    ):
        self._settle = settle
        self._known: set[str] = set()

    @property
    def known(self) -> set[str]:
        """The applications this replica has seen settled so far."""
        return set(self._known)

    def update(
        self, apps: Collection[str], full: Collection[str], read_at_s: float | None = None
    ) -> set[str]:
        """The settled applications, given those deployed (``apps``, Serve's list read at
        ``read_at_s``, Unix time, now by default) and those running every target replica now
        (``full``, which settle now)."""
        deployed = set(apps)
        new = set(full) - self._known
        if new or deployed != self._known:
            at_s = time.time() if read_at_s is None else read_at_s
            try:
                self._known = set(self._settle(sorted(new), sorted(deployed), at_s))
            except Exception as exc:  # noqa: BLE001 - the registry's failure is not ours
                logger.warning(
                    "readiness: the registry did not answer (%s: %s)", type(exc).__name__, exc
                )
                self._known &= deployed
            self._known |= new
        return set(self._known)


def serve_details() -> dict[str, Any]:
    """Serve's instance details from its controller (blocking: call it off the event loop)."""
    from serve_app.startup import ray_compat

    return ray_compat.serve_details()


def haproxy_view() -> Mapping[str, Mapping[str, str]] | None:
    """This node's HAProxy's servers (``show stat`` on its admin socket); None where Serve runs
    no HAProxy, or runs none on this node (``proxy_location: HeadOnly`` on another node: this
    replica cannot see that one's view). Raises OSError when its socket does not answer."""
    from serve_app import env

    if os.environ.get(env.HA_PROXY_VAR) != "1":
        return None
    import ray

    from serve_app.ops.haproxy import haproxy_servers

    try:
        return haproxy_servers(ray.get_runtime_context().get_node_id(), timeout_s=1.0)
    except FileNotFoundError:
        return None


SETTLED = SettledApps()


def current(
    settled: SettledApps = SETTLED,
    read_servers: Callable[[], Mapping[str, Mapping[str, str]] | None] = haproxy_view,
) -> Readiness:
    """The decision over Serve's details now; not ready (with the reason) when they cannot be
    read, so a probe answers 503 rather than an error (blocking: call it off the loop). An
    application that runs every target replica settles once HAProxy routes to each of them
    too (``read_servers``, read only while an application is still to settle)."""
    read_at_s = time.time()
    try:
        details = serve_details()
    except Exception as exc:  # noqa: BLE001 - any failure to read the status means "not ready"
        return Readiness(False, f"cannot read Serve's status: {type(exc).__name__}: {exc}", [])
    apps = list(details.get("applications") or {})
    full = full_now(details)
    pending = full - settled.known
    gaps: dict[str, str] = {}
    if pending:
        try:
            servers = read_servers()
        except OSError as exc:
            why = f"HAProxy's admin socket did not answer: {type(exc).__name__}"
            gaps = dict.fromkeys(pending, why)
        else:
            gaps = routing_gaps(details, pending, servers) if servers is not None else {}
    return decide(details, settled.update(apps, full - set(gaps), read_at_s), gaps)


# How long a replica reuses the controller's answer for /readyz: probes come every few seconds,
# and a burst of unauthenticated calls costs the controller at most one call a second. A "not
# ready" is kept a tenth of that: it is the state start-up waits to leave (serve-app run and the
# start-up benchmark poll /readyz every 0.1 s), so it must not read up to a second late.
READYZ_MAX_AGE_S = 1.0
NOT_READY_MAX_AGE_S = 0.1
# Past its age, a ready answer is still given, up to this old, while one call refreshes it: a
# probe then never waits on a slow controller (Kubernetes gives a probe 1 s by default). A
# not-ready answer is never given stale: start-up waits to leave it.
STALE_READY_S = 10.0


class CachedReadiness:
    """``fetch`` (``current`` by default, blocking: run in a thread) at most once per
    ``max_age_s``, with one call in flight: callers that arrive meanwhile await the same call.
    Each answer is kept ``max_age_s`` from when it arrived (``not_ready_max_age_s`` when it
    says not ready); a ready one is then given while the next call runs, up to
    ``STALE_READY_S`` old."""

    def __init__(
        self,
        fetch: Callable[[], Readiness] = current,
        max_age_s: float = READYZ_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
        not_ready_max_age_s: float = NOT_READY_MAX_AGE_S,
    ):
        self.fetch = fetch
        self.max_age_s = max_age_s
        self.not_ready_max_age_s = not_ready_max_age_s
        self.clock = clock
        self.calls = 0  # calls of fetch, for tests and the curious
        self._value: Readiness | None = None
        self._at_s = 0.0
        self._pending: asyncio.Future[Readiness] | None = None

    async def get(self) -> Readiness:
        value = self._value
        if value is not None:
            age_s = self.clock() - self._at_s
            if age_s < (self.max_age_s if value.ready else self.not_ready_max_age_s):
                return value
            if value.ready and age_s < STALE_READY_S:
                self._refresh()
                return value
        pending = self._refresh()
        # shield: a caller that goes (a probe's timeout) does not cancel the others' call
        return await asyncio.shield(pending)

    def _refresh(self) -> asyncio.Future[Readiness]:
        """The call in flight, started now if there is none."""
        if self._pending is None:
            self.calls += 1
            self._pending = asyncio.ensure_future(asyncio.to_thread(self.fetch))
            self._pending.add_done_callback(self._store)
        return self._pending

    def _store(self, done: asyncio.Future[Readiness]) -> None:
        self._pending = None
        if not done.cancelled() and done.exception() is None:
            self._value, self._at_s = done.result(), self.clock()
