"""The Serve application builder named by every config's ``import_path``."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from serve_app.config.args import parse_args
from serve_app.serving.replica import ModelServer


def build_app(args: dict[str, Any]) -> Application:
    """Validate ``args`` (raising a ConfigError that names each bad field) and bind the model
    deployment, which is also the HTTP ingress."""
    app_args = parse_args(args)
    return ModelServer.bind(app_args.model_dump())  # type: ignore[attr-defined]
