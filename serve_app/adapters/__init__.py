"""Model families, a folder each, each a wire spec and a model backend (contract.py), and the
registry that picks one by ``args.adapter``: a family's name, or a user model's class by import
path (``module:Class``), which the ``custom`` family wraps."""

from __future__ import annotations

import importlib
from typing import cast

from serve_app.adapters.contract import Decoded, Family, Model, ModelBackend, WireSpec
from serve_app.config.args import AppArgs, is_import_path

FAMILIES = {
    "embeddings": "serve_app.adapters.embeddings",
    "image-classification": "serve_app.adapters.image",
    "rerank": "serve_app.adapters.rerank",
    "text-classification": "serve_app.adapters.textclass",
}
"""``args.adapter`` -> the family's package (its ``build(args) -> Model``)."""
CUSTOM_FAMILY = "serve_app.adapters.custom"
"""The family of every ``args.adapter`` that is an import path: a user's model."""

ROUTES = {
    "embeddings": "/v1/embeddings",
    "image-classification": "/v1/classify",
    "rerank": "/v1/rerank",
    "text-classification": "/predict",
}
"""Each family's route, known without importing the family (a replica answers a clear 404 on
another family's route)."""
CUSTOM_ROUTE = "/v1/predict"
"""A user model's generic JSON route (custom/spec.py; a user model may take a family's wire
spec instead, ``args.wire``), answered with the same 404 by replicas that do not serve it."""


def family(args: AppArgs) -> Family:
    """The family of ``args.adapter`` (its package, imported)."""
    package = CUSTOM_FAMILY if is_import_path(args.adapter) else FAMILIES[args.adapter]
    return cast(Family, importlib.import_module(package))


def build_model(args: AppArgs) -> Model:
    """The model of ``args.adapter``, built (nothing touches a device yet)."""
    return family(args).build(args)


__all__ = [
    "CUSTOM_FAMILY",
    "CUSTOM_ROUTE",
    "FAMILIES",
    "ROUTES",
    "Decoded",
    "Family",
    "Model",
    "ModelBackend",
    "WireSpec",
    "build_model",
    "family",
]
