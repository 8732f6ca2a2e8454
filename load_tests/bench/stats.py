"""Pure functions: percentiles, per-request records and a rate's summary,
and the loopback check on target URLs."""

from __future__ import annotations

import ipaddress
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from load_tests.harness.schedule import poisson_schedule as poisson_schedule
from load_tests.payloads import DEFAULT_MODELS as DEFAULT_MODELS  # what serve_app serves

SCHEMA_VERSION = 1
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
# Scheduling starts this long after setup so the first arrivals are not already late.
START_LEAD_S = 0.05
# Connections per httpx client; see ShardedClient for why pools are kept small.
CONNECTIONS_PER_SHARD = 16
# Distinct bodies cycled through per run, so nothing downstream can cache one body.
N_TEXT_VARIANTS = 64
N_IMAGE_VARIANTS = 4


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
