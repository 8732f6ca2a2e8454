"""The OpenAPI document of one application, built from pydantic models of its bodies.

Each application lists only the routes it serves (its wire spec's inference route, whose
operation and schemas the spec gives, and the common ones here), with request and response
schemas and every status a route can answer. The models describe the wire format only: requests
are parsed by the wire specs (orjson, then explicit checks with messages that name the field),
not by pydantic, which keeps validation off the hot path and the error bodies in one OpenAI-style
shape.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import HTMLResponse

from serve_app.adapters.wire import Operation, component_schemas, json_content

BEARER = "bearerAuth"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    request_id: str | None = Field(None, description="the x-request-id of the answer")


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: the OpenAI error shape."""

    error: ErrorDetail


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
    ready: bool = Field(
        description="Every application finished its first roll-out (all its replicas ran and "
        "HAProxy routed to each) and every deployment has at least one RUNNING replica"
    )
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


MODELS: tuple[type[BaseModel], ...] = (ErrorBody, ModelList, Health, Readiness, MemoryReport)

_STATUS_TEXT = {
    400: "Invalid request (the body names the field)",
    404: "Unknown model or route",
    405: "Method not allowed (see the Allow header)",
    413: "Body or one of its inputs too large",
    415: "Unsupported Content-Type, or a compressed body (Content-Encoding)",
    500: "Inference failed (the body carries an error id)",
    503: "Overloaded: the replica's queue is full (args.max_queued_items), it holds as many "
    "body bytes as it may (args.max_body_bytes_in_flight), or the request waited longer than "
    "args.queue_deadline_s; retry after Retry-After seconds",
    504: "Not answered within args.request_timeout_s; the request's work was dropped",
    507: "An input does not fit in the replica's GPU memory even alone",
}
NOT_READY = (
    "Not ready: an application is in its first roll-out, or a deployment has no RUNNING replica"
)
UNEXPECTED = "Unexpected server error (the body carries an error id; the log has the rest)"
RETRY_AFTER = {
    "Retry-After": {
        "description": "Whole seconds to wait before retrying",
        "schema": {"type": "integer", "minimum": 1},
    }
}


def _errors(*codes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in codes:
        out[str(c)] = {"description": _STATUS_TEXT[c], **json_content(ErrorBody)}
        if c == 503:
            out[str(c)]["headers"] = RETRY_AFTER
    return out


def _get(summary: str, model: type[BaseModel], *extra: int) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": "OK", **json_content(model)}}
    responses.update(_errors(*extra))
    responses["500"] = {"description": UNEXPECTED, **json_content(ErrorBody)}
    return {"get": {"summary": summary, "responses": responses}}


def _inference(op: Operation) -> dict[str, Any]:
    """The spec's POST operation with the statuses every inference route can answer."""
    operation = dict(op.operation)
    responses = dict(operation["responses"])
    responses.update(_errors(*op.error_codes, 415, 500, 503, 504, 507))
    operation["responses"] = responses
    return {"post": operation}


def _secure(paths: dict[str, Any], protected: Collection[str]) -> None:
    """Mark the routes auth protects: the bearer scheme and their 401."""
    unauthorized = {
        "description": "No valid API key (send 'Authorization: Bearer <key>')",
        "headers": {
            "WWW-Authenticate": {
                "description": "Bearer challenge (RFC 6750)",
                "schema": {"type": "string"},
            }
        },
        **json_content(ErrorBody),
    }
    for path, item in paths.items():
        if path not in protected:
            continue
        for op in item.values():
            op["security"] = [{BEARER: []}]
            op["responses"]["401"] = unauthorized


def build_openapi(
    route: str,
    operation: Operation,
    model_name: str,
    *,
    protected: Collection[str] | None = None,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of an application that serves ``route`` (its wire spec's
    ``operation``) for ``model_name``; with ``protected`` (auth on), the bearer scheme on those
    routes."""
    schemas = component_schemas(*MODELS)
    schemas.update(operation.schemas)
    ready = _get(
        "Readiness: 200 once every application's first roll-out is done, while every "
        "deployment has a RUNNING replica",
        Readiness,
    )
    ready["get"]["responses"]["503"] = {"description": NOT_READY, **json_content(Readiness)}
    ready["get"]["parameters"] = [
        {
            "name": "verbose",
            "in": "query",
            "required": False,
            "description": "1 (any value but empty, 0 or false): list every deployment "
            "with its replica counts (needs an API key when keys are set: 401 without one)",
            "schema": {"type": "string"},
        }
    ]
    paths = {
        route: _inference(operation),
        "/v1/models": _get("Models served", ModelList),
        "/healthz": _get("Liveness", Health),
        "/readyz": ready,
        "/v1/memory": _get("Per-replica GPU memory figures (integer bytes)", MemoryReport),
    }
    components: dict[str, Any] = {"schemas": schemas}
    if protected is not None:
        _secure(paths, protected)
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


def swagger_page(root_path: str) -> HTMLResponse:
    """``/docs``: Swagger UI over this application's ``/openapi.json`` (below its prefix)."""
    from fastapi.openapi.docs import get_swagger_ui_html

    return get_swagger_ui_html(
        openapi_url=f"{root_path}/openapi.json", title="serve_app - Swagger UI"
    )
