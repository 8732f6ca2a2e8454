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
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    ServeAppError,
    Unauthorized,
    UnsupportedContentEncoding,
)
from serve_app.serving import requestid
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
    ``headers``; the body names the request's id (``error.request_id``, requestid.py)."""
    count_error(err)  # 503s and 504s, by reason (serving/metrics)
    own = err.headers()
    if headers:
        own.update(headers)
    body = err.to_json()
    body["error"]["request_id"] = requestid.current() or None
    return json_response(body, err.status_code, own or None)


class BodyBytes:
    """The request-body bytes a replica holds at once, from reading a body until its response,
    bounded by ``limit_bytes`` (args.max_body_bytes_in_flight): the queue bounds items, and
    512 requests of 8 MiB bodies, joined once more when read, would be several GiB. A body
    larger than the bound gets a 413; one that would pass it while others hold it gets a 503
    with ``retry_after_s()``, as a full queue does (batcher.check_room)."""

    def __init__(self, limit_bytes: int, retry_after_s: Callable[[], int] = lambda: 1):
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self.refused_requests = 0
        self._retry_after_s = retry_after_s

    def hold(self) -> BodyHold:
        """A request's share, grown as its body arrives; release it on every path."""
        return BodyHold(self)

    def _reserve(self, more_bytes: int, body_bytes: int) -> None:
        if body_bytes > self.limit_bytes:
            raise PayloadTooLarge(
                f"request body is {body_bytes} bytes; this replica holds at most "
                f"{self.limit_bytes} bytes of bodies at once (args.max_body_bytes_in_flight)"
            )
        if self.held_bytes + more_bytes > self.limit_bytes:
            self.refused_requests += 1
            raise Overloaded(
                f"this replica holds {self.held_bytes} bytes of request bodies; at most "
                f"{self.limit_bytes} (args.max_body_bytes_in_flight); retry later or add "
                "replicas",
                retry_after_s=self._retry_after_s(),
                code="body_bytes_in_flight",
            )
        self.held_bytes += more_bytes


class BodyHold:
    """One request's bytes in a ``BodyBytes``."""

    __slots__ = ("budget", "held_bytes")

    def __init__(self, budget: BodyBytes):
        self.budget = budget
        self.held_bytes = 0

    def grow_to(self, body_bytes: int) -> None:
        if body_bytes > self.held_bytes:
            self.budget._reserve(body_bytes - self.held_bytes, body_bytes)
            self.held_bytes = body_bytes

    def release(self) -> None:
        self.budget.held_bytes -= self.held_bytes
        self.held_bytes = 0


async def read_body(request: Request, max_bytes: int, hold: BodyHold | None = None) -> bytes:
    """The request body, refusing more than ``max_bytes`` before or while reading it; with
    ``hold``, its bytes are held there (the declared length before a byte is read). A
    compressed body is refused before it is read: decoding its bytes as they are would fail with
    an error that names the wrong problem."""
    encoding = request.headers.get("content-encoding", "").strip()
    if encoding and encoding.lower() != "identity":
        raise UnsupportedContentEncoding(
            f"Content-Encoding {encoding!r} is not supported: send the body uncompressed",
            code="unsupported_content_encoding",
        )
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
        if hold is not None:
            hold.grow_to(declared_bytes)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes (args.max_body_bytes)")
        if hold is not None:
            hold.grow_to(size)
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
    ``Allow`` header RFC 9110 requires. ``HEAD`` is served wherever ``GET`` is. Every answer
    carries the request's id in ``x-request-id`` (requestid.begin picks it). Lifespan events
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
        self._at_prefix: dict[str, str | None] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        request_id = requestid.begin(scope["headers"])
        path = route_path(scope)
        methods = self.routes.get(path)
        if methods is None and path == "/" and (own := self._route_at(scope)) is not None:
            path, methods = own, self.routes[own]
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
        if not requestid.echoed_by_serve(send, request_id):
            response.raw_headers.append((requestid.HEADER_BYTES, request_id.encode()))
        await response(scope, receive, send)

    def _route_at(self, scope: Scope) -> str | None:
        """The route an application's prefix ends with, as when the prefix is its own route
        (configs/rag-stack.yaml puts each model at its route on one base URL, and
        ``/base/v1/rerank`` does the same below a base path): the prefix itself serves it.
        Cached per prefix (set by Serve, not by the client)."""
        root: str = scope.get("root_path", "")
        if root not in self._at_prefix:
            ends = [r for r in self.routes if r != "/" and (root == r or root.endswith(r))]
            self._at_prefix[root] = max(ends, key=len) if ends else None
        return self._at_prefix[root]

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
