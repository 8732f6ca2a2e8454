"""Pure functions over measurements: the open-loop client's summary, the search for its own
ceiling, and NVML budget violations. No I/O; tested in tests/unit/test_throughput.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

# Status codes the open-loop workers record beside HTTP statuses (which are all > 0).
STATUS_CODES: dict[str, int] = {
    "timeout": 0,  # no answer before the request's timeout or the end of the drain
    "dropped": -1,  # not sent: the worker already had max_in_flight requests outstanding
    "connect": -2,
    "read": -3,
    "write": -4,
}
_KIND_OF_CODE = {v: k for k, v in STATUS_CODES.items()}
# The client keeps up when its sends are at most this late at p99 (and it drops none).
MAX_SEND_LAG_P99_MS = 5.0
MAX_CLIENT_CPU_FRAC = 0.95


def _ms_percentiles(seconds: np.ndarray) -> dict[str, float | None]:
    if seconds.size == 0:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    p50, p90, p99 = np.percentile(seconds, [50.0, 90.0, 99.0])
    return {
        "p50_ms": float(p50) * 1e3,
        "p90_ms": float(p90) * 1e3,
        "p99_ms": float(p99) * 1e3,
        "max_ms": float(seconds.max()) * 1e3,
    }


def summarise_openloop(
    arrays: Sequence[np.ndarray],
    results: Sequence[Mapping[str, Any]],
    rate_per_s: float,
    duration_s: float,
    warmup_s: float,
) -> dict[str, Any]:
    """Merge the workers' records of one rate point.

    ``arrays``: per worker, rows (scheduled s, latency s, send lag s, status) per request, where
    status is the HTTP status or a STATUS_CODES code. Requests *scheduled* in the window
    [warmup_s, warmup_s + duration_s) are measured: their errors and latency (from the
    scheduled time, 2xx only). Throughput counts 2xx answers that *complete* in the window,
    whenever scheduled, over duration_s."""
    end_s = warmup_s + duration_s
    rec = np.concatenate([np.asarray(a, dtype=np.float64) for a in arrays], axis=1)
    times, latency, lag, status = rec[0], rec[1], rec[2], rec[3].astype(np.int64)
    measured = (times >= warmup_s) & (times < end_s)
    ok = (status >= 200) & (status < 300)
    done_at = times + np.nan_to_num(latency, nan=np.inf)
    in_window = ok & (done_at >= warmup_s) & (done_at < end_s)
    errors: dict[str, int] = {}
    for code in status[measured & ~ok]:
        kind = "status" if code > 0 else _KIND_OF_CODE.get(int(code), "read")
        errors[kind] = errors.get(kind, 0) + 1
    lags = lag[measured & ~np.isnan(lag)]
    lag_p99_ms = float(np.percentile(lags, 99.0)) * 1e3 if lags.size else None
    cpu = max((float(r.get("cpu_frac", 0.0)) for r in results), default=0.0)
    late = max((float(r.get("start_late_s", 0.0)) for r in results), default=0.0)
    n_measured = int(measured.sum())
    keeps_up = (
        errors.get("dropped", 0) == 0
        and (lag_p99_ms is None or lag_p99_ms <= MAX_SEND_LAG_P99_MS)
        and cpu < MAX_CLIENT_CPU_FRAC
    )
    return {
        "offered_per_s": rate_per_s,
        "scheduled_per_s": n_measured / duration_s if duration_s > 0 else 0.0,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "requests": n_measured,
        "ok": int((measured & ok).sum()),
        "errors": sum(errors.values()),
        "error_counts": errors,
        "requests_per_s": int(in_window.sum()) / duration_s if duration_s > 0 else 0.0,
        **_ms_percentiles(latency[measured & ok]),
        "send_lag_p99_ms": lag_p99_ms,
        "client_cpu_frac_max": round(cpu, 3),
        "start_late_s_max": round(late, 4),
        "client_keeps_up": keeps_up,
    }


def ceiling_point_passes(point: Mapping[str, Any], min_fraction: float = 0.97) -> bool:
    """A client-ceiling point passes when the client kept its schedule, nothing failed and the
    no-op server's answers inside the window reached ``min_fraction`` of the requests this
    point's schedule held (its own Poisson count, not the nominal rate)."""
    scheduled = float(point.get("scheduled_per_s") or 0.0)
    return (
        bool(point.get("client_keeps_up"))
        and int(point.get("errors", 1)) == 0
        and scheduled > 0
        and float(point.get("requests_per_s") or 0.0) >= min_fraction * scheduled
    )


def next_ceiling_rate(
    history: Sequence[tuple[float, bool]], start: float, factor: float, max_rate: float
) -> float | None:
    """The next rate of the open-loop ceiling search, or None when it is done.

    Climb by ``factor`` from ``start`` while points pass (up to ``max_rate``); when the first
    rate fails, step down by factor squared (twice at most) until one passes; then climb
    again below the failure, and finish with one point at the geometric mean of the highest
    pass and the lowest failure above it when they are more than 1.5x apart."""
    if not history:
        return start
    passed = [r for r, ok in history if ok]
    failed = [r for r, ok in history if not ok]
    if not failed:
        nxt = max(passed) * factor
        return nxt if nxt <= max_rate * (1 + 1e-9) else None
    if not passed:
        return min(failed) / factor**2 if len(history) < 3 else None
    lo = max(passed)
    above = [r for r in failed if r > lo]
    if not above:
        nxt = lo * factor
        return nxt if nxt <= max_rate * (1 + 1e-9) else None
    hi = min(above)
    if hi / lo > factor * (1 + 1e-9):
        return lo * factor
    return float(np.sqrt(lo * hi)) if hi / lo > 1.5 else None


def client_ceiling(points: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The highest rate the client offered and sustained (``ceiling_point_passes``), and the
    most 2xx/s it carried at any point."""
    pts = list(points)
    passing = [p for p in pts if ceiling_point_passes(p)]
    best = max(passing, key=lambda p: p["offered_per_s"], default=None)
    return {
        "sustained_per_s": best["offered_per_s"] if best else None,
        "sustained_offered_per_s": best["offered_per_s"] if best else None,
        "max_carried_per_s": max((p.get("requests_per_s") or 0.0 for p in pts), default=None),
        "best_point": best,
    }


def budget_violations(
    samples: Iterable[Mapping[str, Any]], budgets_by_pid: Mapping[int, int]
) -> dict[str, Any]:
    """NVML samples of a replica process above its ``budget_bytes`` (from GET /v1/memory).

    Only processes with a known budget are judged; returns the violation count, the samples
    judged, and each judged pid's peak used bytes."""
    judged = 0
    violations = 0
    peaks: dict[int, int] = {}
    for s in samples:
        pid, used = s.get("pid"), s.get("used_bytes")
        if s.get("source") != "nvml" or pid is None or used is None:
            continue
        if int(pid) not in budgets_by_pid:
            continue
        judged += 1
        peaks[int(pid)] = max(peaks.get(int(pid), 0), int(used))
        if int(used) > int(budgets_by_pid[int(pid)]):
            violations += 1
    return {"budget_violations": violations, "nvml_samples_judged": judged, "peak_bytes": peaks}


def replica_share(replicas: int) -> float:
    """The GPU share per replica that lets ``replicas`` of them fit one GPU, rounded down to
    hundredths: 4 -> 0.25, 8 -> 0.12, 12 -> 0.08, 16 -> 0.06."""
    if replicas < 1:
        raise ValueError(f"replicas {replicas} must be >= 1")
    return max(0.01, int(100 / replicas) / 100)


def replica_cpus(replicas: int, server_cores: int) -> float:
    """Logical CPUs per replica so that all of them place on ``server_cores`` cores: one each
    while they fit, else an equal share (hundredths, rounded down)."""
    if replicas < 1 or server_cores < 1:
        raise ValueError("replicas and server cores must be >= 1")
    return min(1.0, max(0.01, int(100 * server_cores / replicas) / 100))
