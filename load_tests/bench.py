"""Open-loop HTTP load generator for serve_app, with memory sampling and plots.

Requests arrive on a seeded Poisson schedule at a fixed rate; each one is a task created at its
scheduled time, and its latency is measured from that *scheduled* time, not from when it was
actually sent. So if the server (or this client) falls behind, the queueing shows up in the
latency instead of being hidden by coordinated omission. Requests that cannot even be started
because `max_in_flight` are already outstanding are recorded as "dropped_client" errors.

Usage (CLI is thin; the library functions below are importable):

    python -m load_tests.bench --url http://127.0.0.1:8000/v1/embeddings --kind embeddings \\
        --rates 5,10,20 --duration-s 15 --warmup-s 3 --out /tmp/bench --max-error-rate 0

Importable: `poisson_schedule`, `percentile`, `summarise`, `is_loopback_url`, `build_requests`,
`run_rate` (async), `MemorySampler`, `bench_document`, `plot_results`, `format_table`, `main`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import ipaddress
import json
import math
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np

try:
    from load_tests import payloads
except ImportError:  # run as a script: python load_tests/bench.py
    import payloads  # type: ignore[no-redef]

SCHEMA_VERSION = 1
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
# Scheduling starts this long after setup so the first arrivals are not already late.
START_LEAD_S = 0.05
DEFAULT_MODELS = {"embeddings": "minilm", "image": "resnet50"}
# Connections per httpx client; see ShardedClient for why pools are kept small.
CONNECTIONS_PER_SHARD = 16
# Distinct bodies cycled through per run, so nothing downstream can cache one body.
N_TEXT_VARIANTS = 64
N_IMAGE_VARIANTS = 4


# --------------------------------------------------------------------------- pure functions


def poisson_schedule(rate_per_s: float, duration_s: float, seed: int = 0) -> list[float]:
    """Arrival times in [0, duration_s) of a Poisson process at `rate_per_s`.

    Gaps are i.i.d. exponential with mean 1/rate from `numpy.random.default_rng(seed)`, so the
    same arguments always give the same schedule. The count is Poisson(rate * duration): its
    standard deviation is sqrt(rate * duration).
    """
    if rate_per_s <= 0 or not math.isfinite(rate_per_s):
        raise ValueError(f"rate {rate_per_s!r}/s must be a positive finite number")
    if duration_s < 0:
        raise ValueError(f"duration {duration_s!r} s must be >= 0")
    rng = np.random.default_rng(seed)
    expected = rate_per_s * duration_s
    times: list[float] = []
    t = 0.0
    while True:
        # Draw in chunks a little above the expected count; rarely needs a second chunk.
        chunk = int(expected + 6 * math.sqrt(expected) + 16)
        for gap in rng.exponential(1.0 / rate_per_s, size=chunk):
            t += float(gap)
            if t >= duration_s:
                return times
            times.append(t)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks.

    Same as numpy's default ("linear"): for sorted v of length n, position p = q/100 * (n - 1)
    and the result is v[floor(p)] + (v[ceil(p)] - v[floor(p)]) * (p - floor(p)).
    """
    if not values:
        raise ValueError("percentile of an empty list is undefined")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q={q!r} must be within 0..100")
    return _percentile_sorted(sorted(values), q)


def _percentile_sorted(ordered: Sequence[float], q: float) -> float:
    pos = q / 100.0 * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def latency_stats(values: Sequence[float]) -> dict[str, float] | None:
    """p50/p90/p95/p99/max/mean of `values` in seconds, or None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    stats = {f"p{q:g}": _percentile_sorted(ordered, q) for q in PERCENTILES}
    stats["max"] = ordered[-1]
    stats["mean"] = sum(ordered) / len(ordered)
    return stats


@dataclass(frozen=True)
class Record:
    """One scheduled request. Times are seconds from the start of the rate's schedule."""

    scheduled_s: float
    latency_s: float | None  # completion minus *scheduled* time; None when never sent
    status: int  # HTTP status, 0 when there was no response
    error: str | None  # None on 2xx, else e.g. "http_507:out_of_memory", "timeout"
    send_lag_s: float | None = None  # actual send minus scheduled time: client-side lateness
    warmup: bool = False


@dataclass
class RateSummary:
    """Measured-window statistics for one offered rate (warm-up requests excluded)."""

    offered_rate_per_s: float
    scheduled_rate_per_s: float  # this Poisson realisation: measured requests / duration
    duration_s: float
    warmup_s: float
    requests: int
    ok: int
    errors: int
    error_rate: float
    throughput_per_s: float  # completed_in_window / duration_s
    completed_in_window: int  # 2xx responses (warm-up ones too) completing inside the window
    latency_s: dict[str, float] | None  # successful requests only
    latency_all_s: dict[str, float] | None  # every request that got a response or an error
    send_lag_s: dict[str, float] | None
    status_counts: dict[str, int]
    error_counts: dict[str, int]
    warmup_requests: int


def summarise(
    records: Sequence[Record], offered_rate_per_s: float, duration_s: float, warmup_s: float = 0.0
) -> RateSummary:
    """Summarise `records` of one rate; those flagged `warmup` are only counted, not measured.

    Latency and error figures cover requests *scheduled* in the measurement window
    [warmup_s, warmup_s + duration_s). Throughput counts 2xx responses that *complete* in that
    window, whenever they were scheduled, divided by duration_s: in steady state this equals the
    offered rate when the server keeps up, and the server's capacity when it does not.
    """
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.error is None]
    window_end_s = warmup_s + duration_s
    in_window = sum(
        1
        for r in records
        if r.error is None
        and r.latency_s is not None
        and warmup_s <= r.scheduled_s + r.latency_s < window_end_s
    )
    errors = len(measured) - len(ok)
    return RateSummary(
        offered_rate_per_s=offered_rate_per_s,
        scheduled_rate_per_s=len(measured) / duration_s if duration_s > 0 else 0.0,
        duration_s=duration_s,
        warmup_s=warmup_s,
        requests=len(measured),
        ok=len(ok),
        errors=errors,
        error_rate=errors / len(measured) if measured else 0.0,
        throughput_per_s=in_window / duration_s if duration_s > 0 else 0.0,
        completed_in_window=in_window,
        latency_s=latency_stats([r.latency_s for r in ok if r.latency_s is not None]),
        latency_all_s=latency_stats([r.latency_s for r in measured if r.latency_s is not None]),
        send_lag_s=latency_stats([r.send_lag_s for r in measured if r.send_lag_s is not None]),
        status_counts={str(k): v for k, v in sorted(Counter(r.status for r in measured).items())},
        error_counts=dict(Counter(r.error for r in measured if r.error is not None).most_common()),
        warmup_requests=len(records) - len(measured),
    )


def is_loopback_url(url: str) -> bool:
    """True when `url`'s host is loopback: 127.0.0.0/8, ::1 (or v4-mapped), or "localhost".

    Host names other than "localhost" are rejected without resolving them.
    """
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return False
    if not host:
        return False
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def origin_url(url: str, path: str) -> str:
    """`url`'s scheme and host with `path` in place of its path and query."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class PreparedRequest:
    """A fully encoded request, built before the run so encoding is off the send path."""

    method: str
    url: str
    headers: Mapping[str, str]
    content: bytes


def build_requests(
    url: str,
    kind: str,
    *,
    model: str | None = None,
    texts: str = "short",
    batch: int = 1,
    image_size: int = 224,
    image_format: str = "jpeg",
    binary: bool = False,
    top_k: int = 5,
    seed: int = 0,
) -> list[PreparedRequest]:
    """Distinct encoded requests for `kind` ("embeddings" or "image"), cycled during a run."""
    if batch < 1:
        raise ValueError(f"batch {batch} must be >= 1")
    model = model or DEFAULT_MODELS.get(kind, "")
    if kind == "embeddings":
        pool = payloads.texts(texts, N_TEXT_VARIANTS * batch, seed)
        headers = {"Content-Type": "application/json"}
        return [
            PreparedRequest(
                "POST",
                url,
                headers,
                payloads.embeddings_body(
                    pool[i * batch] if batch == 1 else pool[i * batch : (i + 1) * batch], model
                ),
            )
            for i in range(N_TEXT_VARIANTS)
        ]
    if kind == "image":
        seeds = [seed + i for i in range(N_IMAGE_VARIANTS)]
        if binary:
            if batch != 1:
                raise ValueError(
                    f"--binary sends one raw image per request but batch={batch}; "
                    "drop --binary or use --batch 1"
                )
            sep = "&" if urlsplit(url).query else "?"
            raw_url = f"{url}{sep}top_k={top_k}"
            headers = {"Content-Type": payloads.IMAGE_CONTENT_TYPES[image_format]}
            return [
                PreparedRequest(
                    "POST", raw_url, headers, payloads.image_bytes(image_size, image_format, s)
                )
                for s in seeds
            ]
        headers = {"Content-Type": "application/json"}
        out = []
        for i in range(N_IMAGE_VARIANTS):
            imgs = [
                payloads.image_b64(image_size, image_format, seeds[(i + j) % len(seeds)])
                for j in range(batch)
            ]
            body = payloads.classify_body(imgs[0] if batch == 1 else imgs, model, top_k)
            out.append(PreparedRequest("POST", url, headers, body))
        return out
    raise ValueError(f"kind {kind!r} is not 'embeddings' or 'image'")


class ShardedClient:
    """Several small-pool `httpx.AsyncClient`s behind one `request()`, least-loaded first.

    Why: httpcore's pool does work proportional to (queued requests x connections) on every
    request event, so one client with a couple of hundred busy connections starves the event
    loop (measured here: 400 req/s at 0.5 s each, i.e. 200 in flight, gave 30 s of send lag with
    one 256-connection client and 0.05 s with 16 clients of 16). Each shard keeps HTTP/1.1
    keep-alive connections; the total never exceeds `max_connections`.
    """

    def __init__(
        self,
        max_connections: int = 256,
        timeout_s: float = 30.0,
        connections_per_shard: int = CONNECTIONS_PER_SHARD,
    ) -> None:
        n_shards = max(1, math.ceil(max_connections / connections_per_shard))
        sizes = [
            max_connections // n_shards + (i < max_connections % n_shards) for i in range(n_shards)
        ]
        ssl_context = httpx.create_ssl_context()  # one for all shards: each costs ~25 ms
        self._clients = [
            httpx.AsyncClient(
                verify=ssl_context,
                limits=httpx.Limits(
                    max_connections=size, max_keepalive_connections=size, keepalive_expiry=30.0
                ),
                timeout=httpx.Timeout(timeout_s),
                http2=False,
            )
            for size in sizes
        ]
        self._in_flight = [0] * n_shards
        self.shard_sizes: tuple[int, ...] = tuple(sizes)

    async def request(
        self, method: str, url: str, *, headers: Mapping[str, str], content: bytes
    ) -> httpx.Response:
        i = min(range(len(self._clients)), key=self._in_flight.__getitem__)
        self._in_flight[i] += 1
        try:
            return await self._clients[i].request(method, url, headers=headers, content=content)
        finally:
            self._in_flight[i] -= 1

    async def aclose(self) -> None:
        for c in self._clients:
            await c.aclose()

    async def __aenter__(self) -> ShardedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def make_client(max_connections: int = 256, timeout_s: float = 30.0) -> ShardedClient:
    """An HTTP/1.1 keep-alive client with at most `max_connections` connections in all."""
    return ShardedClient(max_connections, timeout_s)


def _error_of(response: httpx.Response) -> str | None:
    if 200 <= response.status_code < 300:
        return None
    kind = f"http_{response.status_code}"
    try:
        err = response.json().get("error", {})
        if isinstance(err, dict) and err.get("type"):
            kind += f":{err['type']}"
    except (ValueError, AttributeError):
        pass
    return kind


def _transport_error(exc: Exception) -> str:
    # Order matters: PoolTimeout is a TimeoutException but means client-side queueing.
    if isinstance(exc, httpx.PoolTimeout):
        return "pool_timeout"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect_error"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "protocol_error"
    return f"client_{type(exc).__name__}"


# --------------------------------------------------------------------------- the run


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


# --------------------------------------------------------------------------- memory sampling


def _nvml_process_samples(nvml: Any) -> list[dict[str, Any]]:
    """Every NVML call the bench makes: used GPU bytes of each compute process, by GPU UUID."""
    out = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = getattr(proc, "usedGpuMemory", None)
            out.append(
                {
                    "source": "nvml",
                    "gpu_uuid": uuid,
                    "pid": int(proc.pid),
                    "used_bytes": int(used) if used is not None else None,
                }
            )
    return out


@dataclass
class MemoryLog:
    samples: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class MemorySampler:
    """Background thread sampling NVML per-process memory and/or `GET /v1/memory` each interval.

    Missing NVML (no GPU, no driver) or an unreachable memory URL is noted once in `notes` and
    sampling carries on with whatever works. Samples carry `t_unix_s` and `source`.
    """

    def __init__(
        self, memory_url: str | None, use_nvml: bool = True, interval_s: float = 1.0
    ) -> None:
        self.memory_url = memory_url
        self.use_nvml = use_nvml
        self.interval_s = interval_s
        self.log = MemoryLog()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self._noted: set[str] = set()

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def stop(self) -> MemoryLog:
        self._stop.set()
        self._thread.join(timeout=10.0)
        return self.log

    def _note(self, key: str, message: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self.log.notes.append(message)

    def _run(self) -> None:
        nvml = self._init_nvml() if self.use_nvml else None
        http = httpx.Client(timeout=max(0.5, self.interval_s)) if self.memory_url else None
        try:
            while True:
                self._sample(nvml, http)
                if self._stop.wait(self.interval_s):
                    self._sample(nvml, http)  # one last point at the end of the run
                    break
        finally:
            if http is not None:
                http.close()
            if nvml is not None:
                try:
                    nvml.nvmlShutdown()
                except Exception:
                    pass

    def _sample(self, nvml: Any, http: httpx.Client | None) -> None:
        now = time.time()
        if nvml is not None:
            try:
                for s in _nvml_process_samples(nvml):
                    self.log.samples.append({"t_unix_s": now, **s})
            except Exception as exc:  # NVML errors are many types; keep sampling the rest
                self._note("nvml_query", f"nvml query failed: {exc!r}")
        if http is not None and self.memory_url:
            self._poll(http, self.memory_url, now)

    def _init_nvml(self) -> Any:
        try:
            import pynvml

            pynvml.nvmlInit()
            return pynvml
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver errors
            self._note("nvml", f"nvml unavailable: {exc!r}")
            return None

    def _poll(self, http: httpx.Client, url: str, now: float) -> None:
        try:
            resp = http.get(url)
            resp.raise_for_status()
            replicas = resp.json().get("replicas", [])
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            self._note("memory_url", f"memory poll of {url} failed: {exc!r}")
            return
        for rep in replicas:
            if isinstance(rep, dict):
                scalars = {
                    k: v
                    for k, v in rep.items()
                    if v is None or isinstance(v, int | float | str | bool)
                }
                self.log.samples.append({"t_unix_s": now, "source": "server", **scalars})


# --------------------------------------------------------------------------- output


def bench_document(
    config: Mapping[str, Any],
    results: Sequence[RateResult],
    memory: MemoryLog | None = None,
    *,
    raw: bool = False,
    max_error_rate: float | None = None,
) -> dict[str, Any]:
    """The bench.json document (see the module docstring of `main` for the layout)."""
    rates = []
    for res in results:
        entry: dict[str, Any] = {
            **asdict(res.summary),
            "seed": res.seed,
            "started_unix_s": res.started_unix_s,
            "ended_unix_s": res.ended_unix_s,
            "scheduled": res.scheduled,
            "truncated": res.truncated,
        }
        if raw:
            entry["raw"] = [asdict(r) for r in res.records]
        rates.append(entry)
    worst = max((r.summary.error_rate for r in results), default=0.0)
    return {
        "schema_version": SCHEMA_VERSION,
        "created_unix_s": time.time(),
        "config": dict(config),
        "rates": rates,
        "memory": asdict(memory) if memory is not None else {"samples": [], "notes": []},
        "verdict": {
            "max_error_rate": max_error_rate,
            "worst_error_rate": worst,
            "passed": max_error_rate is None or worst <= max_error_rate,
        },
    }


def format_table(summaries: Sequence[RateSummary]) -> str:
    """A fixed-width summary table; latencies printed in ms for readability."""
    head = (
        f"{'offered/s':>10} {'sent':>7} {'ok':>7} {'err%':>7} {'thru/s':>9} {'p50 ms':>9} "
        f"{'p90 ms':>9} {'p95 ms':>9} {'p99 ms':>9} {'max ms':>9} {'lag99 ms':>9}  errors"
    )
    lines = [head, "-" * len(head)]

    def ms(stats: dict[str, float] | None, key: str) -> str:
        return f"{stats[key] * 1e3:9.1f}" if stats else f"{'-':>9}"

    for s in summaries:
        errs = ", ".join(f"{k}={v}" for k, v in s.error_counts.items()) or "-"
        lines.append(
            f"{s.offered_rate_per_s:10.1f} {s.requests:7d} {s.ok:7d} {s.error_rate * 100:6.2f}% "
            f"{s.throughput_per_s:9.2f} {ms(s.latency_s, 'p50')} {ms(s.latency_s, 'p90')} "
            f"{ms(s.latency_s, 'p95')} {ms(s.latency_s, 'p99')} {ms(s.latency_s, 'max')} "
            f"{ms(s.send_lag_s, 'p99')}  {errs}"
        )
    return "\n".join(lines)


def plot_results(
    results: Sequence[RateResult], memory: MemoryLog | None, out_dir: Path, title: str = ""
) -> list[Path]:
    """Write bench.png (throughput, latency, errors vs offered rate) and, when there are memory
    samples, memory.png (per-replica bytes over time, budgets dashed). Returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    sums = sorted((r.summary for r in results), key=lambda s: s.offered_rate_per_s)
    x = [s.offered_rate_per_s for s in sums]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax = axes[0]
    ax.plot(x, [s.throughput_per_s for s in sums], "o-", label="achieved (2xx/s)")
    if x:
        ax.plot([0, max(x)], [0, max(x)], "k--", lw=0.8, label="offered")
        # The Poisson draw's own rate, so a point above the diagonal is not a puzzle.
        ax.plot(x, [s.scheduled_rate_per_s for s in sums], "kx", label="scheduled (this draw)")
    ax.set(xlabel="offered rate (req/s)", ylabel="throughput (req/s)", title="Throughput")
    ax.legend()
    ax = axes[1]
    for key in ("p50", "p95", "p99"):
        ys = [s.latency_s[key] if s.latency_s else math.nan for s in sums]
        ax.plot(x, ys, "o-", label=key)
    ax.set(xlabel="offered rate (req/s)", ylabel="latency of 2xx (s)", title="Latency")
    ax.set_yscale("log")
    ax.legend()
    ax = axes[2]
    ax.plot(x, [s.error_rate for s in sums], "o-", color="tab:red")
    ax.set(
        xlabel="offered rate (req/s)", ylabel="error fraction", title="Errors", ylim=(-0.02, 1.02)
    )
    for a in axes:
        a.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    paths.append(out_dir / "bench.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    if memory is not None and memory.samples:
        paths.append(out_dir / "memory.png")
        _plot_memory(plt, results, memory, paths[-1])
    return paths


def _plot_memory(plt: Any, results: Sequence[RateResult], memory: MemoryLog, path: Path) -> None:
    gib = float(1 << 30)
    origin = min([s["t_unix_s"] for s in memory.samples] + [r.started_unix_s for r in results])
    fig, ax = plt.subplots(figsize=(12, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    server: dict[str, list[dict[str, Any]]] = {}
    for s in memory.samples:
        if s.get("source") == "server":
            server.setdefault(str(s.get("replica_id")), []).append(s)
    replica_pids = {s.get("pid") for group in server.values() for s in group}
    for i, (rid, group) in enumerate(sorted(server.items())):
        c = colours[i % len(colours)]
        t = [s["t_unix_s"] - origin for s in group]
        # Prefer what the driver sees for the process; fall back to the allocator's figures.
        field_name = next(
            (
                k
                for k in ("nvml_process_bytes", "reserved_bytes", "peak_reserved_bytes")
                if any(s.get(k) is not None for s in group)
            ),
            None,
        )
        if field_name:
            ys = [(s.get(field_name) or 0) / gib for s in group]
            ax.plot(t, ys, "-", color=c, label=f"{rid[:16]} {field_name}")
        budgets = [(s.get("budget_bytes") or 0) / gib for s in group]
        ax.plot(t, budgets, "--", color=c, lw=1.0, label=f"{rid[:16]} budget")
    nvml: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for s in memory.samples:
        if s.get("source") == "nvml" and s.get("pid") not in replica_pids:
            nvml.setdefault((str(s.get("gpu_uuid")), int(s["pid"])), []).append(s)
    for (uuid, pid), group in sorted(nvml.items()):
        ax.plot(
            [s["t_unix_s"] - origin for s in group],
            [(s.get("used_bytes") or 0) / gib for s in group],
            ":",
            label=f"nvml pid {pid} {uuid[:12]}",
        )
    for r in results:
        ax.axvspan(r.started_unix_s - origin, r.ended_unix_s - origin, alpha=0.06, color="grey")
        ax.text(
            r.started_unix_s - origin,
            0.99,
            f" {r.rate_per_s:g}/s",
            transform=ax.get_xaxis_transform(),
            va="top",
            fontsize=8,
        )
    ax.set(
        xlabel="time since start (s)",
        ylabel="GPU memory (GiB)",
        title="Per-replica GPU memory (dashed: budget)",
    )
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class ProgressPrinter:
    """A dependency-free stderr bar: redrawn in place on a TTY, one line every `every_s` else."""

    def __init__(self, stream: TextIO = sys.stderr, every_s: float = 5.0) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.every_s = every_s
        self._last_line_s = -math.inf

    def __call__(self, p: Progress) -> None:
        frac = min(1.0, p.elapsed_s / p.total_s) if p.total_s > 0 else 1.0
        bar = "#" * int(frac * 30) + "." * (30 - int(frac * 30))
        line = (
            f"[{p.rate_per_s:8.1f}/s] [{bar}] {frac * 100:5.1f}% {p.phase:<7} "
            f"t={p.elapsed_s:6.1f}/{p.total_s:.0f}s sent={p.sent} ok={p.ok} "
            f"err={p.errors} in_flight={p.in_flight}"
        )
        if self.tty:
            self.stream.write("\r" + line + ("\n" if p.phase == "done" else ""))
        elif p.phase == "done" or time.monotonic() - self._last_line_s >= self.every_s:
            self._last_line_s = time.monotonic()
            self.stream.write(line + "\n")
        self.stream.flush()


# --------------------------------------------------------------------------- CLI


def _parse_rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"rates {text!r} must be comma-separated numbers, e.g. 50,100,200"
        ) from None
    if not rates or any(r <= 0 or not math.isfinite(r) for r in rates):
        raise argparse.ArgumentTypeError(f"rates {text!r} must all be positive, e.g. 50,100,200")
    return rates


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m load_tests.bench",
        description="Open-loop Poisson load generator; latency measured from scheduled send time.",
    )
    p.add_argument(
        "--url", required=True, help="full endpoint URL, e.g. http://127.0.0.1:8000/v1/embeddings"
    )
    p.add_argument("--kind", choices=("embeddings", "image"), default="embeddings")
    p.add_argument("--model", default=None, help="model name (default: minilm / resnet50)")
    rates = p.add_mutually_exclusive_group(required=True)
    rates.add_argument("--rate", type=float, help="one offered rate in requests/s")
    rates.add_argument("--rates", type=_parse_rates, help="sweep, e.g. 50,100,200")
    p.add_argument("--duration-s", type=float, default=30.0, help="measured seconds per rate")
    p.add_argument("--warmup-s", type=float, default=5.0, help="unmeasured seconds before each")
    p.add_argument("--pause-s", type=float, default=1.0, help="idle seconds between rates")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--texts", choices=payloads.TEXT_KINDS, default="short")
    p.add_argument("--batch", type=int, default=1, help="inputs per request")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--image-format", choices=payloads.IMAGE_FORMATS, default="jpeg")
    p.add_argument("--binary", action="store_true", help="raw image body instead of base64 JSON")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--max-connections", type=int, default=256)
    p.add_argument("--max-in-flight", type=int, default=2048)
    p.add_argument("--timeout-s", type=float, default=30.0, help="per-request httpx timeout")
    p.add_argument(
        "--max-requests",
        type=int,
        default=200_000,
        help="hard cap on scheduled requests over the whole sweep",
    )
    p.add_argument(
        "--max-time-s", type=float, default=3600.0, help="hard cap on the sweep's wall time"
    )
    p.add_argument(
        "--memory-url",
        default=None,
        help="GET URL for per-replica memory (default: <origin>/v1/memory; 'none' disables)",
    )
    p.add_argument("--memory-interval-s", type=float, default=1.0)
    p.add_argument("--no-nvml", action="store_true", help="do not sample NVML in this process")
    p.add_argument(
        "--wait-ready-s",
        type=float,
        default=0.0,
        help="first wait up to this long for GET <origin>/readyz to return 200",
    )
    p.add_argument("--out", type=Path, default=None, help="directory for bench.json and PNGs")
    p.add_argument("--raw", action="store_true", help="include per-request records in bench.json")
    p.add_argument(
        "--max-error-rate",
        type=float,
        default=None,
        help="exit 1 when any rate's error fraction exceeds this (e.g. 0 or 0.01)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow non-loopback targets (only for hosts you are allowed to load)",
    )
    return p


def _check_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> list[float]:
    rates: list[float] = a.rates if a.rates is not None else [a.rate]
    if a.rate is not None and (a.rate <= 0 or not math.isfinite(a.rate)):
        p.error(f"--rate {a.rate} must be positive")
    if a.duration_s <= 0 or a.warmup_s < 0 or a.pause_s < 0:
        p.error("--duration-s must be > 0 and --warmup-s/--pause-s >= 0")
    if min(a.max_connections, a.max_in_flight, a.batch, a.max_requests) < 1:
        p.error("--max-connections, --max-in-flight, --batch and --max-requests must be >= 1")
    urls = [a.url] + ([a.memory_url] if a.memory_url else [])
    for url in urls:
        if urlsplit(url).scheme not in ("http", "https"):
            p.error(f"URL {url!r} must start with http:// or https://")
        if not a.allow_remote and not is_loopback_url(url):
            p.error(
                f"URL {url!r} is not loopback (127.0.0.0/8, localhost, [::1]); "
                "pass --allow-remote if you are allowed to load that host"
            )
    expected = sum(r * (a.warmup_s + a.duration_s) for r in rates)
    if expected > a.max_requests:
        p.error(
            f"the sweep schedules about {expected:.0f} requests, over --max-requests "
            f"{a.max_requests}; lower --rates/--duration-s or raise --max-requests"
        )
    planned_s = sum(a.warmup_s + a.duration_s for _ in rates) + a.pause_s * (len(rates) - 1)
    if planned_s > a.max_time_s:
        p.error(
            f"the sweep needs about {planned_s:.0f} s, over --max-time-s {a.max_time_s:g}; "
            "shorten --duration-s or raise --max-time-s"
        )
    if a.binary and a.batch != 1:
        p.error(f"--binary sends one raw image per request; drop --binary or --batch {a.batch}")
    return rates


def _wait_ready(url: str, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            try:
                if http.get(url).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    return False


async def _sweep(
    a: argparse.Namespace, rates: list[float], requests: Sequence[PreparedRequest]
) -> list[RateResult]:
    results: list[RateResult] = []
    start = time.monotonic()
    left_requests = a.max_requests
    progress = None if a.no_progress else ProgressPrinter()
    async with make_client(a.max_connections, a.timeout_s) as http:
        for i, rate in enumerate(rates):
            left_s = a.max_time_s - (time.monotonic() - start)
            if left_s <= 0 or left_requests <= 0:
                print(
                    f"stopping before {rate:g}/s: --max-time-s or --max-requests reached",
                    file=sys.stderr,
                )
                break
            res = await run_rate(
                requests,
                rate,
                a.duration_s,
                warmup_s=a.warmup_s,
                seed=a.seed + i,
                max_in_flight=a.max_in_flight,
                timeout_s=a.timeout_s,
                max_requests=left_requests,
                time_limit_s=left_s,
                client=http,
                on_progress=progress,
            )
            results.append(res)
            left_requests -= res.scheduled
            if i + 1 < len(rates) and a.pause_s > 0:
                await asyncio.sleep(a.pause_s)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep. Exit codes: 0 done, 1 --max-error-rate exceeded, 2 bad arguments,
    3 server not ready within --wait-ready-s.

    bench.json layout: {schema_version, created_unix_s, config{...flags}, rates[{RateSummary
    fields, seed, started_unix_s, ended_unix_s, scheduled, truncated, raw?[Record]}],
    memory{samples[{t_unix_s, source: "nvml"|"server", ...}], notes[str]},
    verdict{max_error_rate, worst_error_rate, passed}}.
    """
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.memory_url is None:
        a.memory_url = origin_url(a.url, "/v1/memory")
    elif a.memory_url.lower() in ("", "none"):
        a.memory_url = None
    rates = _check_args(parser, a)
    if a.wait_ready_s > 0 and not _wait_ready(origin_url(a.url, "/readyz"), a.wait_ready_s):
        print(
            f"server not ready: GET {origin_url(a.url, '/readyz')} gave no 200 within "
            f"{a.wait_ready_s:g} s; start it or raise --wait-ready-s",
            file=sys.stderr,
        )
        return 3
    try:
        requests = build_requests(
            a.url,
            a.kind,
            model=a.model,
            texts=a.texts,
            batch=a.batch,
            image_size=a.image_size,
            image_format=a.image_format,
            binary=a.binary,
            top_k=a.top_k,
            seed=a.seed,
        )
    except ValueError as exc:
        parser.error(str(exc))
    sampler = None
    if a.memory_url or not a.no_nvml:
        sampler = MemorySampler(a.memory_url, not a.no_nvml, a.memory_interval_s).start()
    try:
        results = asyncio.run(_sweep(a, rates, requests))
    finally:
        memory = sampler.stop() if sampler is not None else None
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    config.update(
        rates=rates,
        model=a.model or DEFAULT_MODELS[a.kind],
        httpx_version=httpx.__version__,
        python_version=sys.version.split()[0],
    )
    doc = bench_document(config, results, memory, raw=a.raw, max_error_rate=a.max_error_rate)
    print(format_table([r.summary for r in results]))
    for note in memory.notes if memory is not None else []:
        print(f"note: {note}", file=sys.stderr)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "bench.json").write_text(json.dumps(doc, indent=1, allow_nan=False))
        title = f"{a.kind} {a.url} batch={a.batch}"
        written = plot_results(results, memory, a.out, title)
        print(f"wrote {a.out / 'bench.json'} and {', '.join(str(p) for p in written)}")
    verdict = doc["verdict"]
    if not verdict["passed"]:
        print(
            f"FAIL: worst error rate {verdict['worst_error_rate']:.4f} exceeds "
            f"--max-error-rate {a.max_error_rate:g}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
