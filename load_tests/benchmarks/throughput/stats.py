"""Pure functions over measurements: the search for the clients' own ceiling, and each
replica's GPU share and CPUs. No I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np


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
