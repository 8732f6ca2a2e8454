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
`run_rate` (async), `bench_document`, `plot_results`, `format_table`, `main`.

Modules: ``stats`` (pure functions), ``client`` (request bodies, the sharded HTTP client),
``run`` (one open-loop rate), ``output`` (JSON, table, plots), ``cli`` (the command line). NVML
sampling (``MemorySampler``) and the Poisson schedule are the shared harness's
(load_tests.harness.nvml, load_tests.harness.schedule); the plots need the extra ``plots``.
"""

from __future__ import annotations

from load_tests.bench.cli import build_parser, main
from load_tests.bench.client import PreparedRequest, ShardedClient, build_requests, make_client
from load_tests.bench.output import ProgressPrinter, bench_document, format_table, plot_results
from load_tests.bench.run import Progress, RateResult, run_rate
from load_tests.bench.stats import (
    CONNECTIONS_PER_SHARD,
    DEFAULT_MODELS,
    N_IMAGE_VARIANTS,
    N_TEXT_VARIANTS,
    PERCENTILES,
    SCHEMA_VERSION,
    START_LEAD_S,
    RateSummary,
    Record,
    is_loopback_url,
    latency_stats,
    origin_url,
    percentile,
    poisson_schedule,
    summarise,
)

__all__ = [
    "CONNECTIONS_PER_SHARD",
    "DEFAULT_MODELS",
    "N_IMAGE_VARIANTS",
    "N_TEXT_VARIANTS",
    "PERCENTILES",
    "PreparedRequest",
    "Progress",
    "ProgressPrinter",
    "RateResult",
    "RateSummary",
    "Record",
    "SCHEMA_VERSION",
    "START_LEAD_S",
    "ShardedClient",
    "bench_document",
    "build_parser",
    "build_requests",
    "format_table",
    "is_loopback_url",
    "latency_stats",
    "main",
    "make_client",
    "origin_url",
    "percentile",
    "plot_results",
    "poisson_schedule",
    "run_rate",
    "summarise",
]
