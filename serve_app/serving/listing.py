"""The bodies of ``GET /v1/models`` and ``GET /v1/memory``: every serve_app replica's report
from the registry, shaped for the base URL (serving/index) or by node and GPU (ops/status).
Kept out of the replica so that its module holds the request path only."""

from __future__ import annotations

import asyncio
from typing import Any

from serve_app.ops.status import by_node_and_gpu, cluster_view, placement_groups
from serve_app.serving import index
from serve_app.serving.registry import RegistryHandle
from serve_app.serving.report import REPORT_MAX_AGE_S, ReplicaReport


async def models_body(
    registry: RegistryHandle, own: ReplicaReport, application: str, base: str
) -> dict[str, Any]:
    """Every serve_app model under the prefix ``base``, ``own`` first, each with its route."""
    reports, (details, error) = await asyncio.gather(
        registry.all.remote(REPORT_MAX_AGE_S), asyncio.to_thread(index.serve_details)
    )
    prefixes = index.route_prefixes(details) or {application: base or "/"}
    body: dict[str, Any] = {
        "object": "list",
        "data": index.model_entries(base, dict(own), reports, prefixes),
    }
    if error is not None:
        body["errors"] = [error]
    return body


async def memory_body(registry: RegistryHandle) -> dict[str, Any]:
    """Every replica's report by node and GPU, with the cluster's view of its GPUs."""
    reports = by_node_and_gpu(await registry.all.remote(REPORT_MAX_AGE_S))
    view = await asyncio.to_thread(cluster_view, reports)
    return {
        "object": "memory_report",
        "replicas": reports,
        "placement": placement_groups(reports),
        "gpus": view.gpus,
        "controller": view.controller,
        "escapes": view.escapes,
        "errors": view.errors,
    }
