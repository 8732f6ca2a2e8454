"""A tiny named actor where every replica posts its latest report, so that any replica can
answer ``GET /v1/memory`` for all of them (Serve has no broadcast to replicas).

It lives on the head node (Ray's ``node:__internal_head__`` resource, as Ray Train's state actor
does): placed on a worker, it died with that worker and every replica's ``/v1/memory`` failed
from then on (seen in tests/integration/test_two_nodes.py). ``max_restarts=-1`` brings it back
if its process dies; every replica posts again within ``REPORT_PERIOD_S``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol, cast

import ray

if TYPE_CHECKING:
    from ray import ObjectRef

NAME = "serve_app_registry"
NAMESPACE = "serve_app"
HEAD_NODE_RESOURCE = "node:__internal_head__"


@ray.remote(num_cpus=0, max_concurrency=64)  # type: ignore[call-overload]
class Registry:
    def __init__(self) -> None:
        self._reports: dict[str, tuple[float, dict[str, Any]]] = {}
        # Applications past their first roll-out (readiness), with when each settled.
        self._settled: dict[str, float] = {}

    def put(self, key: str, report: dict[str, Any]) -> None:
        self._reports[key] = (time.monotonic(), report)

    def remove(self, key: str) -> None:
        self._reports.pop(key, None)

    def settle(
        self, apps: list[str], deployed: list[str] | None = None, read_at_s: float = 0.0
    ) -> list[str]:
        """Adds ``apps`` to the applications that finished their first roll-out; all of them.
        ``deployed``: the applications Serve listed at ``read_at_s`` (Unix time); one that
        settled before then and was not listed was deleted, and a later deployment of its name
        starts a first roll-out again (one that settled after it, a caller's stale list missed)."""
        now = time.time()
        for app in apps:
            self._settled.setdefault(app, now)
        if deployed is not None:
            listed = set(deployed)
            for app in [a for a, at in self._settled.items() if a not in listed and at < read_at_s]:
                del self._settled[app]
        return sorted(self._settled)

    def all(self, max_age_s: float) -> list[dict[str, Any]]:
        now = time.monotonic()
        for key in [k for k, (t, _) in self._reports.items() if now - t > max_age_s]:
            del self._reports[key]
        return [
            r
            for _, r in sorted(self._reports.values(), key=lambda tr: str(tr[1].get("replica_id")))
        ]


class _Put(Protocol):
    def remote(self, key: str, report: Any) -> ObjectRef[None]: ...


class _All(Protocol):
    def remote(self, max_age_s: float) -> ObjectRef[list[dict[str, Any]]]: ...


class _Settle(Protocol):
    def remote(
        self, apps: list[str], deployed: list[str] | None = None, read_at_s: float = 0.0
    ) -> ObjectRef[list[str]]: ...


class RegistryHandle(Protocol):
    """The registry actor as its Ray handle offers it: each method called with ``.remote``."""

    @property
    def put(self) -> _Put: ...

    @property
    def all(self) -> _All: ...

    @property
    def settle(self) -> _Settle: ...


def get_registry() -> RegistryHandle:
    """The cluster's registry actor, created on first use."""
    return cast(
        RegistryHandle,
        Registry.options(  # type: ignore[attr-defined]
            name=NAME,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=-1,
            resources={HEAD_NODE_RESOURCE: 0.001},
        ).remote(),
    )
