"""What ``serve-app plan --from-running`` reads from Ray's Prometheus endpoint (``--metrics``,
docs/metrics.md): per application, the p99 of its requests (the
``ray_serve_app_request_seconds`` histogram), the items a request carries
(``ray_serve_app_request_items``), and the controller's decisions by reason
(``ray_serve_app_autoscale_decisions_total``). Pure: the scraped text comes in as a string,
parsed by prometheus_client's own parser.

Ray refreshes its endpoint every few seconds, and on a loaded host less often (two scrapes 4 s
apart were seen to show the same counts), so nothing here is a rate over the window: the
window's request count comes from the replicas' reports (their batched items over the mean
items a request, a ratio of the cumulative histograms that a late refresh does not skew)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

REQUEST_SECONDS = "ray_serve_app_request_seconds"
REQUEST_ITEMS = "ray_serve_app_request_items"
DECISIONS = "ray_serve_app_autoscale_decisions_total"


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def excerpt(text: str, apps: set[str]) -> str:
    """The lines of an exposition that this module reads, for ``apps`` only (with their
    families' ``# HELP`` and ``# TYPE`` lines): small enough to keep beside a plan."""
    keep = []
    for line in text.splitlines():
        name = line.split()[2] if line.startswith("#") and len(line.split()) > 2 else line
        if not name.startswith((REQUEST_SECONDS, REQUEST_ITEMS, DECISIONS)):
            continue
        if line.startswith("#") or any(f'application="{a}"' in line for a in apps):
            keep.append(line)
    return "\n".join(keep) + "\n"


def _summed(samples: Sequence[Sample], name: str, app: str, key: str = "") -> dict[str, float]:
    """``name``'s samples of application ``app``, summed over replicas, by label ``key``."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name == name and s.labels.get("application") == app:
            k = s.labels.get(key, "") if key else ""
            out[k] = out.get(k, 0.0) + s.value
    return out


@dataclass(frozen=True)
class RequestWindow:
    requests: float  # requests the histogram counted between the scrapes (0: no refresh)
    p99_s: float | None  # within the bucket the 99th percentile falls in, interpolated
    p99_note: str  # which requests the p99 is of, and how it was read


def _p99(buckets: list[tuple[float, float]], count: float) -> tuple[float | None, str]:
    """The p99 of cumulative Prometheus buckets, interpolated linearly within the bucket it
    falls in, as Prometheus' histogram_quantile does (a bucket's upper bound would read a p99
    of 26 ms as 50 ms)."""
    rank = 0.99 * count
    below_le, below = 0.0, 0.0
    for le, cumulative in buckets:
        if cumulative >= rank and cumulative > 0:
            if math.isinf(le):
                return below_le, f"above the largest bucket ({below_le:g} s): that bound"
            inside = cumulative - below
            frac = (rank - below) / inside if inside > 0 else 1.0
            p99 = below_le + frac * (le - below_le)
            return p99, f"interpolated within its bucket ({below_le:g}, {le:g}] s"
        below_le, below = le, cumulative
    return None, "the buckets do not reach the count (a partial scrape)"


def request_window(before: Sequence[Sample], after: Sequence[Sample], app: str) -> RequestWindow:
    """Application ``app``'s requests between two scrapes and their p99 (interpolated within
    its bucket, so within a bucket of the true p99). Where the first
    scrape had none of its series or Ray had not refreshed them since, the p99 is that of the
    replicas' requests so far (their cumulative histogram at the second), and says so."""
    c0 = _summed(before, f"{REQUEST_SECONDS}_count", app)
    c1 = _summed(after, f"{REQUEST_SECONDS}_count", app).get("", 0.0)
    b1 = _summed(after, f"{REQUEST_SECONDS}_bucket", app, "le")
    if c1 <= 0 or not b1:
        return RequestWindow(0.0, None, f"no {REQUEST_SECONDS} of {app} on the endpoint")
    count = c1 - c0.get("", 0.0)
    if c0 and count > 0:
        b0 = _summed(before, f"{REQUEST_SECONDS}_bucket", app, "le")
        buckets = sorted((float(le), max(0.0, v - b0.get(le, 0.0))) for le, v in b1.items())
        p99, how = _p99(buckets, count)
        return RequestWindow(
            count, p99, f"over the {count:.0f} requests between the scrapes, {how}"
        )
    p99, how = _p99(sorted((float(le), v) for le, v in b1.items()), c1)
    why = "had not refreshed them within the window" if c0 else "had none at the first scrape"
    return RequestWindow(
        max(0.0, count),
        p99,
        f"over the replicas' {c1:.0f} requests so far (Ray's endpoint {why}), {how}",
    )


def mean_items(samples: Sequence[Sample], app: str) -> float | None:
    """Items a request of ``app`` carried, the mean over its replicas' lives; None: no data."""
    total = _summed(samples, f"{REQUEST_ITEMS}_sum", app).get("", 0.0)
    count = _summed(samples, f"{REQUEST_ITEMS}_count", app).get("", 0.0)
    return total / count if count > 0 and total > 0 else None


def decisions(samples: Sequence[Sample], app: str) -> dict[str, float]:
    """The controller's decisions for ``app`` since it started, by ``decision/reason``."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name == DECISIONS and s.labels.get("application") == app:
            key = f"{s.labels.get('decision', '?')}/{s.labels.get('reason', '?')}"
            out[key] = out.get(key, 0.0) + s.value
    return out


def decisions_in_window(
    before: Mapping[str, float], after: Mapping[str, float]
) -> dict[str, float]:
    """The decisions counted between two scrapes, by ``decision/reason`` (those above 0)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}
