"""The plain Ray Serve no-op (a FastAPI ingress deployment, serve_app's ingress shape, whose one
route ``POST /noop`` does nothing) as an application builder, so that it deploys from a Serve
config the way serve_app does (through serve_app.ops.launch.deploy) into the same cluster, behind
the same HAProxy ingress."""

from __future__ import annotations

from typing import Any

DEPLOYMENT_NAME = "Noop"
IMPORT_PATH = "load_tests.benchmarks.throughput.noop_app:build"


def noop_deployment() -> Any:
    """A FastAPI-ingress deployment whose one route does nothing."""
    from fastapi import FastAPI
    from ray import serve

    api = FastAPI()

    @serve.ingress(api)
    class Noop:
        @api.post("/noop")
        async def noop(self) -> dict[str, bool]:
            return {"ok": True}

    return serve.deployment(Noop)


def build(args: dict[str, Any]) -> Any:
    """``import_path`` target: the no-op deployment, options from the config's deployments."""
    return noop_deployment().bind()
