"""The command line and the run's configuration."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from load_tests.side_by_side.constants import (
    DEFAULT_OUT,
    DEFAULT_PHASES,
    MODELS,
    PHASES,
    RESULTS_ENV,
)


def _config(a: argparse.Namespace) -> dict[str, Any]:
    cpu = a.device == "cpu"
    quick = a.quick
    cfg: dict[str, Any] = {
        "quick": quick,
        "duration_s": a.duration_s or (2.0 if cpu or quick else 4.0),
        "warmup_s": a.warmup_s if a.warmup_s is not None else 1.0,
        "moderate_rate": a.moderate_rate or (2.0 if cpu else 100.0),
        "rate_factor": a.rate_factor or (2.0 if cpu else 4.0 if quick else 2.0),
        "max_rate": a.max_rate or (4.0 if cpu else 1600.0 if quick else 25600.0),
        "refine": a.refine if a.refine is not None else (0 if quick or cpu else 1),
        "retries": a.retries if a.retries is not None else (0 if quick or cpu else 1),
        "max_error_rate": a.max_error_rate,
        "pause_after_fail_s": 1.0 if cpu or quick else 2.0,
        "plain_batch": a.plain_batch,
        "inputs_per_request": a.inputs_per_request,
        "batch_wait_timeout_s": a.batch_wait_timeout_s,
        "serve_app_args": json.loads(a.serve_app_args),
        "seed": a.seed,
        "noop_rate": 10.0 if cpu else 50.0,
        "noop_duration_s": 2.0 if cpu or quick else 4.0,
        "client_duration_s": 1.5 if cpu or quick else 2.0,
        "client_start_rate": 100.0 if cpu else 2000.0,
        "client_max_rate": 400.0 if cpu else 64000.0,
        "client_rate_factor": 4.0 if cpu or quick else 2.0,
        "client_p99_s": 0.05 if not cpu else 0.5,
        "noop_server_workers": a.noop_server_workers or (1 if cpu else 4),
        "max_time_s": a.max_time_s or (220.0 if cpu else 240.0 if quick else 420.0),
    }
    cfg["p99_target_s"] = {
        name: a.p99_target_s or (m["p99_target_s"] * (25 if cpu else 1))
        for name, m in MODELS.items()
    }
    if a.p99_target_image_s:
        cfg["p99_target_s"]["resnet50"] = a.p99_target_image_s
    if a.p99_target_embeddings_s:
        cfg["p99_target_s"]["minilm"] = a.p99_target_embeddings_s
    return cfg


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m load_tests.side_by_side",
        description="In-process ceiling vs plain Ray Serve vs serve_app: same model, payloads "
        "and client. Writes side_by_side.json and side_by_side_<model>.png.",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output directory (default: ${RESULTS_ENV} or {DEFAULT_OUT})",
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke run: short points, coarse sweep (~3 min)"
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: a tiny dry run on logical GPUs (ray.init(num_gpus=1))",
    )
    p.add_argument(
        "--gpu", default="0", help="the CUDA device every setup uses (CUDA_VISIBLE_DEVICES)"
    )
    p.add_argument("--models", default="resnet50,minilm", help="comma-separated: resnet50,minilm")
    p.add_argument(
        "--serve-app-args",
        default="{}",
        help="JSON merged into serve_app's app args, e.g. '{\"batch_wait_timeout_s\": 0.001}'",
    )
    p.add_argument(
        "--batch-wait-timeout-s",
        type=float,
        default=0.005,
        help="plain Ray Serve's @serve.batch wait (serve_app's comes from its args)",
    )
    p.add_argument(
        "--only",
        default=",".join(DEFAULT_PHASES),
        help=f"comma-separated phases to run, of {','.join(PHASES)} (default: all but the last)",
    )
    p.add_argument(
        "--haproxy-plain",
        action="store_true",
        help="also run plain_1 and plain_shared behind HAProxy (fresh cluster, if time allows)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="replicas of the shared layouts, 1/N GPU each (default 4; 2 with --device cpu)",
    )
    p.add_argument(
        "--p99-target-s",
        type=float,
        default=None,
        help="p99 target for every model (default: 0.2 s images, 0.1 s embeddings)",
    )
    p.add_argument("--p99-target-image-s", type=float, default=None)
    p.add_argument("--p99-target-embeddings-s", type=float, default=None)
    p.add_argument(
        "--moderate-rate",
        type=float,
        default=None,
        help="the fixed rate where p50/p99 are compared; the sweep starts there (default 100/s)",
    )
    p.add_argument(
        "--rate-factor", type=float, default=None, help="sweep step (default x2; x4 with --quick)"
    )
    p.add_argument(
        "--max-rate",
        type=float,
        default=None,
        help="highest offered rate (default 25600/s; 1600 with --quick)",
    )
    p.add_argument(
        "--refine",
        type=int,
        default=None,
        help="points bisecting after the first failure (default 1; 0 with --quick)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=None,
        help="re-runs of a failing rate before the sweep takes it as failed (default 1; 0 with "
        "--quick)",
    )
    p.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="measured seconds per rate (default 4; 2 with --quick)",
    )
    p.add_argument(
        "--warmup-s",
        type=float,
        default=None,
        help="unmeasured seconds before each (default 1)",
    )
    p.add_argument(
        "--max-error-rate",
        type=float,
        default=0.01,
        help="a sustained point has at most this error fraction",
    )
    p.add_argument(
        "--inputs-per-request",
        type=int,
        default=1,
        help="inputs in each request's 'input' list (client-side batching); ratios to the "
        "ceiling count inputs/s",
    )
    p.add_argument(
        "--plain-batch", type=int, default=64, help="plain Ray Serve's @serve.batch max_batch_size"
    )
    p.add_argument(
        "--client-procs", type=int, default=None, help="client processes (default 4; 1 on cpu)"
    )
    p.add_argument(
        "--max-connections", type=int, default=128, help="connections per client process"
    )
    p.add_argument(
        "--max-in-flight", type=int, default=2000, help="outstanding requests per client process"
    )
    p.add_argument("--request-timeout-s", type=float, default=5.0)
    p.add_argument(
        "--noop-server-workers",
        type=int,
        default=None,
        help="uvicorn workers of the bare no-op server (default 4)",
    )
    p.add_argument(
        "--max-time-s", type=float, default=None, help="wall-time budget (default 420 s; 240 quick)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep what an existing <out>/side_by_side.json measured and this run did not",
    )
    p.add_argument(
        "--_worker", choices=("ceiling", "cluster", "noop-server"), help=argparse.SUPPRESS
    )
    p.add_argument("--_spec", help=argparse.SUPPRESS)
    p.add_argument("--_port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_workers", type=int, default=1, help=argparse.SUPPRESS)
    return p
