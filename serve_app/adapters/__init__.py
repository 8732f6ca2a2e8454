"""Model families, a folder each, each a wire spec and a model backend (contract.py), and the
registry that picks one by ``args.adapter``."""

from __future__ import annotations

import importlib
from typing import cast

from serve_app.adapters.contract import Decoded, Family, Model, ModelBackend, WireSpec
from serve_app.config.args import AppArgs

FAMILIES = {
    "embeddings": "serve_app.adapters.embeddings",
    "image-classification": "serve_app.adapters.image",
    "rerank": "serve_app.adapters.rerank",
    "text-classification": "serve_app.adapters.textclass",
}
"""``args.adapter`` -> the family's package (its ``build(args) -> Model``)."""

ROUTES = {
    "embeddings": "/v1/embeddings",
    "image-classification": "/v1/classify",
    "rerank": "/v1/rerank",
    "text-classification": "/predict",
}
"""Each family's route, known without importing the family (a replica answers a clear 404 on
another family's route)."""


def family(args: AppArgs) -> Family:
    """The family of ``args.adapter`` (its package, imported)."""
    return cast(Family, importlib.import_module(FAMILIES[args.adapter]))


def build_model(args: AppArgs) -> Model:
    """The model of ``args.adapter``, built (nothing touches a device yet)."""
    return family(args).build(args)


__all__ = [
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
