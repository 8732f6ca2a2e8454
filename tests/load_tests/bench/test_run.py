"""load_tests.bench.run: one open-loop rate against a live server, HTTP errors, client drops and
a stalled client (latency from the scheduled time)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from load_tests import bench, payloads
from tests.load_tests.bench.live_app import embeddings


def test_run_rate_against_live_server(server_url: str) -> None:
    url = f"{server_url}/v1/embeddings"
    reqs = bench.build_requests(url, "embeddings", texts="mixed")
    res = asyncio.run(bench.run_rate(reqs, rate_per_s=20.0, duration_s=2.0, warmup_s=0.2, seed=3))
    expected = bench.poisson_schedule(20.0, 2.2, seed=3)
    assert res.scheduled == len(expected) == len(res.records)
    assert not res.truncated
    s = res.summary
    assert s.requests + s.warmup_requests == len(expected)
    assert s.errors == 0 and s.ok == s.requests > 0
    assert all(r.latency_s is not None and r.latency_s > 0 for r in res.records)
    assert all(r.status == 200 for r in res.records)
    # Each record keeps its scheduled time.
    assert [r.scheduled_s for r in res.records] == pytest.approx(expected)


def test_run_rate_counts_http_errors_and_client_drops() -> None:
    async def slow(request: Request) -> JSONResponse:
        await asyncio.sleep(0.3)
        return await embeddings(request)

    app = Starlette(routes=[Route("/v1/embeddings", slow, methods=["POST"])])
    url = "http://testserver/v1/embeddings"
    reqs = [
        bench.PreparedRequest(
            "POST", url, {"Content-Type": "application/json"}, payloads.embeddings_body(text)
        )
        for text in ("ok", "fail")
    ]

    async def go() -> bench.RateResult:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
            return await bench.run_rate(reqs, 40.0, 1.0, seed=1, max_in_flight=4, client=client)

    res = asyncio.run(go())
    s = res.summary
    assert s.requests == res.scheduled
    counts = s.error_counts
    assert counts.get("dropped_client", 0) > 0  # 40/s x 0.3 s = ~12 wanted in flight, cap 4
    assert counts.get("http_507:out_of_memory", 0) > 0
    assert s.ok + sum(counts.values()) == s.requests
    assert s.latency_s is not None and s.latency_s["p50"] >= 0.3


class _StallingClient:
    """Answers 200 at once, but blocks the event loop for 0.5 s on its first request."""

    def __init__(self) -> None:
        self.calls = 0

    async def request(self, method: str, url: str, **kwargs: object) -> httpx.Response:
        self.calls += 1
        if self.calls == 1:
            time.sleep(0.5)  # a stalled client: nothing else can be sent meanwhile
        return httpx.Response(200, json={})


def test_run_rate_measures_from_scheduled_time_when_the_client_stalls() -> None:
    reqs = [bench.PreparedRequest("POST", "http://127.0.0.1:1/x", {}, b"{}")]
    res = asyncio.run(bench.run_rate(reqs, 50.0, 1.0, seed=4, client=_StallingClient()))
    first = res.records[0]
    stall_end_s = first.scheduled_s + 0.5
    stalled = [r for r in res.records[1:] if r.scheduled_s < stall_end_s]
    assert len(stalled) >= 5  # 50/s over 0.5 s: ~25 expected
    for r in stalled:
        # Latency counts the time spent waiting for the stall, not just the (instant) request.
        assert r.latency_s is not None and r.scheduled_s + r.latency_s >= stall_end_s - 0.02
        assert r.send_lag_s is not None and r.send_lag_s > 0.0
    assert res.summary.latency_s is not None and res.summary.latency_s["max"] >= 0.45
