"""Side by side: one model, the same payloads and the same client against four setups.

    1. ceiling      the model alone in one process, batched, no serving (batch 64 and 8)
    2. plain_1      plain Ray Serve as the docs show it: one replica, num_gpus=1, @serve.batch,
                    Ray's default proxy
    3. plain_shared plain Ray Serve, N replicas at num_gpus=1/N, no caps, default proxy
    4. serve_app    serve_app.replica.ModelServer, N replicas at 1/N under caps, calibrated
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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
ROOT = Path(__file__).resolve().parent.parent
RESULTS_ENV = "SERVE_APP_RESULTS_DIR"
DEFAULT_OUT = "docs/results/benchmarks"
NOOP_LIMIT_S = 0.002  # "the stack adds no more than 2 ms p50"

MODELS: dict[str, dict[str, Any]] = {
    "resnet50": {
        "kind": "image",
        "items": "images",
        "model_name": "resnet50",
        "route": "/v1/classify",
        "p99_target_s": 0.2,
    },
    "minilm": {
        "kind": "embeddings",
        "items": "texts",
        "model_name": "all-MiniLM-L6-v2",
        "route": "/v1/embeddings",
        "p99_target_s": 0.1,
    },
}
# server: which deployment; shared: N replicas at 1/N of the GPU (else one at a whole GPU).
SETUPS: dict[str, dict[str, Any]] = {
    "plain_1": {"server": "plain", "shared": False, "proxy": "default"},
    "plain_shared": {"server": "plain", "shared": True, "proxy": "default"},
    "serve_app": {"server": "serve_app", "shared": True, "proxy": "haproxy"},
    "plain_1_haproxy": {"server": "plain", "shared": False, "proxy": "haproxy"},
    "plain_shared_haproxy": {"server": "plain", "shared": True, "proxy": "haproxy"},
}
PHASES = ("ceiling", "client", "noop", "plain_1", "plain_shared", "serve_app", "haproxy_plain")
DEFAULT_PHASES = PHASES[:-1]  # haproxy_plain only with --haproxy-plain (or --only)


def setup_label(key: str, replicas: int) -> str:
    spec = SETUPS[key]
    who = "serve_app" if spec["server"] == "serve_app" else "plain Ray Serve"
    layout = f"{replicas} x {1 / replicas:g} GPU" if spec["shared"] else "1 x 1 GPU"
    proxy = "HAProxy" if spec["proxy"] == "haproxy" else "default proxy"
    return f"{who}, {layout}, {proxy}"


# --------------------------------------------------------------------------- pure functions


def _p(stats: Mapping[str, Any] | None, key: str) -> float | None:
    if not stats or stats.get(key) is None:
        return None
    return float(stats[key])


def point_passes(
    summary: Mapping[str, Any], p99_target_s: float, max_error_rate: float = 0.01
) -> bool:
    """A rate point is sustained when errors stay under `max_error_rate`, p99 of the successful
    requests is under the target, and at least 80% of the scheduled rate completed."""
    if summary.get("requests", 0) <= 0 or summary.get("ok", 0) <= 0:
        return False
    if float(summary.get("error_rate", 1.0)) > max_error_rate:
        return False
    p99 = _p(summary.get("latency_s"), "p99")
    if p99 is None or p99 > p99_target_s:
        return False
    scheduled = float(summary.get("scheduled_rate_per_s") or 0.0)
    return float(summary.get("throughput_per_s", 0.0)) >= 0.8 * scheduled


def best_sustained(
    summaries: Iterable[Mapping[str, Any]], p99_target_s: float, max_error_rate: float = 0.01
) -> dict[str, Any] | None:
    """The passing point with the highest throughput, or None when no point passes."""
    passing = [s for s in summaries if point_passes(s, p99_target_s, max_error_rate)]
    if not passing:
        return None
    best = max(passing, key=lambda s: float(s["throughput_per_s"]))
    return {
        "throughput_per_s": float(best["throughput_per_s"]),
        "offered_rate_per_s": float(best["offered_rate_per_s"]),
        "p50_s": _p(best.get("latency_s"), "p50"),
        "p99_s": _p(best.get("latency_s"), "p99"),
        "error_rate": float(best.get("error_rate", 0.0)),
    }


def point_at(summaries: Iterable[Mapping[str, Any]], rate: float) -> dict[str, Any] | None:
    """p50/p99/throughput of the point offered at `rate` (within 1%; the last one, i.e. the
    re-run of a failed point), or None."""
    for s in reversed(list(summaries)):
        if abs(float(s["offered_rate_per_s"]) - rate) <= 0.01 * rate:
            return {
                "offered_rate_per_s": float(s["offered_rate_per_s"]),
                "throughput_per_s": float(s["throughput_per_s"]),
                "p50_s": _p(s.get("latency_s"), "p50"),
                "p99_s": _p(s.get("latency_s"), "p99"),
                "error_rate": float(s.get("error_rate", 0.0)),
            }
    return None


def round_rate(rate: float) -> float:
    """Three significant figures, so sweep rates read well (4525.48 -> 4530)."""
    if rate <= 0:
        return rate
    digits = 2 - int(math.floor(math.log10(rate)))
    return float(round(rate, digits))


def next_rate(
    history: Sequence[tuple[float, bool]],
    *,
    start: float,
    factor: float = 2.0,
    max_rate: float = math.inf,
    refine: int = 1,
) -> float | None:
    """The next offered rate of an ascending sweep, given (rate, passed) so far; None to stop.

    Starts at `start`, multiplies by `factor` while points pass (ending with one point at
    `max_rate`), and after the first failure spends up to `refine` points bisecting
    geometrically between the highest pass and the lowest failure above it. When the very
    first point fails, one refine point goes to start / factor**2.
    """
    if not history:
        return start
    fail_at = next((i for i, (_, ok) in enumerate(history) if not ok), None)
    if fail_at is None:
        last = history[-1][0]
        if last >= max_rate:
            return None
        return min(round_rate(last * factor), max_rate)
    if len(history) - fail_at - 1 >= refine:
        return None
    passed = [r for r, ok in history if ok]
    tried = {r for r, _ in history}
    if not passed:
        low = round_rate(min(tried) / factor**2)
        return None if low in tried or low <= 0 else low
    lo = max(passed)
    above = [r for r, ok in history if not ok and r > lo]
    if not above:
        return None
    hi = min(above)
    mid = round_rate(math.sqrt(lo * hi))
    if hi / lo < 1.15 or mid in tried:
        return None
    return mid


def client_saturated(summary: Mapping[str, Any]) -> bool:
    """Whether the client, not the server, may have limited a point: a client process was
    nearly always busy, or requests went out late (send lag p99 over 20 ms)."""
    lag = _p(summary.get("send_lag_s"), "p99")
    return float(summary.get("client_cpu_frac_max") or 0.0) >= 0.9 or (lag or 0.0) > 0.02


def limit_hint(points: Sequence[Mapping[str, Any]]) -> str | None:
    """'client' when the first failing point of a sweep had a saturated client, else
    'server'; None when nothing failed."""
    failed = [p for p in points if p.get("passed") is False]
    if not failed:
        return None
    return "client" if failed[0].get("client_saturated") else "server"


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return round(float(num) / float(den), 4)


def _best_of(setups: Mapping[str, Any], key: str) -> float | None:
    """Best sustained inputs/s (requests/s times inputs per request)."""
    best = (setups.get(key) or {}).get("best")
    if not best:
        return None
    return float(best.get("items_per_s", best["throughput_per_s"]))


def add_items_rate(best: dict[str, Any] | None, inputs_per_request: int) -> dict[str, Any] | None:
    """``best`` with ``items_per_s`` (what the ceiling counts) beside requests/s."""
    if best is not None:
        best["items_per_s"] = float(best["throughput_per_s"]) * inputs_per_request
    return best


def compute_ratios(model_doc: Mapping[str, Any]) -> dict[str, float | None]:
    """Each setup's best sustained throughput over the in-process ceiling (the largest batch
    measured), and serve_app's over plain Ray Serve's (same layout, and the others)."""
    setups = model_doc.get("setups") or {}
    ceiling = (model_doc.get("ceiling") or {}).get("items_per_s_max")
    out: dict[str, float | None] = {}
    for key in SETUPS:
        if key in setups:
            out[f"{key}_vs_ceiling"] = ratio(_best_of(setups, key), ceiling)
    app = _best_of(setups, "serve_app")
    for base in ("plain_shared", "plain_1", "plain_shared_haproxy", "plain_1_haproxy"):
        if base in setups:
            out[f"serve_app_vs_{base}"] = ratio(app, _best_of(setups, base))
    return out


def noop_verdict(
    serve_p50_s: float | None, baseline_p50_s: float | None, limit_s: float = NOOP_LIMIT_S
) -> dict[str, Any]:
    """Serve's added p50 over the bare server's, with the same client: within `limit_s`?"""
    if serve_p50_s is None or baseline_p50_s is None:
        return {"added_p50_s": None, "limit_s": limit_s, "passed": None}
    added = serve_p50_s - baseline_p50_s
    return {"added_p50_s": added, "limit_s": limit_s, "passed": added <= limit_s}


def memory_summary(
    samples: Sequence[Mapping[str, Any]],
    t0: float,
    t1: float,
    num_gpus: float,
    totals_by_uuid: Mapping[str, int],
) -> dict[str, Any]:
    """Peak NVML bytes of each process that appeared in [t0, t1] (not seen in the 5 s before),
    against its share num_gpus x the device's total bytes."""
    before = {
        s["pid"] for s in samples if s.get("source") == "nvml" and t0 - 5.0 <= s["t_unix_s"] < t0
    }
    peaks: dict[int, tuple[int, str]] = {}
    for s in samples:
        if s.get("source") != "nvml" or not t0 <= s["t_unix_s"] <= t1 or s["pid"] in before:
            continue
        used = s.get("used_bytes")
        if used is None:
            continue
        old = peaks.get(s["pid"], (0, ""))[0]
        peaks[s["pid"]] = (max(old, int(used)), str(s.get("gpu_uuid")))
    replicas = []
    for pid, (peak, uuid) in sorted(peaks.items()):
        total = totals_by_uuid.get(uuid)
        budget = int(num_gpus * total) if total else None
        replicas.append(
            {
                "pid": pid,
                "gpu_uuid": uuid,
                "peak_nvml_bytes": peak,
                "budget_bytes": budget,
                "peak_over_budget": ratio(peak, budget),
            }
        )
    overs = [r["peak_over_budget"] for r in replicas if r["peak_over_budget"] is not None]
    return {
        "num_gpus_per_replica": num_gpus,
        "replicas": replicas,
        "max_peak_nvml_bytes": max((r["peak_nvml_bytes"] for r in replicas), default=None),
        "max_peak_over_budget": max(overs, default=None),
    }


def plan_clusters(phases: Iterable[str]) -> list[tuple[str, str, list[str], bool]]:
    """(tag, proxy, setup keys, run the no-op) per fresh Ray cluster, in run order: serve_app
    (and the HAProxy no-op) first, then plain Ray Serve on the default proxy, then plain Ray
    Serve behind HAProxy."""
    phases = set(phases)
    clusters: list[tuple[str, str, list[str], bool]] = []
    noop = "noop" in phases
    if "serve_app" in phases or noop:
        clusters.append(
            ("haproxy", "haproxy", ["serve_app"] if "serve_app" in phases else [], noop)
        )
    plain = [k for k in ("plain_1", "plain_shared") if k in phases]
    if plain or noop:
        clusters.append(("default", "default", plain, noop))
    if "haproxy_plain" in phases:
        keys = ["plain_1_haproxy", "plain_shared_haproxy"]
        clusters.append(("haproxy_plain", "haproxy", keys, False))
    return clusters


def cluster_weight(keys: Sequence[str], noop: bool, n_models: int) -> float:
    """Relative wall time of a cluster: start-up and teardown, the no-op, and the sweeps
    (serve_app's run longer: they pass more rate points before the first failure)."""
    return 0.9 + 0.3 * noop + sum(2.0 if k == "serve_app" else 0.8 for k in keys) * n_models


def merge_previous(doc: dict[str, Any], prev: Mapping[str, Any]) -> list[str]:
    """Fill what this run did not measure from an earlier side_by_side.json (same layout).
    Returns what was taken, as "model/setup" and section names."""
    taken = []
    for name, pm in (prev.get("models") or {}).items():
        m = doc["models"].get(name)
        if m is None:
            doc["models"][name] = dict(pm)
            taken.append(name)
            continue
        if not m.get("ceiling") and pm.get("ceiling"):
            m["ceiling"] = pm["ceiling"]
            taken.append(f"{name}/ceiling")
        for key, setup in (pm.get("setups") or {}).items():
            if key not in m["setups"]:
                m["setups"][key] = setup
                taken.append(f"{name}/{key}")
    if not doc.get("client") and prev.get("client"):
        doc["client"] = prev["client"]
        taken.append("client")
    for key, value in (prev.get("noop") or {}).items():
        if key not in doc["noop"] and not key.startswith("verdict_"):
            doc["noop"][key] = value
            taken.append(f"noop/{key}")
    return taken


# --------------------------------------------------------------------------- small helpers

_T0 = time.time()


def log(msg: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp} +{time.time() - _T0:6.1f}s] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _error(exc: BaseException) -> dict[str, Any]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": tb[-6000:]}


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f} ms"


def nvml_devices() -> list[dict[str, Any]]:
    """Name, UUID, total bytes and driver of each GPU via NVML ([] when there is none)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPUs to describe
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)

            def text(v: Any) -> str:
                return v.decode() if isinstance(v, bytes) else str(v)

            out.append(
                {
                    "index": i,
                    "name": text(pynvml.nvmlDeviceGetName(h)),
                    "uuid": text(pynvml.nvmlDeviceGetUUID(h)),
                    "total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "driver_version": text(driver),
                }
            )
        return out
    finally:
        pynvml.nvmlShutdown()


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity_count": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
    }
    for mod in ("torch", "torchvision", "transformers", "ray", "httpx", "uvicorn", "starlette"):
        try:
            info[f"{mod}_version"] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing package is recorded, not fatal
            info[f"{mod}_version"] = None
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        info["torch_cuda"] = None
    gpus = nvml_devices()
    info["gpus"] = gpus
    info["gpu_name"] = gpus[0]["name"] if gpus else None
    info["gpu_total_bytes"] = gpus[0]["total_bytes"] if gpus else None
    info["driver_version"] = gpus[0]["driver_version"] if gpus else None
    try:
        import uvloop  # noqa: F401

        info["client_event_loop"] = "uvloop"
    except ImportError:
        info["client_event_loop"] = "asyncio"
    return info


# --------------------------------------------------------------------------- load client


def _run_loop(coro: Any) -> Any:
    try:
        import uvloop

        if hasattr(uvloop, "run"):
            return uvloop.run(coro)
    except ImportError:
        pass
    return asyncio.run(coro)


def _ping(sleep_s: float) -> int:
    from load_tests import bench  # noqa: F401 - warm the import in the worker

    time.sleep(sleep_s)
    return os.getpid()


def _client_job(job: dict[str, Any]) -> dict[str, Any]:
    """One client process's share of one rate point (runs in a spawned pool worker)."""
    from load_tests import bench

    requests = [bench.PreparedRequest(*r) for r in job["requests"]]
    delay = job["start_at_unix"] - time.time()
    if delay > 0:
        time.sleep(delay)
    cpu0, wall0 = time.process_time(), time.monotonic()
    res = _run_loop(
        bench.run_rate(
            requests,
            job["rate"],
            job["duration_s"],
            warmup_s=job["warmup_s"],
            seed=job["seed"],
            max_in_flight=job["max_in_flight"],
            max_connections=job["max_connections"],
            timeout_s=job["timeout_s"],
            time_limit_s=job["time_limit_s"],
        )
    )
    wall = max(1e-9, time.monotonic() - wall0)
    return {
        "records": [
            (r.scheduled_s, r.latency_s, r.status, r.error, r.send_lag_s, r.warmup)
            for r in res.records
        ],
        "cpu_frac": (time.process_time() - cpu0) / wall,
        "truncated": res.truncated,
    }


class LoadClient:
    """`procs` spawned client processes; one rate point is split evenly across them (the sum
    of independent Poisson processes is Poisson) and their records merged before summarising."""

    def __init__(
        self, procs: int, max_connections: int, timeout_s: float, max_in_flight: int
    ) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.procs = procs
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        ctx = multiprocessing.get_context("spawn")
        self.pool = ProcessPoolExecutor(max_workers=procs, mp_context=ctx)
        pings = [self.pool.submit(_ping, 0.5) for _ in range(procs)]
        self.pids = sorted({f.result(timeout=120) for f in pings})

    def point(
        self,
        requests: Sequence[Any],
        rate: float,
        duration_s: float,
        warmup_s: float,
        seed: int,
        drain_s: float = 2.0,
    ) -> dict[str, Any]:
        from load_tests import bench

        wire = [(r.method, r.url, dict(r.headers), r.content) for r in requests]
        start_at = time.time() + 0.3
        jobs = [
            {
                "requests": wire,
                "rate": rate / self.procs,
                "duration_s": duration_s,
                "warmup_s": warmup_s,
                "seed": seed * 1009 + i,
                "max_in_flight": self.max_in_flight,
                "max_connections": self.max_connections,
                "timeout_s": self.timeout_s,
                "time_limit_s": warmup_s + duration_s + drain_s,
                "start_at_unix": start_at,
            }
            for i in range(self.procs)
        ]
        t0 = time.monotonic()
        futures = [self.pool.submit(_client_job, j) for j in jobs]
        limit = warmup_s + duration_s + drain_s + 60.0
        outs = [f.result(timeout=limit) for f in futures]
        records = [bench.Record(*t) for o in outs for t in o["records"]]
        summary = asdict(bench.summarise(records, rate, duration_s, warmup_s))
        summary["client_cpu_frac_max"] = round(max(o["cpu_frac"] for o in outs), 3)
        summary["client_saturated"] = client_saturated(summary)
        summary["truncated"] = any(o["truncated"] for o in outs)
        summary["wall_s"] = round(time.monotonic() - t0, 2)
        return summary

    def close(self) -> None:
        procs = list(getattr(self.pool, "_processes", {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.terminate()


def describe_point(s: Mapping[str, Any]) -> str:
    lat = s.get("latency_s") or {}
    errs = ",".join(f"{k}={v}" for k, v in (s.get("error_counts") or {}).items()) or "-"
    verdict = {True: "PASS", False: "fail", None: ""}[s.get("passed")]
    return (
        f"offered {s['offered_rate_per_s']:8.1f}/s  thru {s['throughput_per_s']:8.1f}/s  "
        f"p50 {_ms(lat.get('p50'))}  p99 {_ms(lat.get('p99'))}  err {s['error_rate'] * 100:.2f}%  "
        f"client cpu {s.get('client_cpu_frac_max', 0):.2f}"
        f"{' SATURATED' if s.get('client_saturated') else ''}  {verdict}  {errs}"
    )


def sweep(
    load: LoadClient,
    requests: Sequence[Any],
    cfg: Mapping[str, Any],
    *,
    p99_target_s: float,
    deadline: float,
    label: str,
    start: float | None = None,
    points: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Ascending open-loop sweep (see next_rate); stops at the deadline. Points are appended
    to `points` as they finish (pass a list to keep them if a later point raises).

    A failing rate is measured ``cfg["retries"]`` more times (default 1) before the sweep
    takes it as failed: one 4 s point can fail on a single stall (on the H200 the same setup's
    p99 at 400/s was 27 ms in one run and 269 ms in another). Every run is kept in `points`,
    the re-runs marked ``"retry": n``; the rate counts as sustained if a re-run passes."""
    history: list[tuple[float, bool]] = []
    points = [] if points is None else points
    per_point = cfg["warmup_s"] + cfg["duration_s"] + 3.0
    while True:
        rate = next_rate(
            history,
            start=start if start is not None else cfg["moderate_rate"],
            factor=cfg["rate_factor"],
            max_rate=cfg["max_rate"],
            refine=cfg["refine"],
        )
        if rate is None:
            break
        if time.time() + per_point > deadline:
            log(f"{label}: time budget reached; sweep stops before {rate:g}/s")
            break
        for attempt in range(1 + int(cfg.get("retries", 1))):
            if attempt and time.time() + per_point > deadline:
                break
            s = load.point(
                requests, rate, cfg["duration_s"], cfg["warmup_s"], cfg["seed"] + len(points)
            )
            s["passed"] = point_passes(s, p99_target_s, cfg["max_error_rate"])
            if attempt:
                s["retry"] = attempt
            points.append(s)
            log(f"{label}: {describe_point(s)}{' (re-run)' if attempt else ''}")
            if s["passed"]:
                break
            time.sleep(cfg["pause_after_fail_s"])  # let an overloaded server drain
        history.append((rate, s["passed"]))
    return points


# --------------------------------------------------------------------------- the deployments


def preprocess_image(blob: bytes, size: int = 224) -> Any:
    """JPEG/PNG bytes -> normalised CHW float32, the same steps as serve_app's image adapter:
    RGB, the centre square that becomes a size x size crop after resizing the short side to
    size*256/224, resized in one bilinear step, then ImageNet mean/std."""
    import io

    import numpy as np
    from PIL import Image

    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32)
    img = Image.open(io.BytesIO(blob)).convert("RGB")
    scale = size * 256 / 224 / min(img.size)
    side = size / scale
    left, top = (img.width - side) / 2, (img.height - side) / 2
    img = img.resize(
        (size, size), Image.Resampling.BILINEAR, box=(left, top, left + side, top + side)
    )
    arr = (np.asarray(img, dtype=np.float32) / 255.0 - mean) / std
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def build_resnet50() -> Any:
    """torchvision's ResNet-50 with random weights (serve_app's copy where torchvision is
    missing, as on the CPU test machine; same module layout)."""
    try:
        import torchvision

        return torchvision.models.resnet50(weights=None)
    except Exception:  # noqa: BLE001 - no or broken torchvision
        from serve_app.adapters.resnet import build_resnet

        return build_resnet("resnet50")


def minilm_dir() -> str:
    from serve_app.adapters.embeddings import SKELETON_DIR

    return str(SKELETON_DIR)


def plain_image_deployment(max_batch_size: int, batch_wait_timeout_s: float) -> Any:
    """ResNet-50 as Ray's docs write a batched model: decode in __call__, @serve.batch around
    the forward pass, fp16 channels-last on the GPU."""
    from ray import serve
    from starlette.requests import Request

    class PlainImageClassifier:
        def __init__(self) -> None:
            import torch

            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
            model = build_resnet50().to(self.device, self.dtype).eval()
            if self.device.type == "cuda":
                model = model.to(memory_format=torch.channels_last)
            self.model = model

        async def __call__(self, request: Request) -> dict[str, Any]:
            import asyncio
            import base64

            body = await request.json()
            blobs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            images = [preprocess_image(base64.b64decode(b)) for b in blobs]
            outs = await asyncio.gather(*(self.classify(im) for im in images))
            data = [
                {
                    "index": n,
                    "top_k": [
                        {"class_id": int(c), "score": float(s)}
                        for s, c in zip(scores, ids, strict=True)
                    ],
                }
                for n, (scores, ids) in enumerate(outs)
            ]
            return {"object": "list", "model": body.get("model"), "data": data}

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def classify(self, images: list[Any]) -> list[Any]:
            import numpy as np
            import torch

            batch = torch.from_numpy(np.stack(images)).to(self.device)
            if self.device.type == "cuda":
                batch = batch.to(dtype=self.dtype, memory_format=torch.channels_last)
            with torch.inference_mode():
                probs = torch.softmax(self.model(batch).float(), dim=1)
                scores, ids = probs.topk(5, dim=1)
            s, i = scores.cpu().numpy(), ids.cpu().numpy()
            return [(s[k], i[k]) for k in range(len(images))]

    return serve.deployment(PlainImageClassifier)


def plain_embeddings_deployment(max_batch_size: int, batch_wait_timeout_s: float) -> Any:
    """MiniLM (random weights from the skeleton config) as Ray's docs write a batched model:
    tokenize in __call__, @serve.batch around pad + forward + mean pooling + L2 norm."""
    from ray import serve
    from starlette.requests import Request

    model_dir = minilm_dir()

    class PlainEmbedder:
        def __init__(self) -> None:
            import torch
            from transformers import AutoConfig, AutoModel, AutoTokenizer

            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            dtype = torch.float16 if self.device.type == "cuda" else torch.float32
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
            model = AutoModel.from_config(AutoConfig.from_pretrained(model_dir))
            self.model = model.to(self.device, dtype).eval()
            self.pad_id = int(self.tokenizer.pad_token_id or 0)

        async def __call__(self, request: Request) -> dict[str, Any]:
            import asyncio

            body = await request.json()
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            ids = self.tokenizer(texts, truncation=True, max_length=256)["input_ids"]
            vecs = await asyncio.gather(*(self.embed(x) for x in ids))
            data = [{"object": "embedding", "index": n, "embedding": v} for n, v in enumerate(vecs)]
            return {"object": "list", "model": body.get("model"), "data": data}

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def embed(self, batch_ids: list[list[int]]) -> list[list[float]]:
            import torch

            longest = max(len(x) for x in batch_ids)
            ids = torch.full((len(batch_ids), longest), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch_ids), longest), dtype=torch.long)
            for row, seq in enumerate(batch_ids):
                ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[row, : len(seq)] = 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            with torch.inference_mode():
                hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
                m = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled.float(), p=2, dim=1)
            return pooled.cpu().numpy().tolist()

    return serve.deployment(PlainEmbedder)


def noop_deployment() -> Any:
    """A FastAPI-ingress deployment whose one route does nothing (serve_app's ingress shape)."""
    from fastapi import FastAPI
    from ray import serve

    api = FastAPI()

    @serve.ingress(api)
    class Noop:
        @api.post("/noop")
        async def noop(self) -> dict[str, bool]:
            return {"ok": True}

    return serve.deployment(Noop)


def create_noop_app() -> Any:
    """The bare uvicorn + Starlette no-op server used to measure the client's own ceiling."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def noop(request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse({"ok": True})

    return Starlette(routes=[Route("/{path:path}", noop, methods=["GET", "POST"])])


def noop_request(url: str) -> Any:
    from load_tests import bench

    return bench.PreparedRequest("POST", url, {"Content-Type": "application/json"}, b"{}")


# --------------------------------------------------------------------------- ceiling worker


def _time_it(fn: Callable[[], Any], sync: Callable[[], None], min_s: float) -> float:
    """Seconds per call of fn (after two warm-up calls), timed over at least min_s; calls are
    queued in growing groups between synchronisations, as a serving loop would issue them."""
    for _ in range(2):
        fn()
    sync()
    n, group = 0, 1
    t0 = time.perf_counter()
    while True:
        for _ in range(group):
            fn()
        n += group
        sync()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s and n >= 3:
            return elapsed / n
        group = min(group * 2, 32)


def ceiling_worker(spec: Mapping[str, Any]) -> dict[str, Any]:
    """In one process, the model alone: items/s per batch size, plus one CPU thread's
    decode/tokenize rate for the same payloads."""
    import torch

    from load_tests import payloads

    cuda = spec["device"] == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch sees no CUDA device")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.float16 if cuda else torch.float32
    torch.backends.cudnn.benchmark = True

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    out: dict[str, Any] = {}
    for name in spec["models"]:
        doc: dict[str, Any] = {
            "device": str(device),
            "dtype": str(dtype).replace("torch.", ""),
            "items_per_s": {},
        }
        out[name] = doc
        try:
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            if MODELS[name]["kind"] == "image":
                model = build_resnet50().to(device, dtype).eval()
                if cuda:
                    model = model.to(memory_format=torch.channels_last)
                doc["layout"] = "channels_last" if cuda else "contiguous"
                for b in spec["batches"]:
                    x = torch.randn(b, 3, 224, 224, device=device, dtype=dtype)
                    if cuda:
                        x = x.to(memory_format=torch.channels_last)

                    def fwd(x: Any = x, model: Any = model) -> None:
                        with torch.inference_mode():
                            model(x)

                    per = _time_it(fwd, sync, spec["min_s"])
                    doc["items_per_s"][str(b)] = b / per
                blobs = [payloads.image_bytes(224, "jpeg", s) for s in range(4)]
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < spec["cpu_min_s"]:
                    preprocess_image(blobs[n % 4])
                    n += 1
                doc["cpu_preprocess_items_per_s_one_thread"] = n / (time.perf_counter() - t0)
            else:
                from transformers import AutoConfig, AutoModel, AutoTokenizer

                tok = AutoTokenizer.from_pretrained(minilm_dir())
                model = AutoModel.from_config(AutoConfig.from_pretrained(minilm_dir()))
                model = model.to(device, dtype).eval()
                texts = payloads.texts("short", max(spec["batches"]), 0)
                for b in spec["batches"]:
                    enc = tok(texts[:b], padding=True, return_tensors="pt").to(device)

                    def fwd(enc: Any = enc, model: Any = model) -> None:
                        with torch.inference_mode():
                            h = model(**enc).last_hidden_state
                            m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
                            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                            torch.nn.functional.normalize(pooled.float(), p=2, dim=1)

                    per = _time_it(fwd, sync, spec["min_s"])
                    doc["items_per_s"][str(b)] = b / per
                    doc["tokens_per_text_padded"] = int(enc["input_ids"].shape[1])
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < spec["cpu_min_s"]:
                    tok(texts[n % len(texts)])
                    n += 1
                doc["cpu_preprocess_items_per_s_one_thread"] = n / (time.perf_counter() - t0)
            doc["items_per_s_max"] = max(doc["items_per_s"].values())
            if cuda:
                doc["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
            model = None  # free it before the next model
            doc["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - one model's failure must not hide the other
            doc.update(status="error", **_error(exc))
        log(
            f"ceiling {name}: "
            + ", ".join(f"batch {b}: {v:,.0f}/s" for b, v in doc["items_per_s"].items())
            + (f"  ({doc.get('error')})" if doc.get("status") == "error" else "")
        )
    return out


# --------------------------------------------------------------------------- cluster worker


def _private_env(proxy: str, scratch: Path, spec: Mapping[str, Any]) -> None:
    """Environment for this worker's Ray cluster; set before ray.init so every Ray process
    (and Serve's constants in this driver) sees it."""
    os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1" if proxy == "haproxy" else "0"
    # serve_app's cluster runs as `serve-app run` starts Ray (user code on Serve's own loop);
    # plain Ray Serve keeps Ray's default.
    serve_app_here = any(
        SETUPS[j["setup"]]["server"] == "serve_app" for j in spec["jobs"] if "setup" in j
    )
    os.environ["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] = "0" if serve_app_here else "1"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "2")
    # HAProxy's files default to a shared /tmp/haproxy-serve; its side ports are fixed. Private
    # ones let this run beside another Serve and tell our HAProxy apart by its config path.
    os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"] = str(scratch / "haproxy.cfg")
    os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"] = str(scratch / "admin.sock")
    os.environ["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] = str(scratch)
    os.environ["RAY_SERVE_HAPROXY_SERVER_STATE_FILE"] = str(scratch / "server-state")
    from serve_app.launch import private_haproxy_ports

    private_haproxy_ports()
    if spec["device"] == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(spec["gpu"])
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)


def kill_matching(marker: str, names: Sequence[str] = ()) -> list[int]:
    """Terminate (then kill) processes whose command line contains `marker` (and, when
    `names` is given, whose name contains one of them). Returns their PIDs."""
    import psutil

    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = " ".join(proc.info.get("cmdline") or [])
            name = proc.info.get("name") or ""
            if proc.pid == me or marker not in cmd:
                continue
            if names and not any(n in name or n in cmd.split(" ")[0] for n in names):
                continue
            found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for proc in found:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(found, timeout=5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return [p.pid for p in found]


def _deploy(app: Any, name: str, timeout_s: float) -> None:
    from ray import serve
    from ray.serve import RunTarget

    serve.run_many(
        [RunTarget(target=app, name=name, route_prefix="/")],
        wait_for_ingress_deployment_creation=False,
        wait_for_applications_running=False,
    )
    deadline = time.monotonic() + timeout_s
    status = "?"
    while time.monotonic() < deadline:
        app_status = serve.status().applications.get(name)
        if app_status is not None:
            status = str(app_status.status)
            if status.endswith("RUNNING"):
                return
            if "FAILED" in status:
                details = [app_status.message] + [
                    f"{dep}: {d.message}" for dep, d in app_status.deployments.items() if d.message
                ]
                raise RuntimeError(f"{name}: {status}: " + "\n".join(details)[:3000])
        time.sleep(0.5)
    raise TimeoutError(f"{name} not RUNNING after {timeout_s:.0f} s (last status {status})")


def _wait_answer(request: Any, timeout_s: float) -> float:
    """Send the real request until it gets a 2xx (HAProxy reloads after deploy; the first
    forward pass initialises the GPU). Returns the seconds it took."""
    import httpx

    t0 = time.monotonic()
    last = ""
    with httpx.Client(timeout=30.0) as http:
        while time.monotonic() - t0 < timeout_s:
            try:
                resp = http.request(
                    request.method, request.url, headers=request.headers, content=request.content
                )
                if 200 <= resp.status_code < 300:
                    return time.monotonic() - t0
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.3)
    raise TimeoutError(f"{request.url} gave no 2xx within {timeout_s:.0f} s; last: {last}")


def _serve_app_args(model: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    from serve_app.config import parse_args

    m = MODELS[model]
    raw: dict[str, Any] = {
        "load_format": "dummy",
        "dtype": "float16",
        "model_name": m["model_name"],
    }
    if m["kind"] == "image":
        raw.update(adapter="image-classification", arch="resnet50")
    else:
        raw.update(adapter="embeddings", model_path=minilm_dir())
    raw.update(spec["cfg"].get("serve_app_args") or {})
    return parse_args(raw).model_dump()


def run_setup(
    job: Mapping[str, Any],
    spec: Mapping[str, Any],
    load: LoadClient,
    base_url: str,
    memory: Any,
    totals: Mapping[str, int],
) -> dict[str, Any]:
    from ray import serve

    from load_tests import bench

    key, model = job["setup"], job["model"]
    m, s = MODELS[model], SETUPS[key]
    replicas = spec["replicas"] if s["shared"] else 1
    num_gpus = 1.0 / replicas
    cfg = spec["cfg"]
    per_request = int(cfg.get("inputs_per_request", 1))
    label = f"{model}/{key}"
    doc: dict[str, Any] = {
        "inputs_per_request": per_request,
        "label": setup_label(key, spec["replicas"]),
        "server": s["server"],
        "proxy": s["proxy"],
        "replicas": replicas,
        "num_gpus_per_replica": num_gpus,
        "status": "error",
    }
    options: dict[str, Any] = {
        "num_replicas": replicas,
        "ray_actor_options": {"num_gpus": num_gpus, "num_cpus": spec["replica_cpus"]},
    }
    name = f"{key}_{model}"
    t0 = time.time()
    try:
        if s["server"] == "serve_app":
            from serve_app.replica import ModelServer

            app = ModelServer.options(**options).bind(_serve_app_args(model, spec))  # type: ignore[attr-defined]
            doc["config"] = {
                "args": "load_format=dummy dtype=float16, calibrated batch, default cache policy",
                "extra_args": spec["cfg"].get("serve_app_args") or {},
            }
        else:
            factory = (
                plain_image_deployment if m["kind"] == "image" else plain_embeddings_deployment
            )
            dep = factory(cfg["plain_batch"], cfg["batch_wait_timeout_s"])
            options["max_ongoing_requests"] = 2 * cfg["plain_batch"]
            app = dep.options(**options).bind()
            doc["config"] = {
                "max_batch_size": cfg["plain_batch"],
                "batch_wait_timeout_s": cfg["batch_wait_timeout_s"],
                "max_ongoing_requests": 2 * cfg["plain_batch"],
            }
        log(f"{label}: deploying {doc['label']}")
        _deploy(app, name, min(spec["deploy_timeout_s"], max(10.0, spec["deadline"] - time.time())))
        doc["deploy_s"] = round(time.time() - t0, 1)
        url = base_url + m["route"]
        requests = bench.build_requests(
            url, m["kind"], model=m["model_name"], seed=cfg["seed"], batch=per_request
        )
        doc["request_bytes"] = [len(r.content) for r in requests]
        doc["first_answer_s"] = round(_wait_answer(requests[0], 60.0), 2)
        log(f"{label}: serving after {doc['deploy_s']:.1f} s deploy; sweeping")
        t_sweep = time.time()
        points: list[dict[str, Any]] = []
        doc["sweep"] = points
        sweep(
            load,
            requests,
            cfg,
            p99_target_s=job["p99_target_s"],
            deadline=spec["deadline"],
            label=label,
            points=points,
        )
        doc["sweep_s"] = round(time.time() - t_sweep, 1)
        doc["best"] = add_items_rate(
            best_sustained(points, job["p99_target_s"], cfg["max_error_rate"]), per_request
        )
        doc["moderate"] = point_at(points, cfg["moderate_rate"])
        doc["limit_hint"] = limit_hint(points)
        if s["server"] == "serve_app":
            doc["server_memory"] = _server_memory(base_url)
        doc["status"] = "ok" if points else "skipped"
        if not points:
            doc["error"] = "no rate point ran (time budget)"
    except Exception as exc:  # noqa: BLE001 - keep what was measured, record why it stopped
        doc.update(status="error", **_error(exc))
        points = doc.get("sweep") or []
        doc["best"] = add_items_rate(
            best_sustained(points, job["p99_target_s"], cfg["max_error_rate"]), per_request
        )
        doc["moderate"] = point_at(points, cfg["moderate_rate"])
        log(f"{label} FAILED: {doc['error'][:500]}")
    finally:
        t1 = time.time()
        try:
            serve.delete(name)
        except Exception as exc:  # noqa: BLE001 - keep the results; note the failed teardown
            doc["teardown_error"] = repr(exc)
        doc["memory"] = memory_summary(list(memory.log.samples), t0, t1, num_gpus, totals)
        doc["memory"]["notes"] = list(memory.log.notes)
    return doc


def _server_memory(base_url: str) -> list[dict[str, Any]]:
    import httpx

    keep = (
        "replica_id",
        "pid",
        "budget_bytes",
        "cap_bytes",
        "torch_fraction",
        "reserved_bytes",
        "peak_reserved_bytes",
        "non_torch_overhead_bytes",
        "nvml_process_bytes",
        "calibrated_batch_size",
        "calibration_peak_bytes",
        "max_batch_size",
        "largest_batch",
        "batches",
        "batched_items",
        "batch_busy_s",
        "queued_items",
        "warmup_s",
        "cuda_graphs",
        "cuda_graph_pool_bytes",
        "cuda_graph_capture_s",
        "cuda_graph_replays",
        "oom_recoveries",
        "cache_policy",
        "cache_frees",
    )
    try:
        reps = httpx.get(f"{base_url}/v1/memory", timeout=10.0).json().get("replicas", [])
        return [{k: r.get(k) for k in keep} for r in reps if isinstance(r, dict)]
    except Exception as exc:  # noqa: BLE001 - the report is extra, not the measurement
        return [{"error": repr(exc)}]


def run_noop(spec: Mapping[str, Any], load: LoadClient, base_url: str) -> dict[str, Any]:
    from ray import serve

    cfg = spec["cfg"]
    name = "noop"
    t0 = time.time()
    try:
        app = (
            noop_deployment()
            .options(
                num_replicas=1,
                max_ongoing_requests=512,
                ray_actor_options={"num_cpus": spec["replica_cpus"]},
            )
            .bind()
        )
        _deploy(app, name, 120.0)
        req = noop_request(f"{base_url}/noop")
        _wait_answer(req, 60.0)
        s = load.point([req], cfg["noop_rate"], cfg["noop_duration_s"], 1.0, cfg["seed"])
        log(f"noop via Serve ({spec['proxy']} proxy): {describe_point(s)}")
        return {
            "status": "ok",
            "deploy_s": round(time.time() - t0, 1),
            "p50_s": _p(s.get("latency_s"), "p50"),
            "p99_s": _p(s.get("latency_s"), "p99"),
            "summary": s,
        }
    finally:
        try:
            serve.delete(name)
        except Exception:  # noqa: BLE001
            pass


def cluster_worker(spec: dict[str, Any]) -> None:
    """One fresh Ray cluster with one proxy mode; runs spec's jobs and writes the results."""
    result_path = Path(spec["result_path"])
    result: dict[str, Any] = {"proxy": spec["proxy"], "jobs": {}, "errors": []}
    scratch = Path(tempfile.mkdtemp(prefix=f"sbs-{spec['proxy']}-"))
    result["scratch_dir"] = str(scratch)
    _write_json(result_path, result)
    _private_env(spec["proxy"], scratch, spec)
    load = memory = None
    ray_started = False
    try:
        import ray
        from ray import serve

        from load_tests import bench

        t0 = time.time()
        load = LoadClient(
            spec["client_procs"], spec["max_connections"], spec["timeout_s"], spec["max_in_flight"]
        )
        port = free_port()
        ray.init(
            address="local",
            num_cpus=spec["ray_cpus"],
            num_gpus=1,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            namespace="side_by_side",
            log_to_driver=False,
        )
        ray_started = True
        node = ray._private.worker._global_node
        result["session_dir"] = node.get_session_dir_path() if node else None
        _write_json(result_path, result)
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        base_url = f"http://127.0.0.1:{port}"
        result["startup_s"] = round(time.time() - t0, 1)
        log(f"cluster[{spec['proxy']}]: Ray + Serve up in {result['startup_s']} s at {base_url}")
        totals = {g["uuid"]: g["total_bytes"] for g in nvml_devices()}
        memory = bench.MemorySampler(
            None, use_nvml=spec["device"] == "cuda", interval_s=1.0
        ).start()
        for job in spec["jobs"]:
            key = job["key"]
            if time.time() + 25.0 > spec["deadline"]:
                result["jobs"][key] = {"status": "skipped", "error": "time budget reached"}
                log(f"cluster[{spec['proxy']}]: skipping {key}: time budget reached")
                _write_json(result_path, result)
                continue
            try:
                if job["kind"] == "noop":
                    result["jobs"][key] = run_noop(spec, load, base_url)
                else:
                    result["jobs"][key] = run_setup(job, spec, load, base_url, memory, totals)
            except Exception as exc:  # noqa: BLE001 - record, move on to the next setup
                result["jobs"][key] = {"status": "error", **_error(exc)}
                what = f"{type(exc).__name__}: {str(exc)[:500]}"
                log(f"cluster[{spec['proxy']}]: {key} FAILED: {what}")
            _write_json(result_path, result)
    except BaseException as exc:  # noqa: BLE001 - SIGTERM arrives as SystemExit
        result["errors"].append(_error(exc))
        log(f"cluster[{spec['proxy']}] FAILED: {type(exc).__name__}: {str(exc)[:500]}")
    finally:
        if memory is not None:
            memory.stop()
        if load is not None:
            load.close()
        if result.get("session_dir"):
            _save_logs(
                Path(result["session_dir"]), Path(spec["out_dir"]) / f"ray_logs_{spec['proxy']}"
            )
        if ray_started:
            _shutdown_cluster()
        killed = kill_matching(str(scratch), names=("haproxy",))
        if killed:
            result["killed_haproxy_pids"] = killed
        _write_json(result_path, result)


def _shutdown_cluster() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    except Exception as exc:  # noqa: BLE001
        log(f"serve.shutdown failed: {exc!r}")
    try:
        ray.shutdown()
    except Exception as exc:  # noqa: BLE001
        log(f"ray.shutdown failed: {exc!r}")


def _save_logs(session_dir: Path, dest: Path, max_bytes: int = 400_000) -> None:
    """The tails of Serve's logs (controller, proxy, replicas) for a post-mortem."""
    try:
        logs = session_dir / "logs" / "serve"
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted(logs.glob("*.log")):
            data = f.read_bytes()
            if data:
                (dest / f.name).write_bytes(data[-max_bytes // 8 :])
    except Exception as exc:  # noqa: BLE001
        log(f"could not save Ray logs: {exc!r}")


# --------------------------------------------------------------------------- client ceiling


def client_ceiling(
    cfg: Mapping[str, Any], spec: Mapping[str, Any], models: Sequence[str], deadline: float
) -> dict[str, Any]:
    """The client against a bare uvicorn + Starlette no-op server: its highest throughput per
    payload kind, and the p50 of a tiny POST at the no-op rate (the HTTP baseline)."""
    from load_tests import bench

    doc: dict[str, Any] = {
        "client_procs": spec["client_procs"],
        "max_connections_per_proc": spec["max_connections"],
        "server_workers": cfg["noop_server_workers"],
    }
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "load_tests.side_by_side",
            "--_worker",
            "noop-server",
            "--_port",
            str(port),
            "--_workers",
            str(cfg["noop_server_workers"]),
        ],
        cwd=str(ROOT),
        start_new_session=True,
    )
    load = None
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_answer(noop_request(f"{base}/noop"), 60.0)
        load = LoadClient(
            spec["client_procs"], spec["max_connections"], spec["timeout_s"], spec["max_in_flight"]
        )
        s = load.point(
            [noop_request(f"{base}/noop")],
            cfg["noop_rate"],
            cfg["noop_duration_s"],
            1.0,
            cfg["seed"],
        )
        doc["bare_uvicorn_noop"] = {
            "p50_s": _p(s["latency_s"], "p50"),
            "p99_s": _p(s["latency_s"], "p99"),
            "summary": s,
        }
        log(f"client: bare uvicorn no-op: {describe_point(s)}")
        ceil_cfg = dict(
            cfg,
            duration_s=cfg["client_duration_s"],
            warmup_s=0.5,
            refine=0,
            pause_after_fail_s=1.0,
            max_rate=cfg["client_max_rate"],
            rate_factor=cfg["client_rate_factor"],
        )
        for kind in sorted({MODELS[m]["kind"] for m in models}):
            requests = bench.build_requests(f"{base}/noop", kind, seed=cfg["seed"])
            points = sweep(
                load,
                requests,
                ceil_cfg,
                p99_target_s=cfg["client_p99_s"],
                deadline=deadline,
                label=f"client/{kind}",
                start=cfg["client_start_rate"],
            )
            doc[kind] = {
                "sweep": points,
                "max_throughput_per_s": max((p["throughput_per_s"] for p in points), default=None),
                "best_sustained": best_sustained(
                    points, cfg["client_p99_s"], cfg["max_error_rate"]
                ),
                "p99_target_s": cfg["client_p99_s"],
            }
        doc["status"] = "ok"
    finally:
        if load is not None:
            load.close()
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=10)
        except Exception:  # noqa: BLE001
            server.kill()
    return doc


def in_process_noop(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """p50 of a direct await of a no-op handler, and of the Starlette no-op app called
    in-process through httpx's ASGI transport with the bench's run_rate."""
    import httpx

    from load_tests import bench

    async def handler() -> dict[str, bool]:
        return {"ok": True}

    async def direct() -> list[float]:
        out = []
        for _ in range(20000):
            t = time.perf_counter()
            await handler()
            out.append(time.perf_counter() - t)
        return out

    calls = asyncio.run(direct())
    app = create_noop_app()

    async def asgi() -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
            req = noop_request("http://in-process/noop")
            return await bench.run_rate(
                [req], cfg["noop_rate"], cfg["noop_duration_s"], warmup_s=0.5, client=client
            )

    res = asyncio.run(asgi())
    return {
        "direct_call_p50_s": bench.percentile(calls, 50),
        "asgi_in_process_p50_s": _p(res.summary.latency_s, "p50"),
        "asgi_in_process_p99_s": _p(res.summary.latency_s, "p99"),
    }


# --------------------------------------------------------------------------- orchestration


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


def _stop_worker(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM the worker's process group (it shuts its Ray cluster down), SIGKILL after 45 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=45)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()
    except ProcessLookupError:
        return proc.wait()


def _run_worker(mode: str, spec: dict[str, Any], timeout_s: float, out_dir: Path) -> dict[str, Any]:
    """Run a worker subprocess on `spec`; on timeout, SIGTERM (it tears its cluster down), then
    SIGKILL, then kill what its Ray session left. Returns its result file's contents."""
    fd, spec_path = tempfile.mkstemp(prefix=f"sbs-{mode}-", suffix=".json", dir=out_dir)
    os.close(fd)
    result_path = Path(spec_path).with_suffix(".result.json")
    spec = dict(spec, result_path=str(result_path), out_dir=str(out_dir))
    Path(spec_path).write_text(json.dumps(spec))
    proc = subprocess.Popen(
        [sys.executable, "-m", "load_tests.side_by_side", "--_worker", mode, "--_spec", spec_path],
        cwd=str(ROOT),
        start_new_session=True,
    )
    try:
        rc = proc.wait(timeout=max(5.0, timeout_s))
    except subprocess.TimeoutExpired:
        log(f"worker {mode} over its {timeout_s:.0f} s: stopping it")
        rc = _stop_worker(proc)
    except BaseException:  # Ctrl-C or SIGTERM here: the worker tears its cluster down first
        _stop_worker(proc)
        raise
    result: dict[str, Any] = {}
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError) as exc:
        result = {"errors": [{"error": f"no result from worker {mode}: {exc!r}"}]}
    if rc != 0:
        result.setdefault("errors", []).append({"error": f"worker {mode} exited with {rc}"})
        for marker in (result.get("session_dir"), result.get("scratch_dir")):
            if marker:
                pids = kill_matching(marker)
                if pids:
                    log(f"killed {len(pids)} processes left by worker {mode}")
    for p in (Path(spec_path), result_path):
        p.unlink(missing_ok=True)
    return result


def _cluster_jobs(
    proxy_jobs: Sequence[str], models: Sequence[str], cfg: Mapping[str, Any], noop: bool
) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = [{"key": "noop", "kind": "noop"}] if noop else []
    for key in proxy_jobs:
        for model in models:
            jobs.append(
                {
                    "key": f"{model}/{key}",
                    "kind": "setup",
                    "setup": key,
                    "model": model,
                    "p99_target_s": cfg["p99_target_s"][model],
                }
            )
    return jobs


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


def _worker_main(a: argparse.Namespace) -> int:
    if a._worker == "noop-server":
        import uvicorn

        uvicorn.run(
            "load_tests.side_by_side:create_noop_app",
            factory=True,
            host="127.0.0.1",
            port=a._port,
            workers=a._workers,
            log_level="warning",
            access_log=False,
        )
        return 0

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    spec = json.loads(Path(a._spec).read_text())
    global _T0
    _T0 = spec.get("t0_unix", _T0)
    if a._worker == "ceiling":
        if spec["device"] == "cuda":
            os.environ["CUDA_VISIBLE_DEVICES"] = str(spec["gpu"])
        result: dict[str, Any] = {}
        try:
            result = {"models": ceiling_worker(spec)}
        except BaseException as exc:  # noqa: BLE001
            result = {"errors": [_error(exc)]}
        _write_json(Path(spec["result_path"]), result)
        return 0
    cluster_worker(spec)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a._worker:
        return _worker_main(a)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    only = {x.strip() for x in a.only.split(",") if x.strip()}
    bad = [m for m in models if m not in MODELS] + [x for x in only if x not in PHASES]
    if bad or not models:
        parser.error(f"unknown model or phase {bad}; models: {sorted(MODELS)}, phases: {PHASES}")
    if a.haproxy_plain:
        only.add("haproxy_plain")
    if a.replicas is None:
        a.replicas = 2 if a.device == "cpu" else 4
    if a.replicas < 1 or a.plain_batch < 1 or a.client_procs is not None and a.client_procs < 1:
        parser.error("--replicas, --plain-batch and --client-procs must be >= 1")
    out = a.out or Path(os.environ.get(RESULTS_ENV) or DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    cfg = _config(a)
    cpu = a.device == "cpu"

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)  # so a running worker is stopped, not orphaned
    t_start = time.time()
    deadline = t_start + cfg["max_time_s"]
    spec_base: dict[str, Any] = {
        "device": a.device,
        "gpu": a.gpu,
        "replicas": a.replicas,
        "client_procs": a.client_procs or (1 if cpu else 4),
        "max_connections": a.max_connections,
        "max_in_flight": a.max_in_flight,
        "timeout_s": a.request_timeout_s,
        "replica_cpus": 0.5 if cpu else 1.0,
        "ray_cpus": 8 if cpu else None,
        "deploy_timeout_s": 240.0 if cpu else 150.0,
        "cfg": cfg,
        "t0_unix": _T0,
    }
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "created_unix_s": t_start,
        "command": " ".join(
            [
                Path(sys.executable).name,
                "-m",
                "load_tests.side_by_side",
                *(argv if argv is not None else sys.argv[1:]),
            ]
        ),
        "config": {
            **cfg,
            **{k: v for k, v in spec_base.items() if k not in ("cfg", "t0_unix")},
            "models": models,
            "only": sorted(only),
        },
        "machine": machine_info(),
        "client": {},
        "noop": {},
        "models": {
            name: {
                "kind": MODELS[name]["kind"],
                "items": MODELS[name]["items"],
                "p99_target_s": cfg["p99_target_s"][name],
                "moderate_rate_per_s": cfg["moderate_rate"],
                "inputs_per_request": cfg["inputs_per_request"],
                "ceiling": {},
                "setups": {},
                "ratios": {},
            }
            for name in models
        },
        "errors": [],
        "timings": {},
    }
    json_path = out / "side_by_side.json"
    previous = None
    if a.merge and json_path.is_file():
        try:
            previous = json.loads(json_path.read_text())
        except ValueError as exc:
            parser.error(f"--merge: {json_path} is not valid JSON: {exc}")

    def save() -> None:
        doc["timings"]["total_s"] = round(time.time() - t_start, 1)
        _write_json(json_path, doc)

    m = doc["machine"]
    log(
        f"machine: {m['gpu_name']} driver {m['driver_version']}, torch {m['torch_version']}, "
        f"ray {m['ray_version']}, {m['cpu_count']} CPUs; budget {cfg['max_time_s']:.0f} s; "
        f"out {out}"
    )
    if not cpu and not m["gpus"]:
        log(
            "WARNING: --device cuda but NVML sees no GPU; the GPU setups will fail "
            "(for a dry run use --device cpu)"
        )
    save()

    # 1. the in-process ceiling
    if "ceiling" in only:
        t = time.time()
        log("phase ceiling: the model alone, in one process")
        spec = dict(
            spec_base,
            models=models,
            batches=[64, 8] if not cpu else [8, 2],
            min_s=0.5 if (cpu or a.quick) else 1.0,
            cpu_min_s=0.5,
        )
        res = _run_worker("ceiling", spec, min(180.0, deadline - time.time()), out)
        for name, c in (res.get("models") or {}).items():
            doc["models"][name]["ceiling"] = c
        doc["errors"].extend({"phase": "ceiling", **e} for e in res.get("errors", []))
        doc["timings"]["ceiling_s"] = round(time.time() - t, 1)
        save()

    # 2. the client's own ceiling and the HTTP baseline
    if "client" in only or "noop" in only:
        t = time.time()
        log("phase client: the same client against a bare uvicorn + Starlette no-op server")
        try:
            doc["client"] = client_ceiling(
                cfg, spec_base, models, min(deadline, time.time() + 60.0)
            )
        except Exception as exc:  # noqa: BLE001
            doc["client"] = {"status": "error", **_error(exc)}
            log(f"client ceiling FAILED: {exc!r}")
        try:
            doc["noop"]["in_process"] = in_process_noop(cfg)
        except Exception as exc:  # noqa: BLE001
            doc["noop"]["in_process"] = {"status": "error", **_error(exc)}
        doc["timings"]["client_s"] = round(time.time() - t, 1)
        save()

    # 3-5. the served setups, one fresh cluster per proxy mode; serve_app first
    clusters = plan_clusters(only)
    for i, (tag, proxy, keys, noop) in enumerate(clusters):
        t = time.time()
        left = deadline - t
        jobs = _cluster_jobs(keys, models, cfg, noop)
        if left < (60.0 if tag == "haproxy_plain" else 30.0):
            log(f"skipping cluster[{tag}]: {left:.0f} s left of the budget")
            for job in jobs:
                skipped = {"status": "skipped", "error": "time budget"}
                if job["kind"] == "noop":
                    doc["noop"][f"serve_{proxy}"] = skipped
                else:
                    doc["models"][job["model"]]["setups"][job["setup"]] = skipped
            continue
        # haproxy_plain is the optional extra: it gets what the others leave, never a share.
        weights = [
            cluster_weight(k, n, len(models))
            for tg, _, k, n in clusters[i:]
            if tg != "haproxy_plain" or tg == tag
        ]
        cluster_deadline = t + max(30.0, left * weights[0] / sum(weights))
        log(
            f"phase cluster[{tag}]: {proxy} proxy, jobs {[j['key'] for j in jobs]}, "
            f"{cluster_deadline - t:.0f} s"
        )
        spec = dict(spec_base, proxy=proxy, jobs=jobs, deadline=cluster_deadline)
        res = _run_worker("cluster", spec, cluster_deadline - time.time() + 60.0, out)
        for job in jobs:
            got = (res.get("jobs") or {}).get(job["key"]) or {
                "status": "error",
                "error": "no result (the cluster failed to start or the worker died)",
            }
            if job["kind"] == "noop":
                doc["noop"][f"serve_{proxy}"] = got
            else:
                got.setdefault("label", setup_label(job["setup"], a.replicas))
                doc["models"][job["model"]]["setups"][job["setup"]] = got
        doc["errors"].extend({"phase": f"cluster[{tag}]", **e} for e in res.get("errors", []))
        doc["timings"][f"cluster_{tag}_s"] = round(time.time() - t, 1)
        doc["timings"][f"cluster_{tag}_startup_s"] = res.get("startup_s")
        save()

    if previous is not None:
        taken = merge_previous(doc, previous)
        doc["merged_from_previous"] = taken
        log(f"merged from the previous {json_path.name}: {', '.join(taken) or 'nothing'}")
    finalize(doc)
    save()
    log(f"wrote {json_path}")
    from load_tests.render_benchmarks import plot_all, render_markdown

    try:
        print(render_markdown(doc), flush=True)
    except Exception as exc:  # noqa: BLE001 - the JSON is written; the table can be redone
        log(f"markdown table failed: {exc!r} (python -m load_tests.render_benchmarks {json_path})")
    try:
        written = plot_all(doc, out)
        log("wrote " + ", ".join(str(p) for p in written))
    except Exception as exc:  # noqa: BLE001 - matplotlib may be missing on the GPU host
        log(
            f"plots failed: {exc!r}; redraw elsewhere: python -m load_tests.render_benchmarks "
            f"{json_path} --plots {out}"
        )
    log(f"done in {time.time() - t_start:.0f} s")
    return 0


def finalize(doc: dict[str, Any]) -> None:
    """Ratios per model and the no-op verdict, from what was measured."""
    for model_doc in doc["models"].values():
        model_doc["ratios"] = compute_ratios(model_doc)
        ceiling = (model_doc.get("ceiling") or {}).get("items_per_s_max")
        for key, s in model_doc["setups"].items():
            s["vs_ceiling"] = ratio(_best_of(model_doc["setups"], key), ceiling)
    noop = doc["noop"]
    bare = ((doc.get("client") or {}).get("bare_uvicorn_noop") or {}).get("p50_s")
    direct = (noop.get("in_process") or {}).get("asgi_in_process_p50_s")
    for proxy in ("haproxy", "default"):
        served = (noop.get(f"serve_{proxy}") or {}).get("p50_s")
        noop[f"verdict_{proxy}_vs_bare_uvicorn"] = noop_verdict(served, bare)
        noop[f"verdict_{proxy}_vs_in_process_asgi"] = noop_verdict(served, direct)


if __name__ == "__main__":
    # Run through the package name, so that what Ray and the client pool pickle refers to
    # load_tests.side_by_side (importable in their processes), not to __main__.
    from load_tests import side_by_side

    sys.exit(side_by_side.main())
