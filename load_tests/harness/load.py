"""The Python load generators of the reliability and start-up tools (httpx): ``Load``, a closed
loop of client threads that records every answer and the replica that gave it; ``open_loop``, an
open loop at a fixed rate in one or several processes; ``capacity``, the rate a closed loop gets
answered; and how an answer counts (``classify``, ``tally``): ok, failed (a deliberate JSON
refusal) or lost. The throughput benchmark's open loop is load_tests.harness.openloop (asyncio
processes with a lean HTTP/1.1 client, for tens of thousands of requests a second); its closed
loop is wrk (load_tests.harness.wrk).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from typing import Any

import httpx

from load_tests.harness.cluster import Target

BODY = {"input": [f"sentence {i} for the fault suite" for i in range(8)]}
CLIENTS = 8
MAX_REQUESTS_PER_CLIENT = 100_000  # a bound only: the stop event ends each client
CLIENT_TIMEOUT_S = 60.0


def classify(status: int | str, content_type: str) -> str:
    """'ok', 'failed' (a deliberate JSON refusal) or 'lost' for one answer (an int status) or
    one client error (a string)."""
    if isinstance(status, str):
        return "lost"
    if status == 200:
        return "ok"
    deliberate = status < 500 or status in (503, 504)
    return "failed" if deliberate and content_type.startswith("application/json") else "lost"


def tally(outcomes: list[tuple[int | str, str]]) -> tuple[int, int, dict[str, int]]:
    kinds = Counter(classify(s, ct) for s, ct in outcomes)
    statuses = Counter(str(s) if isinstance(s, int) else s.split("(")[0] for s, _ in outcomes)
    return kinds["lost"], kinds["failed"], dict(statuses)


Result = tuple[float, float, int | str, str, str]


class Load:
    """``clients`` threads posting BODY until stopped, each at most ``max_requests`` times:
    (send time, seconds taken, status, content type, the replica that answered or "")."""

    def __init__(
        self,
        url: str,
        clients: int = CLIENTS,
        max_requests: int = MAX_REQUESTS_PER_CLIENT,
        body: dict[str, Any] | None = None,
    ):
        self.url = url
        self.body = BODY if body is None else body
        self.max_requests = max_requests
        self.stop = threading.Event()
        self.results: list[Result] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as client:
            for _ in range(self.max_requests):
                if self.stop.is_set():
                    return
                t0 = time.monotonic()
                try:
                    resp = client.post(self.url, json=self.body)
                    out: tuple[int | str, str, str] = (
                        resp.status_code,
                        resp.headers.get("content-type", ""),
                        resp.headers.get("x-serve-app-replica", ""),
                    )
                except httpx.HTTPError as exc:
                    out = (f"{type(exc).__name__}({exc})", "", "")
                with self._lock:
                    self.results.append((t0, time.monotonic() - t0, *out))

    def snapshot(self) -> list[Result]:
        with self._lock:
            return list(self.results)

    def tally(self, results: list[Result] | None = None) -> tuple[int, int, dict[str, int]]:
        """``tally`` of these results (all of them by default)."""
        rows = self.snapshot() if results is None else results
        return tally([(r[2], r[3]) for r in rows])

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=CLIENT_TIMEOUT_S + 10.0)


def capacity(
    target: Target,
    seconds: float = 4.0,
    body: dict[str, Any] | None = None,
    clients: int = CLIENTS,
) -> float:
    """Requests/s the closed-loop load gets answered (200) now."""
    with Load(target.url, clients=clients, body=body) as load:
        time.sleep(seconds)
    ok = [r for r in load.snapshot() if r[2] == 200]
    return len(ok) / seconds


Outcome = tuple[int | str, str, float]  # status (or the client error), content type, seconds


async def _open_loop(
    url: str, rate: float, duration_s: float, body: bytes, limit_s: float
) -> list[Outcome]:
    """Send ``body`` at ``rate`` per second for ``duration_s``, whatever the answers take
    (bounded: at most rate x duration requests, and ``limit_s`` in all: a request still
    unanswered then is cancelled and counted as ``unanswered``)."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    headers = {"Content-Type": "application/json"}
    out: list[Outcome] = []
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S, limits=limits) as client:

        async def one() -> None:
            t0 = time.monotonic()
            try:
                resp = await client.post(url, content=body, headers=headers)
                ctype = resp.headers.get("content-type", "")
                out.append((resp.status_code, ctype, time.monotonic() - t0))
            except httpx.HTTPError as exc:
                out.append((f"{type(exc).__name__}({exc})", "", time.monotonic() - t0))

        t0 = time.monotonic()
        tasks = []
        for i in range(int(rate * duration_s)):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.monotonic() - t0 > duration_s:
                break  # the client fell behind the schedule: what it sent is what it offered
            tasks.append(asyncio.create_task(one()))
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, t0 + limit_s - time.monotonic()))
        for task in pending:
            task.cancel()
        out.extend(("unanswered", "", limit_s) for _ in pending)
    return out


def _open_loop_process(job: tuple[str, float, float, bytes, float]) -> list[Outcome]:
    return asyncio.run(_open_loop(*job))


def open_loop(
    url: str,
    rate: float,
    duration_s: float,
    body: dict[str, Any],
    processes: int = 1,
    limit_s: float | None = None,
) -> list[Outcome]:
    """The open loop at ``rate`` per second, split over ``processes`` client processes (one
    Python process sends about a thousand requests a second at most)."""
    data = json.dumps(body).encode()
    limit = limit_s if limit_s is not None else duration_s + CLIENT_TIMEOUT_S
    if processes <= 1:
        return asyncio.run(_open_loop(url, rate, duration_s, data, limit))
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    job = (url, rate / processes, duration_s, data, limit)
    # concurrent.futures, not multiprocessing.Pool: a client process that dies raises
    # BrokenProcessPool here instead of being replaced forever.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=ctx) as pool:
        parts = list(pool.map(_open_loop_process, [job] * processes, timeout=limit + 60.0))
    return [o for part in parts for o in part]


def pct(sorted_s: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of sorted seconds, rounded to ms; None when empty."""
    if not sorted_s:
        return None
    return round(sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))], 3)


def first_ok(target: Target, since: float, timeout_s: float = 60.0) -> float | None:
    """Seconds from ``since`` until a normal request is answered 200 (None: not in time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.post(target.url, json=BODY, timeout=30.0).status_code == 200:
                return round(time.monotonic() - since, 3)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return None
