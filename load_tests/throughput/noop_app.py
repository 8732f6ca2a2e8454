"""The plain Ray Serve no-op (side_by_side's FastAPI ingress deployment, ``POST /noop``) as an
application builder, so that it deploys from a Serve config the way serve_app does (through
serve_app.ops.launch.deploy) into the same cluster, behind the same HAProxy ingress."""

from __future__ import annotations

from typing import Any

from load_tests.side_by_side.deployments import noop_deployment

DEPLOYMENT_NAME = "Noop"
IMPORT_PATH = "load_tests.throughput.noop_app:build"


def build(args: dict[str, Any]) -> Any:
    """``import_path`` target: the no-op deployment, options from the config's deployments."""
    return noop_deployment().bind()
