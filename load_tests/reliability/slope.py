"""The soak's verdict, pure: per replica, after its warm-up, the spread and the least-squares
slope of RSS, NVML and reserved bytes (issue 12 item 8: flat within 100 MB; issue 29 item 6:
under 5 MiB per replica per hour).

Each replica's rows count from ``warmup_s`` after its own first row (a replacement warms up
too). A slope is fitted with the standard library's ``statistics.linear_regression`` over
(seconds, bytes) and reported in bytes per minute (as before) and in MiB per hour, with the
slope's standard error in MiB per hour (the fit's residuals; None below 3 points), so that a
short run's slope can be read against its noise. ``flat``: every RSS and NVML spread within
``flat_bytes``; ``slope_ok``: every RSS, NVML and reserved slope within
``slope_target_mib_per_h``. Each is None when nothing could be judged.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

FLAT_BYTES = 100_000_000  # the "100 MB", decimal
SLOPE_TARGET_MIB_PER_H = 5.0  # issue 29 item 6, per replica
JUDGED = ("rss", "nvml")  # what `flat` is about; reserved is reported beside them
METRICS = ("rss", "nvml", "reserved")  # what `slope_ok` is about
# RSS split as /proc/PID/status splits it (anonymous: the heaps; file: mapped libraries' pages
# faulted in): reported beside, so that a growing RSS says which kind grows.
REPORTED = ("rss_anon", "rss_file")
MIB = 1 << 20

Sample = dict[str, Any]  # {"t_s", "pid", "rss_bytes", "nvml_bytes", "reserved_bytes"}


def default_warmup_s(duration_s: float) -> float:
    return max(30.0, 0.1 * duration_s)


def after_warmup(rows: Iterable[Sample], warmup_s: float) -> dict[int, list[Sample]]:
    """Each replica's rows (by pid, in time order) from ``warmup_s`` after its first row."""
    by_pid: dict[int, list[Sample]] = {}
    for r in sorted(rows, key=lambda r: r["t_s"]):
        by_pid.setdefault(int(r["pid"]), []).append(r)
    return {
        pid: [r for r in rs if r["t_s"] >= rs[0]["t_s"] + warmup_s] for pid, rs in by_pid.items()
    }


def fit(points: list[tuple[float, int]]) -> tuple[float, float | None] | None:
    """(slope in bytes per second, its standard error or None below 3 points) of a
    least-squares line through (seconds, bytes); None below 2 points or with no time spread."""
    if len(points) < 2:
        return None
    ts, ys = [float(t) for t, _ in points], [float(y) for _, y in points]
    try:
        slope, intercept = statistics.linear_regression(ts, ys)
    except statistics.StatisticsError:  # every t equal
        return None
    if len(points) < 3:
        return slope, None
    residual = sum((y - (intercept + slope * t)) ** 2 for t, y in zip(ts, ys, strict=True))
    t_mean = statistics.fmean(ts)
    spread = sum((t - t_mean) ** 2 for t in ts)
    return slope, math.sqrt(residual / (len(points) - 2) / spread)


def slope_per_min(points: list[tuple[float, int]]) -> float | None:
    """Least-squares slope of (seconds, bytes) points, in bytes per minute."""
    f = fit(points)
    return None if f is None else 60.0 * f[0]


def mib_per_h(bytes_per_s: float | None) -> float | None:
    return None if bytes_per_s is None else round(3600.0 * bytes_per_s / MIB, 3)


def metric_stats(rows: list[Sample], metric: str) -> dict[str, Any]:
    """``{metric}_min/max/spread_bytes``, ``{metric}_slope_bytes_per_min``,
    ``{metric}_slope_mib_per_h`` and ``{metric}_slope_stderr_mib_per_h`` over the rows that
    have the metric (spread and slope need two)."""
    points = [
        (r["t_s"], int(r[f"{metric}_bytes"])) for r in rows if r.get(f"{metric}_bytes") is not None
    ]
    values = [y for _, y in points]
    f = fit(points)
    return {
        f"{metric}_min_bytes": min(values, default=None),
        f"{metric}_max_bytes": max(values, default=None),
        f"{metric}_spread_bytes": max(values) - min(values) if len(values) >= 2 else None,
        f"{metric}_slope_bytes_per_min": None if f is None else round(60.0 * f[0]),
        f"{metric}_slope_mib_per_h": None if f is None else mib_per_h(f[0]),
        f"{metric}_slope_stderr_mib_per_h": None if f is None else mib_per_h(f[1]),
    }


def replacements(rows: list[Sample]) -> dict[str, Any]:
    """Replicas (pids) that appeared after the first row or were gone before the last one."""
    spans = {pid: (rs[0]["t_s"], rs[-1]["t_s"]) for pid, rs in after_warmup(rows, 0.0).items()}
    first_t = min((lo for lo, _ in spans.values()), default=0.0)
    last_t = max((hi for _, hi in spans.values()), default=0.0)
    appeared = [{"pid": p, "first_t_s": lo} for p, (lo, _) in sorted(spans.items()) if lo > first_t]
    gone = [{"pid": p, "last_t_s": hi} for p, (_, hi) in sorted(spans.items()) if hi < last_t]
    return {"replaced": bool(appeared or gone), "appeared": appeared, "gone": gone}


def verdict(
    rows: list[Sample],
    warmup_s: float,
    flat_bytes: int = FLAT_BYTES,
    slope_target_mib_per_h: float = SLOPE_TARGET_MIB_PER_H,
) -> dict[str, Any]:
    """Per replica, spreads and slopes after its warm-up; ``flat`` when every judged spread is
    within ``flat_bytes``, ``slope_ok`` when every slope is within the target (None: nothing to
    judge)."""
    replicas = []
    for pid, rs in sorted(after_warmup(rows, warmup_s).items()):
        entry: dict[str, Any] = {"pid": pid, "samples_judged": len(rs)}
        if rs:
            entry["judged_s"] = round(rs[-1]["t_s"] - rs[0]["t_s"], 1)
        for metric in METRICS + REPORTED:
            entry.update(metric_stats(rs, metric))
        replicas.append(entry)
    spreads = [
        e[f"{m}_spread_bytes"]
        for e in replicas
        for m in JUDGED
        if e[f"{m}_spread_bytes"] is not None
    ]
    slopes = [
        e[f"{m}_slope_mib_per_h"]
        for e in replicas
        for m in METRICS
        if e[f"{m}_slope_mib_per_h"] is not None
    ]
    return {
        "warmup_s": warmup_s,
        "flat_bytes": flat_bytes,
        "flat": all(s <= flat_bytes for s in spreads) if spreads else None,
        "max_spread_bytes": max(spreads, default=None),
        "slope_target_mib_per_h": slope_target_mib_per_h,
        "slope_ok": all(s <= slope_target_mib_per_h for s in slopes) if slopes else None,
        "max_slope_mib_per_h": max(slopes, default=None),
        "not_judged_pids": [e["pid"] for e in replicas if e["samples_judged"] < 2],
        **replacements(rows),
        "replicas": replicas,
    }
