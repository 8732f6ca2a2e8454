"""Request ids: one id per request, taken from the client's ``x-request-id`` when it is safe or
made here, echoed in the response and carried by every log line of the request.

Where the id lives while a request runs:

- ``current()``: this module's context variable, set by the HTTP edge (http.Ingress) for the
  request's task; error bodies read it (``error.request_id``).
- Serve's own request context (startup/ray_compat.serve_request_context), whose ``request_id``
  Serve's log filter writes on each record of the ``ray.serve`` logger: the JSON field
  ``request_id`` (``logging_config: {encoding: JSON}``), or the text line's id. Serve 2.60's
  direct ingress sets it from ``x-request-id`` as sent (unchecked) or to a new uuid4; a bad id
  is replaced there too, so that Serve's lines and ours name the same id.
- The response: Serve's RequestIdMiddleware, around every HTTP server Serve runs, appends
  ``X-Request-ID`` with the id as the client sent it; under direct ingress it is made to
  append ours instead (``echoed_by_serve``). Outside Serve the edge adds the header.
- The model thread: a batch runs under the ids of its requests, joined by commas (``in_batch``),
  so a batch's log lines (a user model's error id among them) name every request in it.

``attach_to_serve`` (once per replica) sends the ``serve_app`` logger's records through Serve's
``ray.serve`` logger, into the replica's log file under the Ray session's ``logs/serve/``:
without it they reach only the worker's stderr, and INFO not at all.

A client's id is kept when it is 1 to ``MAX_CHARS`` characters of ``[A-Za-z0-9._:+/=@-]``:
uuids, hex, W3C trace ids, base64 and the ``Root=1-...`` of AWS load balancers pass. Heroku's
router keeps ids of letters, digits and ``+/=-`` up to 200 characters; Rails strips all but word
characters, ``-`` and ``@``. No space or comma (a batch's ids are joined by commas), no quote,
no control character: a bad id is replaced by a new one, never echoed or logged.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import replace
from typing import Any, TypeVar

from serve_app.startup.ray_compat import serve_echoes_request_id, serve_request_context

HEADER = "x-request-id"
HEADER_BYTES = HEADER.encode()
MAX_CHARS = 128
_SAFE = re.compile(rb"[A-Za-z0-9._:+/=@-]{1,%d}" % MAX_CHARS)
SERVE_LOGGER = "ray.serve"  # Serve's documented logger for a deployment's own lines

_current: ContextVar[str] = ContextVar("serve_app_request_id", default="")
# Serve's request context and its dataclass (attach_to_serve binds them in a replica).
_serve: tuple[ContextVar[Any], type[Any]] | None = None
_app: dict[str, str] = {}  # the replica's application, for a batch's lines

R = TypeVar("R")


def accept(value: bytes) -> str | None:
    """The client's id when it is safe to echo and log, else None."""
    return value.decode("ascii") if _SAFE.fullmatch(value) else None


def new_id() -> str:
    """A fresh id: 32 hex digits (random.getrandbits, as Serve's own ids, is cheaper than
    uuid4's os.urandom; the id is a label, not a secret)."""
    return f"{random.getrandbits(128):032x}"


def current() -> str:
    """The id of the request this task serves ("" outside one)."""
    return _current.get()


def begin(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """Pick the request's id from its ASGI headers and make it current, here and in Serve's
    context: the client's when it is safe, Serve's own when the client sent none (so that
    Serve's lines and ours agree), a new one otherwise (a bad one is dropped)."""
    sent: bytes | None = None
    for name, value in headers:
        if name == HEADER_BYTES:
            sent = value
            break
    rid = accept(sent) if sent is not None else None
    if _serve is None:
        rid = rid or new_id()
    else:
        var, make = _serve
        ctx = var.get()
        serve_id = ctx.request_id if ctx is not None else ""
        if rid is None:
            rid = serve_id if sent is None and serve_id else new_id()
        if ctx is None:
            var.set(make(request_id=rid))
        elif serve_id != rid:
            var.set(replace(ctx, request_id=rid))
    _current.set(rid)
    return rid


def echoed_by_serve(send: Any, request_id: str) -> bool:
    """Whether Serve answers with ``x-request-id`` itself: in a replica it always does (its
    RequestIdMiddleware, around the replica's own server and the proxy's), with the id as
    sent; where that middleware is within reach it is made to send ``request_id``. Outside
    Serve (a bare ASGI server) the caller adds the header."""
    if _serve is None:
        return False
    serve_echoes_request_id(send, request_id)
    return True


def in_batch(request_ids: Iterable[str], run: Callable[[Any], R], arg: Any) -> R:
    """``run(arg)`` (on the model thread) with the batch's request ids, each once and in order,
    joined by commas, as the current id of its log lines."""
    rid = ",".join(dict.fromkeys(r for r in request_ids if r))
    token = _current.set(rid)
    serve_token = None
    if _serve is not None:
        serve_token = _serve[0].set(_serve[1](request_id=rid, **_app))
    try:
        return run(arg)
    finally:
        if _serve is not None and serve_token is not None:
            _serve[0].reset(serve_token)
        _current.reset(token)


class _ToServe(logging.Handler):
    """Hands each record to Serve's logger, whose handlers add the request context and the
    replica's names and write the replica's log file (JSON or text, per logging_config)."""

    def __init__(self, target: logging.Logger):
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.handle(record)


def attach_to_serve(logger_name: str = "serve_app") -> None:
    """In a replica: bind Serve's request context, and send ``logger_name``'s records (at
    Serve's log level, ``logging_config.log_level``) through Serve's logger. Idempotent."""
    global _serve
    from ray import serve
    from ray.serve.exceptions import RayServeException

    _serve = serve_request_context()
    try:
        _app.update(app_name=serve.get_replica_context().app_name)
    except RayServeException:  # not in a replica (a test building one by hand)
        pass
    ours = logging.getLogger(logger_name)
    serve_logger = logging.getLogger(SERVE_LOGGER)
    if not any(isinstance(h, _ToServe) for h in ours.handlers):
        ours.addHandler(_ToServe(serve_logger))
    ours.setLevel(serve_logger.getEffectiveLevel())
    ours.propagate = False
