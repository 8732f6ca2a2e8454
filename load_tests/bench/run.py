"""One open-loop rate: requests created at their scheduled times, latency from that time."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from load_tests.bench.client import (
    PreparedRequest,
    ShardedClient,
    _error_of,
    _transport_error,
    make_client,
)
from load_tests.bench.stats import START_LEAD_S, RateSummary, Record, poisson_schedule, summarise


@dataclass(frozen=True)
class Progress:
    """Counters passed to `run_rate`'s `on_progress` callback about twice a second."""

    rate_per_s: float
    phase: str  # "warmup", "measure", "drain", then "done" once
    elapsed_s: float
    total_s: float
    sent: int
    ok: int
    errors: int
    in_flight: int


@dataclass
class RateResult:
    """Everything `run_rate` measured for one offered rate."""

    rate_per_s: float
    duration_s: float
    warmup_s: float
    seed: int
    started_unix_s: float
    ended_unix_s: float
    scheduled: int
    truncated: bool  # schedule cut short by max_requests or time_limit_s
    records: list[Record] = field(repr=False)
    summary: RateSummary


async def run_rate(
    requests: Sequence[PreparedRequest],
    rate_per_s: float,
    duration_s: float,
    *,
    warmup_s: float = 0.0,
    seed: int = 0,
    max_in_flight: int = 2048,
    max_connections: int = 256,
    timeout_s: float = 30.0,
    max_requests: int | None = None,
    time_limit_s: float | None = None,
    client: httpx.AsyncClient | ShardedClient | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    progress_interval_s: float = 0.5,
) -> RateResult:
    """Send `requests` (cycled) at Poisson arrivals of `rate_per_s` for warmup_s + duration_s.

    Latency is completion time minus scheduled time. `max_requests` and `time_limit_s` are hard
    bounds: the schedule is cut to them (`truncated`), and requests still outstanding when the
    time limit (or, without one, timeout_s + 5 s after the last arrival) expires are cancelled
    and recorded as "client_cancelled". Pass `client` to reuse a client (or an ASGI transport
    in tests); otherwise one with `max_connections` is made and closed here.
    """
    if not requests:
        raise ValueError("no requests to send")
    total_s = warmup_s + duration_s
    schedule = poisson_schedule(rate_per_s, total_s, seed)
    n_full = len(schedule)
    if max_requests is not None:
        schedule = schedule[:max_requests]
    if time_limit_s is not None:
        schedule = [t for t in schedule if t < time_limit_s]
    own_client = client is None
    http = client if client is not None else make_client(max_connections, timeout_s)
    loop = asyncio.get_running_loop()
    records: list[Record] = []
    pending: set[asyncio.Task[Record]] = set()
    counts = {"ok": 0, "errors": 0, "sent": 0}
    t0 = loop.time() + START_LEAD_S
    started_unix_s = time.time() + START_LEAD_S

    async def send(req: PreparedRequest, due: float, warm: bool) -> Record:
        lag = loop.time() - due
        try:
            resp = await http.request(req.method, req.url, headers=req.headers, content=req.content)
            status, error = resp.status_code, _error_of(resp)
        except httpx.HTTPError as exc:
            status, error = 0, _transport_error(exc)
        return Record(due - t0, loop.time() - due, status, error, lag, warm)

    def collect(due: float, warm: bool, task: asyncio.Task[Record]) -> None:
        pending.discard(task)
        if task.cancelled():
            rec = Record(due - t0, loop.time() - due, 0, "client_cancelled", None, warm)
        elif task.exception() is not None:
            exc = task.exception()
            rec = Record(due - t0, loop.time() - due, 0, f"client_{type(exc).__name__}", None, warm)
        else:
            rec = task.result()
        counts["ok" if rec.error is None else "errors"] += 1
        records.append(rec)

    def snapshot(done: bool = False) -> Progress:
        elapsed = max(0.0, loop.time() - t0)
        phase = "warmup" if elapsed < warmup_s else "measure" if elapsed < total_s else "drain"
        return Progress(rate_per_s, "done" if done else phase, elapsed, total_s,
                        counts["sent"], counts["ok"], counts["errors"], len(pending))  # fmt: skip

    async def report() -> None:
        while on_progress is not None:
            on_progress(snapshot())
            await asyncio.sleep(progress_interval_s)

    reporter = asyncio.create_task(report()) if on_progress is not None else None
    try:
        for i, sched_s in enumerate(schedule):
            due = t0 + sched_s
            delay = due - loop.time()
            # Always yield, even when late, so responses keep being processed.
            await asyncio.sleep(max(0.0, delay))
            warm = sched_s < warmup_s
            counts["sent"] += 1
            if len(pending) >= max_in_flight:
                records.append(Record(sched_s, None, 0, "dropped_client", None, warm))
                counts["errors"] += 1
                continue
            task = asyncio.create_task(send(requests[i % len(requests)], due, warm))
            pending.add(task)
            task.add_done_callback(functools.partial(collect, due, warm))
        if pending:
            # httpx timeouts are per operation, so a trickling response could outlive
            # timeout_s; this caps the whole drain.
            drain_s = timeout_s + 5.0
            if time_limit_s is not None:
                drain_s = min(drain_s, max(0.0, t0 + time_limit_s - loop.time()))
            await asyncio.wait(set(pending), timeout=drain_s)
        for task in list(pending):
            task.cancel()
        for _ in range(500):  # up to 5 s for the cancellations to land and be collected
            if not pending:
                break
            await asyncio.sleep(0.01)
    finally:
        if reporter is not None:
            reporter.cancel()
        if on_progress is not None:
            on_progress(snapshot(done=True))
        if own_client:
            await http.aclose()
    records.sort(key=lambda r: r.scheduled_s)
    return RateResult(
        rate_per_s=rate_per_s,
        duration_s=duration_s,
        warmup_s=warmup_s,
        seed=seed,
        started_unix_s=started_unix_s,
        ended_unix_s=time.time(),
        scheduled=len(schedule),
        truncated=len(schedule) < n_full,
        records=records,
        summary=summarise(records, rate_per_s, duration_s, warmup_s),
    )
