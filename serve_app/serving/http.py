"""The replica's HTTP edge: a small ASGI app with exact-path routing, JSON rendered by orjson,
and our errors turned into JSON bodies without tracebacks.

Why not FastAPI's router: its routing, dependency solving and middleware stack cost more of a
loaded replica's event loop than a whole short-text model's path
(benchmarks/journal/2026-11-30-throughput-h200.md); serve_app's routes are a fixed handful of
exact paths, so a dict lookup does the routing, and Starlette's Request and Response do the
rest. The OpenAPI document is built from pydantic models
(openapi.py and each wire spec) and served at ``/openapi.json`` and ``/docs``.

Why orjson: it writes numpy float32 arrays directly, in the shortest form that gives the same
float32 back, an order of magnitude faster than ``json.dumps`` of the same floats.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from serve_app.errors import (
    BadRequest,
    InferenceError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    ServeAppError,
    Unauthorized,
)
from serve_app.serving.auth import ApiKeys
from serve_app.serving.metrics import count_error

logger = logging.getLogger("serve_app")

Handler = Callable[[Request], Awaitable[Response]]
JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def json_response(
    body: Any, status_code: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """``body`` (numpy arrays included) as an ``application/json`` response."""
    return Response(
        orjson.dumps(body, option=JSON_OPTIONS),
        status_code=status_code,
        headers=headers,
        media_type="application/json",
    )


def error_response(err: ServeAppError, headers: Mapping[str, str] | None = None) -> Response:
    """``err`` as its JSON body and status, with its own headers (``err.headers()``) and
    ``headers``."""
    count_error(err)  # 503s and 504s, by reason (serving/metrics)
    own = err.headers()
    if headers:
        own.update(headers)
    return json_response(err.to_json(), err.status_code, own or None)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refusing more than ``max_bytes`` before or while reading it."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            declared_bytes = int(declared)
        except ValueError:
            raise BadRequest(f"Content-Length {declared!r} is not an integer") from None
        if declared_bytes > max_bytes:
            raise PayloadTooLarge(
                f"request body is {declared_bytes} bytes; at most {max_bytes} (args.max_body_bytes)"
            )
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes (args.max_body_bytes)")
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def guarded(work: Awaitable[Response], timeout_s: float | None = None) -> Response:
    """Await a request's work; our errors become their JSON status, anything else a 500 with an
    error id (the traceback goes to the log only). Past ``timeout_s`` the work is cancelled (its
    items still queued in the batcher are dropped with it) and the answer is a JSON 504."""
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            return await work
    except ServeAppError as err:
        return error_response(err)
    except Exception as exc:  # noqa: BLE001 - the client gets an id, the log gets the traceback
        if isinstance(exc, TimeoutError) and deadline.expired():
            return error_response(
                RequestTimeout(
                    f"request took longer than {timeout_s:g} s (args.request_timeout_s); "
                    "its work was dropped"
                )
            )
        return internal_error()


def internal_error(what: str = "inference") -> Response:
    """A JSON 500 with an error id for an unexpected exception (call it from an ``except``):
    the traceback goes to the log only."""
    error_id = uuid.uuid4().hex[:12]
    logger.exception("%s failed (error id %s)", what, error_id)
    return error_response(
        InferenceError(f"{what} failed; error id {error_id} (see the server log)")
    )


def route_path(scope: Scope) -> str:
    """The request path below the application's route prefix (Serve sets ``root_path``)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path or "/"


class Ingress:
    """An ASGI app over a table of exact paths: ``{path: {method: handler}}``.

    An unknown path gets a JSON 404; a known path with another method gets a JSON 405 with the
    ``Allow`` header RFC 9110 requires. ``HEAD`` is served wherever ``GET`` is. Lifespan events
    are acknowledged (Serve runs the app under uvicorn's lifespan handling). With ``api_keys``
    that hold keys, a request to one of the ``protected`` paths needs a valid bearer key
    (auth.ApiKeys) and gets a JSON 401 before anything else runs, the method check included.
    """

    def __init__(
        self,
        routes: Mapping[str, Mapping[str, Handler]],
        api_keys: ApiKeys | None = None,
        protected: Collection[str] = (),
    ):
        self.routes: dict[str, dict[str, Handler]] = {}
        for path, methods in routes.items():
            table = {m.upper(): h for m, h in methods.items()}
            if "GET" in table:
                table.setdefault("HEAD", table["GET"])
            self.routes[path] = table
        self.api_keys = api_keys if api_keys is not None and api_keys.enabled else None
        self.protected = frozenset(protected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = route_path(scope)
        methods = self.routes.get(path)
        if methods is None:
            response = error_response(NotFound(f"{scope['method']} {path}: Not Found"))
        elif (
            self.api_keys is not None and path in self.protected and (denied := self._denied(scope))
        ):
            response = denied
        else:
            handler = methods.get(scope["method"])
            if handler is None:
                allow = ", ".join(sorted(methods))
                response = error_response(
                    MethodNotAllowed(f"{scope['method']} {path}: allowed methods are {allow}"),
                    headers={"Allow": allow},
                )
            else:
                try:
                    response = await handler(Request(scope, receive))
                except Exception:  # noqa: BLE001 - a JSON 500 with an id, never a bare one
                    response = internal_error("request")
        await response(scope, receive, send)

    def _denied(self, scope: Scope) -> Response | None:
        """A 401 unless the request carries a valid key (only called when keys are on)."""
        assert self.api_keys is not None
        try:
            self.api_keys.check(scope["headers"])
        except Unauthorized as err:
            return error_response(err)
        return None


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
