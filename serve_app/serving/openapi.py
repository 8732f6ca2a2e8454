"""The OpenAPI document of one application, built from pydantic models of its bodies.

Each application lists only the routes it serves (its adapter's inference route and the common
ones), with request and response schemas and every status a route can answer. The models here
describe the wire format only: requests are parsed by the adapters (orjson, then explicit
checks with messages that name the field), not by pydantic, which keeps validation off the hot
path and the error bodies in one OpenAI-style shape.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from serve_app.serving.auth import PROTECTED_PATHS

REF = "#/components/schemas/{model}"
BEARER = "bearerAuth"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: the OpenAI error shape."""

    error: ErrorDetail


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: str | list[str] = Field(
        description="A text or a non-empty list of texts (at most args.max_inputs_per_request)"
    )
    model: str | None = Field(default=None, description="Must name the served model if given")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, description="Only the model's own size")


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: str | list[str] = Field(description="Base64 JPEG or PNG image(s)")
    model: str | None = None
    top_k: int = Field(default=5, ge=1, le=1000, description="Labels per image")


class Label(BaseModel):
    label: str
    class_id: int
    score: float


class Classification(BaseModel):
    object: Literal["classification"]
    index: int
    top_k: list[Label]


class ClassifyResponse(BaseModel):
    object: Literal["list"]
    model: str
    data: list[Classification]


class ModelCard(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["model"]
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"]


class DeploymentHealth(BaseModel):
    app: str
    deployment: str
    status: str = Field(description="Serve's deployment status (HEALTHY, UPDATING, ...)")
    running: int = Field(description="RUNNING replicas")
    target: int = Field(description="The deployment's target replica count")
    replica_states: dict[str, int] = Field(description="Replicas by Serve replica state")
    reasons: list[str] = Field(description="Why it is degraded; empty when it is not")
    degraded: bool


class Readiness(BaseModel):
    ready: bool = Field(description="Every deployment has at least one RUNNING replica")
    reason: str
    degraded: list[str] = Field(
        description="app/deployment names running fewer replicas than their target, "
        "unhealthy or updating"
    )
    deployments: list[DeploymentHealth] | None = Field(
        default=None, description="With ?verbose=1: every deployment's counts"
    )


class MemoryReport(BaseModel):
    model_config = ConfigDict(extra="allow")

    object: Literal["memory_report"]
    replicas: list[dict[str, Any]]
    gpus: list[dict[str, Any]]
    controller: dict[str, Any] | None = None
    errors: list[str]


MODELS: tuple[type[BaseModel], ...] = (
    ErrorBody,
    EmbeddingsRequest,
    EmbeddingsResponse,
    ClassifyRequest,
    ClassifyResponse,
    ModelList,
    Health,
    Readiness,
    MemoryReport,
)

_STATUS_TEXT = {
    400: "Invalid request (the body names the field)",
    404: "Unknown model or route",
    405: "Method not allowed (see the Allow header)",
    413: "Body or image too large",
    415: "Unsupported Content-Type",
    500: "Inference failed (the body carries an error id)",
    503: "Overloaded: the replica's queue is full (args.max_queued_items) or the request "
    "waited longer than args.queue_deadline_s; retry after Retry-After seconds",
    504: "Not answered within args.request_timeout_s; the request's work was dropped",
    507: "An input does not fit in the replica's GPU memory even alone",
}
NOT_READY = "Not ready: some deployment has no RUNNING replica"
UNEXPECTED = "Unexpected server error (the body carries an error id; the log has the rest)"
RETRY_AFTER = {
    "Retry-After": {
        "description": "Whole seconds to wait before retrying",
        "schema": {"type": "integer", "minimum": 1},
    }
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": _ref(model)}}}


def _errors(*codes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in codes:
        out[str(c)] = {"description": _STATUS_TEXT[c], **_json(ErrorBody)}
        if c == 503:
            out[str(c)]["headers"] = RETRY_AFTER
    return out


def _get(summary: str, model: type[BaseModel], *extra: int) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": "OK", **_json(model)}}
    responses.update(_errors(*extra))
    responses["500"] = {"description": UNEXPECTED, **_json(ErrorBody)}
    return {"get": {"summary": summary, "responses": responses}}


def _inference(route: str, max_body_bytes: int) -> dict[str, Any]:
    ok: type[BaseModel]
    codes: tuple[int, ...]
    if route == "/v1/embeddings":
        body: dict[str, Any] = {"required": True, **_json(EmbeddingsRequest)}
        ok, summary, codes = EmbeddingsResponse, "OpenAI-style embeddings", (400, 404, 413)
        params: list[dict[str, Any]] = []
    else:
        binary = {"schema": {"type": "string", "format": "binary", "maxLength": max_body_bytes}}
        body = {
            "required": True,
            "content": {
                "application/json": {"schema": _ref(ClassifyRequest)},
                "image/jpeg": binary,
                "image/png": binary,
            },
        }
        ok, summary, codes = ClassifyResponse, "Image classification", (400, 404, 413, 415)
        params = [
            {
                "name": "top_k",
                "in": "query",
                "required": False,
                "description": "Labels per image, for raw image bodies",
                "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
            }
        ]
    responses: dict[str, Any] = {"200": {"description": "OK", **_json(ok)}}
    responses.update(_errors(*codes, 500, 503, 504, 507))
    op: dict[str, Any] = {"summary": summary, "requestBody": body, "responses": responses}
    if params:
        op["parameters"] = params
    return {"post": op}


def _secure(paths: dict[str, Any]) -> None:
    """Mark the routes auth protects: the bearer scheme and their 401."""
    unauthorized = {
        "description": "No valid API key (send 'Authorization: Bearer <key>')",
        "headers": {
            "WWW-Authenticate": {
                "description": "Bearer challenge (RFC 6750)",
                "schema": {"type": "string"},
            }
        },
        **_json(ErrorBody),
    }
    for path, item in paths.items():
        if path not in PROTECTED_PATHS:
            continue
        for op in item.values():
            op["security"] = [{BEARER: []}]
            op["responses"]["401"] = unauthorized


def _pin_request(
    schema: dict[str, Any], model_name: str, max_inputs: int, dimensions: int | None
) -> None:
    """Narrow a request schema to what this application accepts, exactly: ``model`` is its
    name or null, ``input`` a string or 1 to ``max_inputs`` strings, ``dimensions`` (where
    present) its own size or null. (An input's token limit has no JSON Schema form: it is in
    the description, and a longer input gets 400 input_too_long.)"""
    props = schema["properties"]
    props["model"]["anyOf"] = [{"type": "string", "enum": [model_name]}, {"type": "null"}]
    array = props["input"]["anyOf"][1]
    array.update({"minItems": 1, "maxItems": max_inputs})
    if "dimensions" in props:
        own = {"type": "integer", "enum": [dimensions]} if dimensions else {"type": "integer"}
        props["dimensions"]["anyOf"] = [own, {"type": "null"}]


def build_openapi(
    route: str,
    model_name: str,
    max_body_bytes: int,
    auth: bool = False,
    *,
    max_inputs: int = 128,
    dimensions: int | None = None,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of an application that serves ``route`` for ``model_name``
    (at most ``max_inputs`` inputs a request; embeddings of ``dimensions`` floats); with
    ``auth``, the bearer scheme on the routes it protects (auth.PROTECTED_PATHS)."""
    schemas: dict[str, Any] = {}
    for model in MODELS:
        schema = model.model_json_schema(ref_template=REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    for request_model in (EmbeddingsRequest, ClassifyRequest):
        _pin_request(schemas[request_model.__name__], model_name, max_inputs, dimensions)
    ready = _get("Readiness: 200 while every deployment has a RUNNING replica", Readiness)
    ready["get"]["responses"]["503"] = {"description": NOT_READY, **_json(Readiness)}
    ready["get"]["parameters"] = [
        {
            "name": "verbose",
            "in": "query",
            "required": False,
            "description": "1 (any value but empty, 0 or false): list every deployment "
            "with its replica counts",
            "schema": {"type": "string"},
        }
    ]
    paths = {
        route: _inference(route, max_body_bytes),
        "/v1/models": _get("Models served", ModelList),
        "/healthz": _get("Liveness", Health),
        "/readyz": ready,
        "/v1/memory": _get("Per-replica GPU memory figures (integer bytes)", MemoryReport),
    }
    components: dict[str, Any] = {"schemas": schemas}
    if auth:
        _secure(paths)
        components["securitySchemes"] = {
            BEARER: {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key from SERVE_APP_API_KEYS or SERVE_APP_API_KEYS_FILE",
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "serve_app",
            "version": "0.1.0",
            "description": f"GPU-memory-partitioned inference on Ray Serve: {model_name}",
        },
        "paths": paths,
        "components": components,
    }
