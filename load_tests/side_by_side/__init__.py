"""Side by side: one model, the same payloads and the same client against four setups.

    1. ceiling      the model alone in one process, batched, no serving (batch 64 and 8)
    2. plain_1      plain Ray Serve as the docs show it: one replica, num_gpus=1, @serve.batch,
                    Ray's default proxy
    3. plain_shared plain Ray Serve, N replicas at num_gpus=1/N, no caps, default proxy
    4. serve_app    serve_app.serving.replica.ModelServer, N replicas at 1/N under caps, calibrated
                    batching, the default cache policy, through the HAProxy ingress
   (+ plain_1_haproxy / plain_shared_haproxy with --haproxy-plain: 2-3 behind HAProxy too)

For ResNet-50 (fp16, one 224 px JPEG per request) and MiniLM embeddings (one short text per
request) it sweeps open-loop Poisson rates (load_tests.bench.run_rate, in separate client
processes), finds the highest throughput sustained with p99 under a target, reports p50/p99 at
a fixed moderate rate, ratios to the ceiling and to plain Ray Serve, and each replica's peak NVML
bytes against its share. It also measures the client's own ceiling against a bare
uvicorn + Starlette no-op server, and a no-op deployment's p50 through Serve against that.

    python -m load_tests.side_by_side --out docs/results/benchmarks          # full, < 8 min
    python -m load_tests.side_by_side --quick                                # smoke, ~4 min
    python -m load_tests.side_by_side --device cpu --quick                   # CPU dry run, ~3 min
    python -m load_tests.side_by_side --only haproxy_plain --merge           # 2-3 behind HAProxy,
                                                                             # added to the JSON

Each proxy mode runs in a fresh Ray cluster, started by a worker subprocess of this script
(RAY_SERVE_ENABLE_HA_PROXY is read when each Ray process starts, and by Serve's constants when
the driver imports them). A failing setup is recorded in the JSON and the run goes on; the JSON
is rewritten after every phase, so a killed run still leaves what it measured. Setups that
run out of the wall-time budget (--max-time-s) are marked "skipped".

Modules: ``constants`` (models, setups, phases), ``analysis`` (pure functions over measured
points), ``client`` (the load client and the sweep), ``deployments`` (plain Ray Serve as Ray's
docs write it), ``baselines`` (the in-process and client ceilings), ``cluster`` (one Ray cluster
per proxy mode), ``options`` (the command line), ``cli`` (the phases in order), ``util``.
"""

from __future__ import annotations

from load_tests.side_by_side.analysis import (
    add_items_rate,
    best_of,
    best_sustained,
    client_saturated,
    cluster_weight,
    compute_ratios,
    limit_hint,
    memory_summary,
    merge_previous,
    next_rate,
    noop_verdict,
    plan_clusters,
    point_at,
    point_passes,
    ratio,
    round_rate,
)
from load_tests.side_by_side.cli import main
from load_tests.side_by_side.client import sweep
from load_tests.side_by_side.constants import DEFAULT_PHASES, MODELS, PHASES, SETUPS
from load_tests.side_by_side.deployments import create_noop_app, preprocess_image

__all__ = [
    "DEFAULT_PHASES",
    "MODELS",
    "PHASES",
    "SETUPS",
    "best_of",
    "add_items_rate",
    "best_sustained",
    "client_saturated",
    "cluster_weight",
    "compute_ratios",
    "create_noop_app",
    "limit_hint",
    "main",
    "memory_summary",
    "merge_previous",
    "next_rate",
    "noop_verdict",
    "plan_clusters",
    "point_at",
    "point_passes",
    "preprocess_image",
    "ratio",
    "round_rate",
    "sweep",
]
