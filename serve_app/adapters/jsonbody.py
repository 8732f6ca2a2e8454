"""Shared request-body parsing for JSON adapters."""

from __future__ import annotations

from typing import Any

import orjson

from serve_app.errors import BadRequest, NotFound


def parse_json_object(body: bytes) -> dict[str, Any]:
    if not body:
        raise BadRequest("request body is empty; send a JSON object")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(doc).__name__}")
    return doc


def check_model(doc: dict[str, Any], served: str) -> None:
    model = doc.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    if model != served:
        raise NotFound(
            f"model {model!r} is not served here; GET /v1/models lists {served!r}",
            param="model",
            code="model_not_found",
        )


def string_list(doc: dict[str, Any], name: str, max_items: int) -> tuple[list[str], bool]:
    """``doc[name]`` as a non-empty list of strings, and whether a single string was sent."""
    if name not in doc:
        raise BadRequest(f"'{name}' is required", param=name)
    value = doc[name]
    single = isinstance(value, str)
    items = [value] if single else value
    if not isinstance(items, list):
        raise BadRequest(
            f"'{name}' must be a string or a list of strings, got {type(value).__name__}",
            param=name,
        )
    if not items:
        raise BadRequest(f"'{name}' must not be an empty list", param=name)
    if len(items) > max_items:
        raise BadRequest(
            f"'{name}' has {len(items)} items; at most {max_items} per request "
            "(args.max_inputs_per_request)",
            param=name,
            code="too_many_inputs",
        )
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise BadRequest(
                f"'{name}[{i}]' must be a string, got {type(item).__name__}", param=f"{name}[{i}]"
            )
    return items, single
