"""The phases of the stack benchmark (see the package's docstring): the in-process ceilings, the
cluster, each family alone under wrk, all of them at once, the NVML budget watch throughout,
the verdict, the JSON."""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from load_tests.benchmarks.stack.plan import (
    KNOWN_ROUTES,
    Family,
    Request,
    families,
    family_row,
    quick_config,
    request_for,
    verdict,
    with_port,
)
from load_tests.benchmarks.throughput.options import parse_cores
from load_tests.harness.meta import PROVENANCE_HELP, ROOT, run_meta
from load_tests.harness.nvml import BudgetWatch, nvml_devices
from load_tests.harness.run import Budget, each_at_once, error_doc, log, write_json
from load_tests.harness.wrk import WrkTarget, find_wrk, run_wrk

PROG = "python -m load_tests.benchmarks.stack"
DEFAULT_CONFIG = ROOT / "configs" / "rag-stack.yaml"
DEFAULT_WRK = str(ROOT / ".tools" / "wrk")
RESULT = "stack.json"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="configs/rag-stack.yaml on one GPU: each family alone, then all at once, "
        "under wrk on each route, with NVML's per-process bytes judged against each replica's "
        "budget; p99 with neighbours against p99 alone, throughput beside the in-process "
        "ceiling. Writes OUT/stack.json.",
        epilog=PROVENANCE_HELP,
    )
    p.add_argument("--out", required=True, type=Path, help="folder for stack.json and logs")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a CPU dry run in about two minutes: one small replica per family this checkout "
        "has, short runs (checks the tool end to end, proves nothing about the GPU)",
    )
    p.add_argument("--duration-s", type=float, default=None, help="each wrk run (default 20)")
    p.add_argument("--warmup-s", type=float, default=None, help="all routes at once first (5)")
    p.add_argument("--connections", type=int, default=None, help="per route (default 32)")
    p.add_argument("--threads", type=int, default=2, help="wrk threads per route")
    p.add_argument("--items-per-request", type=int, default=None, help="texts per request (8)")
    p.add_argument("--wrk", default=DEFAULT_WRK, help="wrk binary (else wrk on PATH)")
    p.add_argument("--client-cores", default="", help="pin wrk to these cores, e.g. 12-15")
    p.add_argument("--max-time-s", type=float, default=480.0, help="the whole run's budget")
    return p


def settings(a: argparse.Namespace) -> dict[str, Any]:
    quick = bool(a.quick)
    pick = lambda v, full, small: v if v is not None else (small if quick else full)  # noqa: E731
    return {
        "device": "cpu" if quick else a.device,
        "quick": quick,
        "duration_s": pick(a.duration_s, 20.0, 3.0),
        "warmup_s": pick(a.warmup_s, 5.0, 2.0),
        "connections": pick(a.connections, 32, 4),
        "threads": 1 if quick else a.threads,
        "items_per_request": pick(a.items_per_request, 8, 4),
        "ceiling_batches": [1, 4, 8] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256],
        "ceiling_min_s": 0.2 if quick else 0.5,
        "image_size": 64 if quick else 224,
        "client_cores": parse_cores(a.client_cores) if a.client_cores else [],
    }


def run_ceilings(
    fams: Sequence[Family], reqs: Mapping[str, Request], cfg: Mapping[str, Any], out: Path
) -> dict[str, Any]:
    """The in-process ceilings, in a process of their own (the GPU is all theirs, then free)."""
    spec = {
        "device": cfg["device"],
        "batches": cfg["ceiling_batches"],
        "min_s": cfg["ceiling_min_s"],
        "families": [
            {
                "application": f.application,
                "app_args": f.app_args,
                "body_b64": base64.b64encode(reqs[f.application].body).decode(),
                "content_type": reqs[f.application].content_type,
                "torch_threads": f.torch_threads,
            }
            for f in fams
        ],
    }
    spec_path, out_path = out / "ceiling_spec.json", out / "ceiling.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "load_tests.benchmarks.stack.ceiling", str(spec_path)]
    proc = subprocess.run([*cmd, str(out_path)], cwd=ROOT, timeout=300, check=False)
    if not out_path.is_file():
        return {
            f.application: {"status": "error", "error": f"exit {proc.returncode}"} for f in fams
        }
    doc: dict[str, Any] = json.loads(out_path.read_text())
    return doc


def load_all(
    wrk: str,
    targets: Mapping[str, WrkTarget],
    cfg: Mapping[str, Any],
    duration_s: float,
    work: Path,
) -> dict[str, dict[str, Any]]:
    """wrk on every target at once for ``duration_s``; figures by application."""

    def one(target: WrkTarget) -> dict[str, Any]:
        return run_wrk(
            wrk,
            target,
            connections=cfg["connections"],
            threads=cfg["threads"],
            duration_s=duration_s,
            cores=cfg["client_cores"],
            work_dir=work,
        )

    return each_at_once(one, targets)


def listing(base: str, fams: Sequence[Family]) -> dict[str, Any]:
    """The base URL's /v1/models: each family's route listed, as the stack promises."""
    try:
        data = httpx.get(f"{base}/v1/models", timeout=10.0).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return {"error": repr(exc)}
    listed = {d.get("application"): d.get("route") for d in data}
    return {
        "models": [{k: d.get(k) for k in ("id", "route", "application", "replicas")} for d in data],
        "every_route_listed": all(listed.get(f.application) == f.route for f in fams),
    }


def replicas_summary(base: str) -> list[dict[str, Any]]:
    keys = ["application", "app", "pid", "gpu_uuid", "budget_bytes", "peak_reserved_bytes"]
    keys += ["max_batch_size", "batches", "batched_items", "largest_batch", "oom_recoveries"]
    try:
        reps = httpx.get(f"{base}/v1/memory", timeout=10.0).json()["replicas"]
    except (httpx.HTTPError, ValueError, KeyError):
        return []
    return [{k: r.get(k) for k in keys} for r in reps]


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    cfg = settings(a)
    budget = Budget(a.max_time_s)
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    from serve_app import adapters
    from serve_app.config.deploy import load_deploy_config
    from serve_app.ops import launch, ports

    ports.private_haproxy_ports()
    port = ports.free_port()
    source = load_deploy_config(a.config)
    known = list(adapters.FAMILIES)
    notes: list[str] = []
    if cfg["quick"]:
        doc, notes = quick_config(source, known, port)
    else:
        doc = with_port(source, port)
    served = {k: adapters.ROUTES.get(k, KNOWN_ROUTES.get(k, "")) for k in known}
    fams = families(doc, served)
    reqs = {
        f.application: request_for(f, cfg["items_per_request"], cfg["image_size"]) for f in fams
    }
    gpus = nvml_devices()
    result: dict[str, Any] = {
        "schema_version": 1,
        "title": "configs/rag-stack.yaml: each family alone and with its neighbours on one GPU",
        "status": "running",
        "meta": run_meta(PROG, argv, gpu=gpus[0]["name"] if gpus else None),
        "device": cfg["device"],
        "settings": cfg,
        "config": str(a.config),
        "serve_config": doc,
        "notes": notes,
    }
    path = out / RESULT
    write_json(path, result)
    wrk = find_wrk(a.wrk)
    if wrk is None:
        result.update(
            status="error", error="no wrk: build it (scripts/make-tools.sh) or pass --wrk"
        )
        write_json(path, result)
        return 2
    log(f"stack: {len(fams)} families: " + ", ".join(f"{f.application} {f.route}" for f in fams))
    result["ceiling"] = run_ceilings(fams, reqs, cfg, out)
    write_json(path, result)
    watch: BudgetWatch | None = None
    try:
        started = launch.run(doc, haproxy=True, ready_timeout_s=max(60.0, budget.left() - 200))
        base = started.url
        log(f"stack: serving at {base}")
        watch = BudgetWatch(f"{base}/v1/memory", interval_s=0.1).start()
        targets = {}
        for f in fams:
            body_path = out / f"body-{f.application}.bin"
            body_path.write_bytes(reqs[f.application].body)
            headers = {"content-type": reqs[f.application].content_type}
            targets[f.application] = WrkTarget(f"{base}{f.route}", headers, body_path)
        result["listing"] = listing(base, fams)
        runs = len(fams) + 1
        duration = min(cfg["duration_s"], max(2.0, (budget.left() - cfg["warmup_s"]) / runs - 5))
        if duration < cfg["duration_s"]:
            notes.append(f"runs cut to {duration:.0f} s each to fit --max-time-s")
        log(f"stack: warm-up, all routes for {cfg['warmup_s']:g} s")
        result["warmup"] = load_all(wrk, targets, cfg, cfg["warmup_s"], out)
        alone = {}
        for f in fams:
            log(f"stack: {f.application} alone for {duration:.0f} s")
            alone.update(load_all(wrk, {f.application: targets[f.application]}, cfg, duration, out))
        log(f"stack: all {len(fams)} at once for {duration:.0f} s")
        mixed = load_all(wrk, targets, cfg, duration, out)
        result["replicas"] = replicas_summary(base)
        budget_doc = watch.stop()
        watch = None
        ceiling = result["ceiling"]
        rows = [
            family_row(
                f,
                reqs[f.application],
                alone.get(f.application),
                mixed.get(f.application),
                ceiling.get(f.application),
            )
            for f in fams
        ]
        result.update(
            families=rows,
            budget_watch=budget_doc,
            verdict=verdict(rows, budget_doc, cfg["device"] == "cuda"),
        )
        result["status"] = "ok"
        for r in rows:
            log(
                f"stack: {r['application']}: p99 {r['p99_alone_ms']} -> {r['p99_mixed_ms']} ms "
                f"({r['p99_ratio']}x), items/s {r['items_per_s_alone']} -> "
                f"{r['items_per_s_mixed']} (ceiling {r['ceiling_items_per_s']}), "
                f"errors {r['errors']}"
            )
        log(f"stack: verdict {result['verdict']}")
    except Exception as exc:  # noqa: BLE001 - the JSON says what failed, then the exit code
        result.update(status="error", **error_doc(exc))
        log(f"stack: failed: {result['error']}")
    finally:
        if watch is not None:
            result["budget_watch"] = watch.stop()
        result["finished_at_unix_s"] = time.time()
        write_json(path, result)
        launch.shutdown()
    log(f"stack: wrote {path}")
    return 0 if result["status"] == "ok" else 1
