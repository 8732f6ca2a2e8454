"""serving.requestid: which client ids are kept, the id a request gets (beside Serve's own),
the header and error body that echo it, and the ids a batch's log lines carry."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request
from starlette.responses import Response

from serve_app.errors import BadRequest
from serve_app.serving import requestid
from serve_app.serving.batcher import Batcher
from serve_app.serving.http import Ingress, guarded, json_response
from serve_app.startup.ray_compat import serve_request_context

FRESH = re.compile(r"[0-9a-f]{32}")


@pytest.mark.parametrize(
    "value",
    [
        "0f8fad5b-d9cb-469f-a165-70867728950e",  # uuid4, as Serve makes them
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # W3C traceparent
        "Root=1-5759e988-bd862e3fe1be46a994272793",  # AWS load balancers
        "YWJjZGVm+/==",  # base64
        "req_1.a:b@c",
        "x" * requestid.MAX_CHARS,
    ],
)
def test_safe_ids_are_kept(value: str) -> None:
    assert requestid.accept(value.encode()) == value


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"x" * (requestid.MAX_CHARS + 1),
        b"a b",
        b"a,b",  # a batch's ids are joined by commas
        b'a"b',
        b"a\nb",
        b"a\tb",
        b"<script>",
        b"caf\xc3\xa9",
        b"\xff",
        b"a;b",
    ],
)
def test_unsafe_ids_are_refused(value: bytes) -> None:
    assert requestid.accept(value) is None


@given(st.binary(max_size=200))
def test_whatever_is_kept_is_short_ascii_of_the_safe_set(value: bytes) -> None:
    kept = requestid.accept(value)
    if kept is not None:
        assert 1 <= len(kept) <= requestid.MAX_CHARS
        assert re.fullmatch(r"[A-Za-z0-9._:+/=@-]+", kept)


def _begin(headers: list[tuple[bytes, bytes]]) -> tuple[str, str]:
    """begin() in a context of its own: (the id, current() after it)."""

    def run() -> tuple[str, str]:
        return requestid.begin(headers), requestid.current()

    return contextvars.Context().run(run)


def test_begin_keeps_a_safe_id_and_replaces_a_missing_or_bad_one(monkeypatch) -> None:
    monkeypatch.setattr(requestid, "_serve", None)
    assert _begin([(b"host", b"x"), (b"x-request-id", b"abc-1")]) == ("abc-1", "abc-1")
    rid, now = _begin([])
    assert FRESH.fullmatch(rid) and now == rid
    rid, _ = _begin([(b"x-request-id", b"a b")])
    assert FRESH.fullmatch(rid)
    assert _begin([])[0] != _begin([])[0]
    assert requestid.current() == ""  # outside a request


@pytest.fixture
def serve_context(monkeypatch) -> Iterator[tuple[contextvars.ContextVar, type]]:
    """Serve's own request context (the real one, as a replica binds it)."""
    bound = serve_request_context()
    monkeypatch.setattr(requestid, "_serve", bound)
    yield bound


def test_begin_agrees_with_serves_context(serve_context) -> None:
    var, make = serve_context

    def request(sent: bytes | None, serve_id: str) -> tuple[str, str, str]:
        var.set(make(request_id=serve_id, app_name="app"))
        headers = [] if sent is None else [(b"x-request-id", sent)]
        rid = requestid.begin(headers)
        ctx = var.get()
        assert ctx.app_name == "app"  # the rest of Serve's context is kept
        return rid, ctx.request_id, requestid.current()

    # none sent: Serve made one (uuid4), and it is the request's
    assert contextvars.Context().run(request, None, "serve-made") == ("serve-made",) * 3
    # a safe one: Serve took it as sent, and so do we
    assert contextvars.Context().run(request, b"mine", "mine") == ("mine",) * 3
    # a bad one, which Serve took as sent: replaced in Serve's context too
    rid, in_serve, now = contextvars.Context().run(request, b"a b", "a b")
    assert FRESH.fullmatch(rid) and in_serve == rid == now


def test_a_batch_runs_under_its_requests_ids_for_serves_log_filter(serve_context) -> None:
    from ray.serve._private.logging_utils import ServeContextFilter

    var, _ = serve_context
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    handler.addFilter(ServeContextFilter())  # Serve's filter, as on the replica's log file
    log = logging.getLogger("test_requestid.batch")
    log.addHandler(handler)
    log.propagate = False

    def run(items: list[str]) -> list[str]:
        log.warning("a batch of %d", len(items))
        return [requestid.current(), var.get().request_id]

    try:
        with ThreadPoolExecutor(1) as pool:
            out = pool.submit(requestid.in_batch, ["r1", "r1", "r2", ""], run, ["a"]).result()
            after = pool.submit(lambda: (requestid.current(), var.get())).result()
    finally:
        log.removeHandler(handler)
    assert out == ["r1,r2", "r1,r2"]
    assert seen[0].request_id == "r1,r2"  # type: ignore[attr-defined]
    assert after == ("", None)  # the thread's context is restored for the next batch


async def _ok(request: Request) -> Response:
    return json_response({"id": requestid.current()})


async def _bad(request: Request) -> Response:
    async def decode() -> Response:
        raise BadRequest("no")

    return await guarded(decode())  # as the inference handler answers its errors


async def _crash(request: Request) -> Response:
    raise RuntimeError("bug")


@pytest.mark.anyio
async def test_every_answer_echoes_the_id_and_errors_name_it(monkeypatch) -> None:
    monkeypatch.setattr(requestid, "_serve", None)
    app = Ingress({"/ok": {"GET": _ok}, "/bad": {"GET": _bad}, "/crash": {"GET": _crash}})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        ok = await client.get("/ok", headers={"x-request-id": "r-1"})
        assert ok.headers["x-request-id"] == "r-1" and ok.json() == {"id": "r-1"}
        for path, method, status in [
            ("/bad", "GET", 400),
            ("/nope", "GET", 404),
            ("/ok", "POST", 405),
            ("/crash", "GET", 500),
        ]:
            resp = await client.request(method, path, headers={"x-request-id": "e-1"})
            assert resp.status_code == status
            assert resp.headers.get_list("x-request-id") == ["e-1"]
            assert resp.json()["error"]["request_id"] == "e-1"
        odd = await client.get("/nope", headers={"x-request-id": "x\x7fy"})
        assert FRESH.fullmatch(odd.headers["x-request-id"])
        assert odd.json()["error"]["request_id"] == odd.headers["x-request-id"]
        none = await client.get("/ok")
        assert FRESH.fullmatch(none.headers["x-request-id"])


def test_the_batchers_model_thread_sees_its_batchs_ids_not_the_first_requests(
    monkeypatch,
) -> None:
    seen: list[str] = []
    worker_ids: list[str] = []
    work = Batcher._work

    async def watched(self: Batcher) -> None:
        worker_ids.append(requestid.current())
        await work(self)

    monkeypatch.setattr(Batcher, "_work", watched)
    gate = threading.Event()

    def run_batch(items: list[int]) -> list[int]:
        gate.wait(5.0)
        seen.append(requestid.current())
        return items

    async def main() -> None:
        pool = ThreadPoolExecutor(1)
        batcher: Batcher[int, int] = Batcher(run_batch, pool, 8, 0.0)

        async def one(rid: str, items: list[int]) -> list[int]:
            requestid.begin([(b"x-request-id", rid.encode())])
            return await batcher.submit(items)

        first = asyncio.create_task(one("first", [1]))
        await asyncio.sleep(0.05)  # the first batch holds the model thread
        rest = [asyncio.create_task(one(r, [2, 3])) for r in ("b", "c")]
        await asyncio.sleep(0.05)
        gate.set()
        assert await first == [1] and [await t for t in rest] == [[2, 3], [2, 3]]
        batcher.close()
        pool.shutdown()

    monkeypatch.setattr(requestid, "_serve", None)
    asyncio.run(main())
    assert seen == ["first", "b,c"]
    assert worker_ids == [""]  # the worker task, made in the first request, is no request's


class _DirectIngress:
    """As Serve's direct ingress calls the app: with a ``send`` of its own around the server's
    (ray/serve/_private/replica.py: send_user_message)."""

    def __init__(self, app: Ingress):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        async def send_user_message(message) -> None:  # type: ignore[no-untyped-def]
            await send(message)

        await self.app(scope, receive, send_user_message)


@pytest.mark.anyio
async def test_under_serves_own_middleware_the_answer_has_one_header_never_a_bad_id(
    serve_context,
) -> None:
    """Serve wraps each HTTP server it runs in RequestIdMiddleware, which echoes the id as
    sent: in a replica the edge adds no header of its own and makes the middleware echo the
    request's id."""
    from ray.serve._private.http_util import RequestIdMiddleware

    app = RequestIdMiddleware(_DirectIngress(Ingress({"/ok": {"GET": _ok}})))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        ok = await client.get("/ok", headers={"x-request-id": "r-2"})
        assert ok.headers.get_list("x-request-id") == ["r-2"] and ok.json() == {"id": "r-2"}
        bad = await client.get("/nope", headers={"x-request-id": "a b<c>"})
        (echoed,) = bad.headers.get_list("x-request-id")
        assert FRESH.fullmatch(echoed) and bad.json()["error"]["request_id"] == echoed
        none = await client.get("/ok")  # Serve's middleware made one: the request's id
        assert none.headers.get_list("x-request-id") == [none.json()["id"]]
