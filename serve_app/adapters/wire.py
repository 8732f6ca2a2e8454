"""Shared pieces of the JSON wire specs: parsing a body, the checks every spec makes, and the
OpenAPI schema helpers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel

from serve_app.errors import BadRequest, NotFound


@dataclass(frozen=True)
class Operation:
    """A wire spec's part of the OpenAPI document.

    Attributes:
        operation: the POST operation object of its route (summary, requestBody, parameters,
            the 200 response), without the common error responses.
        schemas: the component schemas it refers to, by name.
        error_codes: the 4xx statuses its decode can answer (the replica adds the rest).
    """

    operation: dict[str, Any]
    schemas: dict[str, Any]
    error_codes: tuple[int, ...]


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


REF = "#/components/schemas/{model}"
"""Where an OpenAPI document keeps a model's schema."""


def ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def json_content(model: type[BaseModel]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": ref(model)}}}


def component_schemas(*models: type[BaseModel]) -> dict[str, Any]:
    """The JSON schemas of ``models`` and of the models they use, by name, as
    ``#/components/schemas`` holds them."""
    schemas: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


def json_operation(
    summary: str,
    request: type[BaseModel],
    response: type[BaseModel],
    error_codes: tuple[int, ...],
) -> Operation:
    """A POST operation whose body is the JSON ``request`` and whose 200 is ``response``."""
    return Operation(
        operation={
            "summary": summary,
            "requestBody": {"required": True, **json_content(request)},
            "responses": {"200": {"description": "OK", **json_content(response)}},
        },
        schemas=component_schemas(request, response),
        error_codes=error_codes,
    )


def pin_request(schema: dict[str, Any], model_name: str, max_inputs: int) -> None:
    """Narrow a JSON request schema to what this application accepts, exactly: ``model`` is its
    name or null, ``input`` a string or 1 to ``max_inputs`` strings."""
    props = schema["properties"]
    props["model"]["anyOf"] = [{"type": "string", "enum": [model_name]}, {"type": "null"}]
    array = props["input"]["anyOf"][1]
    array.update({"minItems": 1, "maxItems": max_inputs})
