"""The replica's Ray metrics (Prometheus-scrapable through Ray's metrics endpoint): the memory
report as gauges, and the stages of a request as histograms (docs/metrics.md lists them all).

Serve adds the deployment, replica and application tags itself. Ray exports each metric with a
``ray_`` prefix. The histograms are counted here, in plain Python (``LocalHistogram``: a bisect
and two additions, under 0.5 us), and exported once a second, with the memory report, as the
``_bucket``, ``_sum`` and ``_count`` series of a Prometheus histogram (Ray gauges; a bucket's
``le`` as a tag): Ray's own ``Histogram.observe`` costs 5.2 us with Serve's tags in a Ray worker,
31 us for a request's six (benchmarks/results/profile/metrics_observe_cost.json).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.serve.metrics import Gauge

    from serve_app.errors import ServeAppError

GAUGES = {
    "budget_bytes": "The replica's GPU memory budget (num_gpus x device total).",
    "torch_fraction": "The fraction passed to set_per_process_memory_fraction.",
    "allocated_bytes": "PyTorch allocated bytes.",
    "reserved_bytes": "PyTorch reserved (cached) bytes.",
    "peak_reserved_bytes": "Peak PyTorch reserved bytes.",
    "non_torch_overhead_bytes": "CUDA context and other memory outside PyTorch's allocator.",
    "nvml_process_bytes": "NVML's figure for this process.",
    "max_batch_size": "The batch cap in force (calibrated, lowered on OOM).",
    "queued_items": "Items waiting in the replica's batch queue (not yet in a batch).",
}
COUNTERS = {
    "oom_recoveries": "Out-of-memory errors recovered by splitting a batch.",
    "cache_frees": "Times cached memory went back to the device by policy.",
}

# Seconds: 0.5 ms to 10 s, about three steps a decade (a short text's decode is under 1 ms;
# a request past 10 s is over the default request_timeout_s anyway).
SECONDS_BOUNDARIES = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
]  # fmt: skip
COUNT_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
TOKEN_BOUNDARIES = [16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
BYTE_BOUNDARIES = [256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864]

# name -> (description, boundaries): the histograms a replica records.
HISTOGRAMS: dict[str, tuple[str, list[float]]] = {
    "request_seconds": (
        "A request's time in the replica's handler, from routing to the response built "
        "(error answers included, but not a 503 for a full queue, refused before any work).",
        SECONDS_BOUNDARIES,
    ),
    "decode_seconds": (
        "A request's decode: parse, validate and the backend's prepare (tokenization, image "
        "decoding).",
        SECONDS_BOUNDARIES,
    ),
    "queue_seconds": (
        "A request's wait in the batch queue, until its first item joined a batch.",
        SECONDS_BOUNDARIES,
    ),
    "inference_seconds": (
        "One batch on the model thread: predict (with any OOM split) and the cache policy.",
        SECONDS_BOUNDARIES,
    ),
    "encode_seconds": ("A response's encode and JSON rendering.", SECONDS_BOUNDARIES),
    "batch_size": ("Items in a batch.", [float(b) for b in COUNT_BOUNDARIES]),
    "batch_tokens": (
        "Tokens in a batch (families whose prepared items are token-id lists: embeddings).",
        [float(b) for b in TOKEN_BOUNDARIES],
    ),
    "request_items": ("Items (texts, images) in a request.", [float(b) for b in COUNT_BOUNDARIES]),
    "request_bytes": ("A request body's size in bytes.", [float(b) for b in BYTE_BOUNDARIES]),
}

# name -> description: errors the replica answers, each with a ``reason`` tag (the error code).
ERROR_COUNTERS = {
    "rejections": "503 answers: the queue was full (queue_full) or a request waited past "
    "queue_deadline_s (queue_deadline_exceeded).",
    "timeouts": "504 answers: a request ran past request_timeout_s (timeout).",
}
_ERROR_COUNTER_BY_STATUS = {503: "rejections", 504: "timeouts"}

# Metrics serve_app exports from elsewhere (the controller's policy, the node's GPU monitor),
# as Ray names them before its ``ray_`` prefix: the one list the dashboard's test reads.
ELSEWHERE = {
    "serve_app_autoscale_target_replicas": "gauge, control/policy.py",
    "serve_app_autoscale_reason": "gauge, control/policy.py",
    "serve_app_autoscale_decisions_total": "counter, control/policy.py",
    "serve_app_budget_escape_bytes": "gauge, control/monitor.py",
}
# Ray Serve's own metrics that deploy/grafana uses, as scraped.
RAY_SERVE_USED = {
    "ray_serve_deployment_replica_healthy": "gauge, Ray Serve's controller: 1 per healthy replica",
}


def exported_names() -> dict[str, str]:
    """Every metric serve_app exports, as Prometheus shows it (``ray_`` prefix), with its kind,
    and Ray Serve's that the dashboard uses; a histogram ``h`` is scraped as ``h_bucket``,
    ``h_sum`` and ``h_count``."""
    names = {f"ray_serve_app_{k}": "gauge" for k in GAUGES}
    names.update({f"ray_serve_app_{k}_total": "counter" for k in COUNTERS})
    names.update({f"ray_serve_app_{k}": "histogram" for k in HISTOGRAMS})
    names.update({f"ray_serve_app_{k}_total": "counter" for k in ERROR_COUNTERS})
    names.update({f"ray_{k}": v.split(",")[0] for k, v in ELSEWHERE.items()})
    names.update({k: v.split(",")[0] for k, v in RAY_SERVE_USED.items()})
    return names


def batch_tokens(items: Sequence[Any]) -> int | None:
    """The tokens in a batch whose prepared items are token-id lists; None for other items
    (images), where the batcher sees no tokens."""
    if not items or not isinstance(items[0], list):
        return None
    return sum(len(item) for item in items)


def _le(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


class LocalHistogram:
    """A histogram counted in plain Python on the request path (``observe``), exported as a
    Prometheus histogram's cumulative series by ``export`` (from the report thread: a reading
    may miss an observation in flight, never corrupt one)."""

    __slots__ = ("bounds", "counts", "sum", "labels", "_series")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = list(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.labels = [{"le": _le(b)} for b in self.bounds] + [{"le": "+Inf"}]
        self._series: tuple[Gauge, Gauge, Gauge] | None = None

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.sum += value

    def cumulative(self) -> list[int]:
        """Observations at or below each bound, then all of them (Prometheus' buckets)."""
        out, total = [], 0
        for count in list(self.counts):
            total += count
            out.append(total)
        return out

    def export(self, name: str, description: str) -> None:
        if self._series is None:
            from ray.serve import metrics

            self._series = (
                metrics.Gauge(f"{name}_bucket", description=description, tag_keys=("le",)),
                metrics.Gauge(f"{name}_sum", description=description),
                metrics.Gauge(f"{name}_count", description=description),
            )
        buckets, total, count = self._series
        cumulative = self.cumulative()
        for labels, value in zip(self.labels, cumulative, strict=True):
            buckets.set(value, tags=labels)
        total.set(self.sum)
        count.set(cumulative[-1])


class _ErrorCounters:
    def __init__(self) -> None:
        from ray.serve import metrics

        self.counters = {
            name: metrics.Counter(f"serve_app_{name}_total", description=desc, tag_keys=("reason",))
            for name, desc in ERROR_COUNTERS.items()
        }

    def count(self, err: ServeAppError) -> None:
        name = _ERROR_COUNTER_BY_STATUS.get(err.status_code)
        if name is not None:
            self.counters[name].inc(tags={"reason": err.code})


# The replica's error counters, once its ReplicaMetrics exist (one replica per process): the
# HTTP edge's error_response counts through count_error without a handle on the replica.
_errors: _ErrorCounters | None = None


def count_error(err: ServeAppError) -> None:
    """Count a 503 or 504 answer by its reason (its error code); other statuses are not
    counted here, nor is anything before a replica's metrics exist."""
    if _errors is not None and err.status_code in _ERROR_COUNTER_BY_STATUS:
        _errors.count(err)


class ReplicaMetrics:
    """Gauges, counters and histograms created once per replica (never at import)."""

    def __init__(self) -> None:
        global _errors
        from ray.serve import metrics

        self._gauges = {
            key: metrics.Gauge(f"serve_app_{key}", description=desc) for key, desc in GAUGES.items()
        }
        self._counters = {
            key: metrics.Counter(f"serve_app_{key}_total", description=desc)
            for key, desc in COUNTERS.items()
        }
        self._counted = dict.fromkeys(COUNTERS, 0)
        h = {key: LocalHistogram(bounds) for key, (_, bounds) in HISTOGRAMS.items()}
        self._histograms = h
        self._request_s = h["request_seconds"]
        self._decode_s = h["decode_seconds"]
        self._queue_s = h["queue_seconds"]
        self._inference_s = h["inference_seconds"]
        self._encode_s = h["encode_seconds"]
        self._batch_size = h["batch_size"]
        self._batch_tokens = h["batch_tokens"]
        self._request_items = h["request_items"]
        self._request_bytes = h["request_bytes"]
        _errors = _ErrorCounters()

    def update(self, report: Mapping[str, Any]) -> None:
        """Set the gauges from the memory report and export the histograms (every
        REPORT_PERIOD_S, from the report thread; Ray drops a gauge not set for 2 s)."""
        for key, hist in self._histograms.items():
            hist.export(f"serve_app_{key}", HISTOGRAMS[key][0])
        for key, gauge in self._gauges.items():
            value = report.get(key)
            if value is not None:
                gauge.set(float(value))
        for key, counter in self._counters.items():
            total = int(report.get(key) or 0)
            if total > self._counted[key]:
                counter.inc(total - self._counted[key])
                self._counted[key] = total

    # The request path: each takes the perf_counter reading its stage began at.

    def request_done(self, since_s: float) -> None:
        self._request_s.observe(time.perf_counter() - since_s)

    def decoded(self, since_s: float, body_bytes: int, items: int) -> None:
        self._decode_s.observe(time.perf_counter() - since_s)
        self._request_items.observe(items)
        self._request_bytes.observe(body_bytes)

    def queued(self, waited_s: float) -> None:
        """A request's first item joined a batch after ``waited_s`` in the queue (the batcher
        calls this on the event loop)."""
        self._queue_s.observe(waited_s)

    def encoded(self, since_s: float) -> None:
        self._encode_s.observe(time.perf_counter() - since_s)

    def batch_done(self, items: Sequence[Any], took_s: float) -> None:
        """One batch ran for ``took_s`` (called on the model thread)."""
        self._inference_s.observe(took_s)
        self._batch_size.observe(len(items))
        tokens = batch_tokens(items)
        if tokens is not None:
            self._batch_tokens.observe(tokens)
