"""What recording a Ray metric costs on a replica's request path, measured in a Ray worker.

Each case runs 200,000 times after 1,000 to warm up, in a Ray task on a local cluster:
``Histogram.observe`` with no tags, with Serve's three tags as default tags (how a replica's
``ray.serve.metrics.Histogram`` records: deployment, replica, application), with a tag dict passed
per call; ``Counter.inc`` and ``Gauge.set``; and serve_app's whole per-request recording
(serving/metrics.ReplicaMetrics: request_done, decoded, queued, encoded: six observes of its
LocalHistograms) and the same six through Ray histograms with Serve's tags; and one export of
every LocalHistogram (what the report thread does once a second).

    python -m research.metrics_observe_cost [--out DIR]

Writes ``metrics_observe_cost.json`` under ``--out`` (default ``benchmarks/results/profile``).
About 20 s on one core.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

N = 200_000
SERVE_TAGS = {"deployment": "model", "replica": "abc123", "application": "embeddings"}


def measure() -> dict[str, Any]:
    from ray.util import metrics

    from serve_app.serving.metrics import SECONDS_BOUNDARIES, ReplicaMetrics

    keys = tuple(SERVE_TAGS)
    plain = metrics.Histogram("probe_plain", boundaries=SECONDS_BOUNDARIES)
    serve = metrics.Histogram("probe_serve", boundaries=SECONDS_BOUNDARIES, tag_keys=keys)
    serve.set_default_tags(SERVE_TAGS)
    per_call = metrics.Histogram("probe_per_call", boundaries=SECONDS_BOUNDARIES, tag_keys=keys)
    counter = metrics.Counter("probe_counter", tag_keys=keys).set_default_tags(SERVE_TAGS)
    gauge = metrics.Gauge("probe_gauge", tag_keys=keys).set_default_tags(SERVE_TAGS)
    replica = ReplicaMetrics()
    since_s = time.perf_counter()

    def ray_per_request() -> None:
        for _ in range(6):
            serve.observe(0.0123)

    def per_request() -> None:
        replica.decoded(since_s, 120, 1)
        replica.queued(0.0021)
        replica.encoded(since_s)
        replica.request_done(since_s)

    cases = {
        "histogram_observe_no_tags": lambda: plain.observe(0.0123),
        "histogram_observe_serve_default_tags": lambda: serve.observe(0.0123),
        "histogram_observe_tags_per_call": lambda: per_call.observe(0.0123, tags=SERVE_TAGS),
        "counter_inc_serve_default_tags": lambda: counter.inc(),
        "gauge_set_serve_default_tags": lambda: gauge.set(1.0),
        "replica_metrics_per_request_6_observes": per_request,
        "ray_histograms_per_request_6_observes": ray_per_request,
        "empty_call": lambda: None,
    }
    out: dict[str, float] = {}
    for name, fn in cases.items():
        for _ in range(1000):
            fn()
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        out[name] = round((time.perf_counter() - t0) / N * 1e6, 3)
    t0 = time.perf_counter()
    replica.update({})
    out["replica_metrics_export_all_histograms_once"] = round((time.perf_counter() - t0) * 1e6, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/profile")
    out_dir = Path(parser.parse_args().out)
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        us = ray.get(ray.remote(measure).remote())
    finally:
        ray.shutdown()
    doc = {
        "what": "microseconds per call in a Ray worker (mean of 200,000 after 1,000 warm-up)",
        "us_per_call": us,
        "ray": ray.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics_observe_cost.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
