"""The load client (open-loop Poisson from separate processes) and the rate sweep."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from load_tests.side_by_side.analysis import client_saturated, next_rate, point_passes
from load_tests.side_by_side.util import _ms, log


def _run_loop(coro: Any) -> Any:
    try:
        import uvloop

        if hasattr(uvloop, "run"):
            return uvloop.run(coro)
    except ImportError:
        pass
    return asyncio.run(coro)


def _ping(sleep_s: float) -> int:
    from load_tests import bench  # noqa: F401 - warm the import in the worker

    time.sleep(sleep_s)
    return os.getpid()


def _client_job(job: dict[str, Any]) -> dict[str, Any]:
    """One client process's share of one rate point (runs in a spawned pool worker)."""
    from load_tests import bench

    requests = [bench.PreparedRequest(*r) for r in job["requests"]]
    delay = job["start_at_unix"] - time.time()
    if delay > 0:
        time.sleep(delay)
    cpu0, wall0 = time.process_time(), time.monotonic()
    res = _run_loop(
        bench.run_rate(
            requests,
            job["rate"],
            job["duration_s"],
            warmup_s=job["warmup_s"],
            seed=job["seed"],
            max_in_flight=job["max_in_flight"],
            max_connections=job["max_connections"],
            timeout_s=job["timeout_s"],
            time_limit_s=job["time_limit_s"],
        )
    )
    wall = max(1e-9, time.monotonic() - wall0)
    return {
        "records": [
            (r.scheduled_s, r.latency_s, r.status, r.error, r.send_lag_s, r.warmup)
            for r in res.records
        ],
        "cpu_frac": (time.process_time() - cpu0) / wall,
        "truncated": res.truncated,
    }


class LoadClient:
    """`procs` spawned client processes; one rate point is split evenly across them (the sum
    of independent Poisson processes is Poisson) and their records merged before summarising."""

    def __init__(
        self, procs: int, max_connections: int, timeout_s: float, max_in_flight: int
    ) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.procs = procs
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        ctx = multiprocessing.get_context("spawn")
        self.pool = ProcessPoolExecutor(max_workers=procs, mp_context=ctx)
        pings = [self.pool.submit(_ping, 0.5) for _ in range(procs)]
        self.pids = sorted({f.result(timeout=120) for f in pings})

    def point(
        self,
        requests: Sequence[Any],
        rate: float,
        duration_s: float,
        warmup_s: float,
        seed: int,
        drain_s: float = 2.0,
    ) -> dict[str, Any]:
        from load_tests import bench

        wire = [(r.method, r.url, dict(r.headers), r.content) for r in requests]
        start_at = time.time() + 0.3
        jobs = [
            {
                "requests": wire,
                "rate": rate / self.procs,
                "duration_s": duration_s,
                "warmup_s": warmup_s,
                "seed": seed * 1009 + i,
                "max_in_flight": self.max_in_flight,
                "max_connections": self.max_connections,
                "timeout_s": self.timeout_s,
                "time_limit_s": warmup_s + duration_s + drain_s,
                "start_at_unix": start_at,
            }
            for i in range(self.procs)
        ]
        t0 = time.monotonic()
        futures = [self.pool.submit(_client_job, j) for j in jobs]
        limit = warmup_s + duration_s + drain_s + 60.0
        outs = [f.result(timeout=limit) for f in futures]
        records = [bench.Record(*t) for o in outs for t in o["records"]]
        summary = asdict(bench.summarise(records, rate, duration_s, warmup_s))
        summary["client_cpu_frac_max"] = round(max(o["cpu_frac"] for o in outs), 3)
        summary["client_saturated"] = client_saturated(summary)
        summary["truncated"] = any(o["truncated"] for o in outs)
        summary["wall_s"] = round(time.monotonic() - t0, 2)
        return summary

    def close(self) -> None:
        procs = list(getattr(self.pool, "_processes", {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.terminate()


def describe_point(s: Mapping[str, Any]) -> str:
    lat = s.get("latency_s") or {}
    errs = ",".join(f"{k}={v}" for k, v in (s.get("error_counts") or {}).items()) or "-"
    verdict = {True: "PASS", False: "fail", None: ""}[s.get("passed")]
    return (
        f"offered {s['offered_rate_per_s']:8.1f}/s  thru {s['throughput_per_s']:8.1f}/s  "
        f"p50 {_ms(lat.get('p50'))}  p99 {_ms(lat.get('p99'))}  err {s['error_rate'] * 100:.2f}%  "
        f"client cpu {s.get('client_cpu_frac_max', 0):.2f}"
        f"{' SATURATED' if s.get('client_saturated') else ''}  {verdict}  {errs}"
    )


def sweep(
    load: LoadClient,
    requests: Sequence[Any],
    cfg: Mapping[str, Any],
    *,
    p99_target_s: float,
    deadline: float,
    label: str,
    start: float | None = None,
    points: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Ascending open-loop sweep (see next_rate); stops at the deadline. Points are appended
    to `points` as they finish (pass a list to keep them if a later point raises).

    A failing rate is measured ``cfg["retries"]`` more times (default 1) before the sweep
    takes it as failed: one 4 s point can fail on a single stall (on the H200 the same setup's
    p99 at 400/s was 27 ms in one run and 269 ms in another). Every run is kept in `points`,
    the re-runs marked ``"retry": n``; the rate counts as sustained if a re-run passes."""
    history: list[tuple[float, bool]] = []
    points = [] if points is None else points
    per_point = cfg["warmup_s"] + cfg["duration_s"] + 3.0
    while True:
        rate = next_rate(
            history,
            start=start if start is not None else cfg["moderate_rate"],
            factor=cfg["rate_factor"],
            max_rate=cfg["max_rate"],
            refine=cfg["refine"],
        )
        if rate is None:
            break
        if time.time() + per_point > deadline:
            log(f"{label}: time budget reached; sweep stops before {rate:g}/s")
            break
        for attempt in range(1 + int(cfg.get("retries", 1))):
            if attempt and time.time() + per_point > deadline:
                break
            s = load.point(
                requests, rate, cfg["duration_s"], cfg["warmup_s"], cfg["seed"] + len(points)
            )
            s["passed"] = point_passes(s, p99_target_s, cfg["max_error_rate"])
            if attempt:
                s["retry"] = attempt
            points.append(s)
            log(f"{label}: {describe_point(s)}{' (re-run)' if attempt else ''}")
            if s["passed"]:
                break
            time.sleep(cfg["pause_after_fail_s"])  # let an overloaded server drain
        history.append((rate, s["passed"]))
    return points
