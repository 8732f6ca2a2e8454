"""``GET /v1/models`` for several applications on one base URL: every serve_app model whose
public route lies under the answering application's route prefix, each with that route.

Pure functions over the replicas' reports (serving/registry: each carries its Serve
application, its model's route and what ``/v1/models`` shows of it) and Serve's route prefix per
application (``serve_details``), so that any replica answers for all with no router deployment on
the request path. Serve matches prefixes longest first (HAProxy's ``path_beg`` rules), so an
application at ``route_prefix: /`` answers the base URL's ``/v1/models`` while the others sit at
their own routes (configs/rag-stack.yaml).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def public_route(route_prefix: str | None, route: str) -> str | None:
    """The path a client calls for ``route`` in an application at ``route_prefix``: the
    prefix itself when it ends with the route (http.Ingress serves it there), else below it;
    None for an application with no HTTP route (``route_prefix: null``)."""
    if route_prefix is None:
        return None
    prefix = route_prefix.rstrip("/")
    if prefix.endswith(route):
        return prefix
    return f"{prefix}{route}"


def under(base: str, route: str) -> bool:
    """Whether ``route`` lies under the base path ``base`` ("" or "/" for the root)."""
    base = base.rstrip("/")
    return not base or route == base or route.startswith(f"{base}/")


def route_prefixes(details: Mapping[str, Any]) -> dict[str, str | None]:
    """Each application's route prefix from Serve's instance details."""
    apps: Mapping[str, Any] = details.get("applications") or {}
    return {name: app.get("route_prefix") for name, app in apps.items()}


def model_entries(
    base: str,
    own: Mapping[str, Any],
    reports: list[Mapping[str, Any]],
    prefixes: Mapping[str, str | None],
) -> list[dict[str, Any]]:
    """``/v1/models``'s ``data`` at the base path ``base``: one entry per (application,
    model), the answering replica's own first (``own``: its report), then the others by route.

    An entry is the model's card (``model_card``) with ``route`` (the public path),
    ``application`` and ``replicas`` (how many have reported within the registry's age).
    Reports of applications Serve no longer lists, or with no HTTP route, are left out."""
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    own_key = (str(own.get("application")), str(own.get("app")))
    for rep in [own, *reports]:
        key = (str(rep.get("application")), str(rep.get("app")))
        if key in grouped:
            if rep is not own and rep.get("replica_id") != own.get("replica_id"):
                grouped[key]["replicas"] += 1
            continue
        card = rep.get("model_card")
        route = rep.get("route")
        if not isinstance(card, Mapping) or not isinstance(route, str):
            continue  # a report from before these fields, or a foreign one
        if key[0] not in prefixes:
            continue
        path = public_route(prefixes[key[0]], route)
        if path is None or not under(base, path):
            continue
        grouped[key] = {**card, "route": path, "application": key[0], "replicas": 1}
    first = [grouped.pop(own_key)] if own_key in grouped else []
    return first + sorted(grouped.values(), key=lambda e: (e["route"], e["application"]))


def serve_details() -> tuple[dict[str, Any], str | None]:
    """Serve's instance details and None, or {} and why they cannot be read (blocking: call it
    off the loop); ``/v1/models`` then lists the answering application's own model only."""
    from serve_app.startup import ray_compat

    try:
        return ray_compat.serve_details(), None
    except Exception as exc:  # noqa: BLE001 - the listing degrades to this application's model
        return {}, f"cannot read Serve's applications: {type(exc).__name__}: {exc}"
