"""serve_app.serving.http: exact-path routing with JSON 404/405, orjson rendering, body limits."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request
from starlette.responses import Response

from serve_app.errors import BadRequest, Overloaded, PayloadTooLarge, UnsupportedContentEncoding
from serve_app.serving.auth import ApiKeys
from serve_app.serving.http import (
    BodyBytes,
    Ingress,
    error_response,
    guarded,
    json_response,
    read_body,
    route_path,
)

FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@given(st.lists(FLOAT32, min_size=1, max_size=64))
def test_float32_vectors_render_to_the_same_float32_values(values: list[float]) -> None:
    vec = np.array(values, dtype=np.float32)
    body = json_response({"embedding": vec}).body
    parsed = np.array(json.loads(body)["embedding"], dtype=np.float64).astype(np.float32)
    np.testing.assert_array_equal(parsed, vec)


def test_float32_rendering_is_short() -> None:
    rng = np.random.default_rng(0)
    vec = rng.standard_normal(384).astype(np.float32)
    vec /= np.linalg.norm(vec)
    text = json_response(vec).body.decode()
    for number in text[1:-1].split(","):
        digits = number.lstrip("-").split("e")[0].replace(".", "").lstrip("0")
        assert len(digits) <= 9, number  # FLT_DECIMAL_DIG: never the double's 17 digits
    assert json_response(np.zeros(2, dtype=np.float32)).body == b"[0.0,0.0]"


async def _echo(request: Request) -> Response:
    return json_response({"path": request.url.path, "body": (await request.body()).decode()})


def _client(root_path: str = "") -> httpx.AsyncClient:
    app = Ingress({"/v1/echo": {"POST": _echo}, "/healthz": {"GET": _echo}})
    transport = httpx.ASGITransport(app=app, root_path=root_path)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


@pytest.mark.anyio
async def test_routes_404_and_405_with_allow() -> None:
    async with _client() as client:
        ok = await client.post("/v1/echo", content=b"hi")
        assert ok.status_code == 200 and ok.json()["body"] == "hi"
        missing = await client.get("/v1/nothing")
        assert missing.status_code == 404
        assert missing.json()["error"]["type"] == "not_found_error"
        wrong = await client.get("/v1/echo")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
        assert "allowed methods are POST" in wrong.json()["error"]["message"]
        head = await client.head("/healthz")  # HEAD is served wherever GET is
        assert head.status_code == 200
        assert (await client.delete("/healthz")).headers["allow"] == "GET, HEAD"


@pytest.mark.anyio
async def test_routes_below_a_route_prefix() -> None:
    async with _client(root_path="/images") as client:
        assert (await client.post("/images/v1/echo", content=b"x")).status_code == 200


@pytest.mark.anyio
async def test_a_route_prefix_that_is_a_route_serves_that_route() -> None:
    # configs/rag-stack.yaml: each model's application sits at its own route on one base URL
    async with _client(root_path="/v1/echo") as client:
        ok = await client.post("/v1/echo", content=b"x")
        assert ok.status_code == 200 and ok.json()["body"] == "x"
        wrong = await client.get("/v1/echo")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
        assert (await client.get("/v1/echo/healthz")).status_code == 200
    async with _client(root_path="/base/v1/echo") as client:  # the same below a base path
        assert (await client.post("/base/v1/echo", content=b"x")).status_code == 200
    async with _client(root_path="/images") as client:  # a prefix that is no route: a 404
        missing = await client.post("/images", content=b"x")
        assert missing.status_code == 404 and "error" in missing.json()


@pytest.mark.anyio
async def test_the_route_at_its_prefix_needs_a_key_when_keys_are_set() -> None:
    app = Ingress({"/v1/echo": {"POST": _echo}}, ApiKeys(["k1"]), protected=["/v1/echo"])
    transport = httpx.ASGITransport(app=app, root_path="/v1/echo")
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.post("/v1/echo", content=b"x")).status_code == 401
        ok = await client.post("/v1/echo", content=b"x", headers={"authorization": "Bearer k1"})
        assert ok.status_code == 200


def test_route_path_strips_the_root_path() -> None:
    assert route_path({"path": "/images/v1/classify", "root_path": "/images"}) == "/v1/classify"
    assert route_path({"path": "/images", "root_path": "/images"}) == "/"
    assert route_path({"path": "/v1/models", "root_path": ""}) == "/v1/models"


@pytest.mark.anyio
async def test_lifespan_is_acknowledged() -> None:
    sent: list[str] = []
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive() -> dict[str, str]:
        return next(messages)

    async def send(message: dict[str, str]) -> None:
        sent.append(message["type"])

    await Ingress({})({"type": "lifespan"}, receive, send)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def _request(body: bytes, headers: list[tuple[bytes, bytes]]) -> Request:
    chunks = [body[:3], body[3:]]

    async def receive() -> dict[str, object]:
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    return Request({"type": "http", "method": "POST", "headers": headers}, receive)


@pytest.mark.anyio
async def test_read_body_limits() -> None:
    assert await read_body(_request(b"abcdef", []), 6) == b"abcdef"
    with pytest.raises(Exception, match="at most 5"):
        await read_body(_request(b"abcdef", [(b"content-length", b"6")]), 5)
    with pytest.raises(Exception, match="exceeds 5 bytes"):
        await read_body(_request(b"abcdef", []), 5)  # a lying or missing Content-Length
    with pytest.raises(BadRequest, match="not an integer"):
        await read_body(_request(b"a", [(b"content-length", b"x")]), 5)


@pytest.mark.anyio
@pytest.mark.parametrize("coding", [b"gzip", b"br", b" GZIP ", b"identity, gzip"])
async def test_a_compressed_body_is_refused_before_it_is_read(coding: bytes) -> None:
    request = _request(b"abcdef", [(b"content-encoding", coding)])
    with pytest.raises(UnsupportedContentEncoding, match="send the body uncompressed") as info:
        await read_body(request, 100)
    response = error_response(info.value)
    assert response.status_code == 415
    assert response.headers["accept-encoding"] == "identity"
    assert json.loads(response.body)["error"]["code"] == "unsupported_content_encoding"


@pytest.mark.anyio
@pytest.mark.parametrize("coding", [b"identity", b"IDENTITY", b""])
async def test_an_identity_coding_is_read_as_it_is(coding: bytes) -> None:
    assert await read_body(_request(b"abcdef", [(b"content-encoding", coding)]), 6) == b"abcdef"


def test_error_response_carries_the_errors_own_headers() -> None:
    resp = error_response(Overloaded("full", retry_after_s=3), headers={"x-extra": "1"})
    assert resp.status_code == 503
    assert (resp.headers["retry-after"], resp.headers["x-extra"]) == ("3", "1")
    assert json.loads(resp.body)["error"]["type"] == "overloaded"
    assert Overloaded("x", retry_after_s=0).headers() == {"Retry-After": "1"}  # never 0


@pytest.mark.anyio
async def test_guarded_answers_504_past_the_timeout_and_cancels_the_work() -> None:
    cancelled = []

    async def slow() -> Response:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return json_response({})

    resp = await guarded(slow(), timeout_s=0.05)
    assert resp.status_code == 504 and cancelled == [True]
    err = json.loads(resp.body)["error"]
    assert err["type"] == "timeout" and "longer than 0.05 s" in err["message"]


@pytest.mark.anyio
async def test_guarded_keeps_a_timeout_of_the_work_itself_a_500() -> None:
    async def own_timeout() -> Response:
        raise TimeoutError("a socket inside the work")

    resp = await guarded(own_timeout(), timeout_s=10.0)
    assert resp.status_code == 500
    assert json.loads(resp.body)["error"]["type"] == "inference_error"


@pytest.mark.anyio
async def test_guarded_turns_our_errors_into_their_status() -> None:
    async def full() -> Response:
        raise Overloaded("queue full", retry_after_s=2)

    resp = await guarded(full(), timeout_s=1.0)
    assert (resp.status_code, resp.headers["retry-after"]) == (503, "2")


@pytest.mark.anyio
async def test_a_handler_that_raises_gets_a_json_500_with_an_id() -> None:
    async def broken(request: Request) -> Response:
        raise RuntimeError("registry unreachable")

    transport = httpx.ASGITransport(app=Ingress({"/v1/memory": {"GET": broken}}))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        resp = await client.get("/v1/memory")
    assert resp.status_code == 500
    err = resp.json()["error"]
    assert err["message"].startswith("request failed; error id ")
    assert "registry unreachable" not in resp.text  # the traceback stays in the log


@pytest.mark.anyio
async def test_body_bytes_in_flight_are_bounded_and_released() -> None:
    budget = BodyBytes(10, retry_after_s=lambda: 3)
    first = budget.hold()
    # a declared length is held before a byte is read
    assert await read_body(_request(b"abcdef", [(b"content-length", b"6")]), 100, first) == (
        b"abcdef"
    )
    assert (budget.held_bytes, first.held_bytes) == (6, 6)
    second = budget.hold()
    with pytest.raises(Overloaded) as busy:  # 6 + 5 > 10: a 503 naming the bound
        await read_body(_request(b"12345", [(b"content-length", b"5")]), 100, second)
    assert busy.value.status_code == 503 and busy.value.headers() == {"Retry-After": "3"}
    assert "args.max_body_bytes_in_flight" in busy.value.message
    assert busy.value.code == "body_bytes_in_flight" and budget.refused_requests == 1
    first.release()
    too_large = budget.hold()
    with pytest.raises(PayloadTooLarge, match="max_body_bytes_in_flight"):  # alone too large
        await read_body(_request(b"x" * 11, []), 100, too_large)  # chunked: found while reading
    assert budget.held_bytes == 3  # its first chunk, until the handler's release
    too_large.release()
    second.release()
    assert budget.held_bytes == 0
    # without a declared length the bytes are held as they arrive, then released once
    third = budget.hold()
    assert await read_body(_request(b"0123456789", []), 100, third) == b"0123456789"
    assert budget.held_bytes == 10
    third.release()
    third.release()
    assert budget.held_bytes == 0
