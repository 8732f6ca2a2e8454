"""The Serve application builder named by every config's ``import_path``."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from serve_app.config.args import is_import_path, parse_args
from serve_app.serving.replica import ModelServer


def build_app(args: dict[str, Any]) -> Application:
    """Validate ``args`` (raising a ConfigError that names each bad field; for a user model,
    one that names a class that does not import or lacks a method) and bind the model
    deployment, which is also the HTTP ingress."""
    app_args = parse_args(args)
    if is_import_path(app_args.adapter):  # a user model: its class imports and has the methods
        from serve_app.adapters.custom.loader import load_class

        load_class(app_args.adapter)
    return ModelServer.bind(app_args.model_dump())  # type: ignore[attr-defined]
