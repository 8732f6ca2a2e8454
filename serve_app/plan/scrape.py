"""What ``serve-app plan --from-running`` reads from Ray's Prometheus endpoint (``--metrics``,
docs/metrics.md): per application, the requests a window answered and their p99 (the
``ray_serve_app_request_seconds`` histogram), and the controller's decisions by reason
(``ray_serve_app_autoscale_decisions_total``). Pure: the scraped text comes in as a string,
parsed by prometheus_client's own parser."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

REQUEST_SECONDS = "ray_serve_app_request_seconds"
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
        if not name.startswith((REQUEST_SECONDS, DECISIONS)):
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
    requests: float  # the histogram's count over the window
    p99_s: float | None  # the upper bound of the bucket the 99th percentile falls in
    p99_note: str


def request_window(before: Sequence[Sample], after: Sequence[Sample], app: str) -> RequestWindow:
    """Application ``app``'s requests between two scrapes and their p99 (nearest rank, to its
    bucket's upper bound, so never below the true p99 by more than a bucket). A replica that
    restarted in between counts from 0, which the difference clips at 0."""
    count = _summed(after, f"{REQUEST_SECONDS}_count", app).get("", 0.0) - _summed(
        before, f"{REQUEST_SECONDS}_count", app
    ).get("", 0.0)
    b0 = _summed(before, f"{REQUEST_SECONDS}_bucket", app, "le")
    b1 = _summed(after, f"{REQUEST_SECONDS}_bucket", app, "le")
    buckets = sorted(((float(le), max(0.0, v - b0.get(le, 0.0))) for le, v in b1.items()))
    count = max(0.0, count)
    if count <= 0 or not buckets:
        return RequestWindow(count, None, f"no {REQUEST_SECONDS} counted in the window")
    rank = max(1, math.ceil(0.99 * count))
    for le, cumulative in buckets:  # Prometheus buckets are cumulative
        if cumulative >= rank:
            if math.isinf(le):
                top = max(b for b, _ in buckets if not math.isinf(b))
                return RequestWindow(count, top, f"p99 above the largest bucket ({top:g} s)")
            return RequestWindow(count, le, f"the bucket's upper bound ({le:g} s)")
    return RequestWindow(count, None, "the buckets do not reach the count (a partial scrape)")


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
