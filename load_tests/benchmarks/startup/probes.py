"""Waits on a running app: replicas answering under load, their memory reports."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx

from load_tests.benchmarks.startup.rows import first_answers
from load_tests.harness.load import Load

POLL_S = 0.1
IN_FLIGHT = 8
PROBE_TIMEOUT_S = 10.0


def _ok_at(url: str) -> float | None:
    """time.monotonic() when GET ``url`` was answered 200; None for anything else."""
    try:
        ok = httpx.get(url, timeout=PROBE_TIMEOUT_S).status_code == 200
    except httpx.HTTPError:
        return None
    return time.monotonic() if ok else None


def first_200(
    url: str, deadline: float, alive: Callable[[], bool], tick: Callable[[], None]
) -> float | None:
    """time.monotonic() at the end of the first GET ``url`` answered 200, polling every POLL_S
    with up to IN_FLIGHT GETs at once (Serve's fallback proxy holds a request while no replica
    runs: one held GET must not hide the next); None once past ``deadline`` or not ``alive``."""
    pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="probe")
    pending: set[Future[float | None]] = set()
    try:
        while time.monotonic() < deadline and alive():
            tick()
            done = {f for f in pending if f.done()}
            pending -= done
            oks = [t for t in (f.result() for f in done) if t is not None]
            if oks:
                return min(oks)
            if len(pending) < IN_FLIGHT:
                pending.add(pool.submit(_ok_at, url))
            time.sleep(POLL_S)
        return None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def serving(
    load: Load,
    known: set[str],
    want: int,
    deadline: float,
    tick: Callable[[], None] | None = None,
) -> None:
    """Wait until ``want`` replica ids not in ``known`` have answered ``load``'s requests,
    calling ``tick`` every poll."""
    while time.monotonic() < deadline:
        if tick is not None:
            tick()
        if len(first_answers(load.snapshot(), known)) >= want:
            return
        time.sleep(POLL_S)


def reports(base: str, ids: set[str], deadline: float) -> list[dict[str, Any]]:
    """The memory reports (GET /v1/memory) of these replicas once each has answered a request
    (``first_request_s`` set), or what there is at the deadline."""
    got: dict[str, dict[str, Any]] = {}
    while True:
        try:
            for rep in httpx.get(f"{base}/v1/memory", timeout=10.0).json()["replicas"]:
                if rep.get("replica_id") in ids:
                    got[rep["replica_id"]] = rep
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        done = len(got) == len(ids) and all(r.get("first_request_s") for r in got.values())
        if done or time.monotonic() > deadline:
            return [got[i] for i in sorted(got)]
        time.sleep(0.5)
