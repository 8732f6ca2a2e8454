"""The open-loop clients' arrival times: a seeded Poisson process (load_tests.bench, the
throughput benchmark's open-loop workers)."""

from __future__ import annotations

import math

import numpy as np


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
