"""The start-up bench's data, as pure functions (no Ray, no HTTP): its configs, its rows, the
policy's decisions read from log lines, and the summary against issue #11's targets.
The package docstring says what each measure's clock starts and stops on.
"""

from __future__ import annotations

import copy
import re
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from load_tests.benchmarks.startup.timeline import log_time_s

GIB = 1 << 30
# Issue #11's targets: measure -> (limit, the statistic that must be within it).
TARGETS: dict[str, tuple[float, str]] = {
    "decision_to_serving_s": (5.0, "median"),
    "cold_ready_s": (15.0, "median"),
    "replacement_s": (10.0, "median"),
    "graph_pool_bytes": (int(0.3 * GIB), "max"),  # per replica: every one within it
}
INFORMATIONAL = ("all_serving_s", "cli_ready_s", "replacement_up_s")
MIN_SAMPLES = 5
REPORT_FIELDS = (
    "replica_id",
    "gpu_mode",
    "startup_phases_s",
    "model",  # the backend's own figures (the embeddings backend: weights_phases_s, encoder)
    "first_request_s",
    "first_request_since_imports_s",
    "imports_started_at_s",
    "calibration_source",
    "cuda_graphs",
    "cuda_graphs_at_start",
    "cuda_graphs_pending",
    "cuda_graph_pool_bytes",
    "warmup_s",
    "warmup_pending",
    "preloaded_worker",
    "worker_waited_s",
    "warm_workers",
)
# The policy's cooldowns and the load figure's window cut short, so that a ramp's decisions
# come as fast as its replicas start and the ramp down soon after its load stops.
COOLDOWNS_S = {"upscale_cooldown_s": 1, "downscale_cooldown_s": 3, "shed_cooldown_s": 1}
LOOK_BACK_PERIOD_S = 2
DECISION_LOG_TEXT = "serve_app autoscale "  # autoscale.HeadroomPolicy's line on every change
_DECISION_LINE = re.compile(DECISION_LOG_TEXT + r"(\S+): (\d+) -> (\d+) \((\w+)\)")

Decision = tuple[float, int, int, str]  # (epoch seconds, replicas before, after, reason)


# ---- configs -------------------------------------------------------------------------------


def cold_config(
    base: dict[str, Any], device: str, replicas: int, cache_dir: Path
) -> dict[str, Any]:
    """The cold part's deploy config: ``base`` (configs/gpu-shared.yaml on a GPU, cpu.yaml on a
    CPU) with ``replicas`` replicas, the run's calibration cache, dummy weights on a GPU (the
    host has none) and half a CPU per replica on a CPU."""
    doc = copy.deepcopy(base)
    app = doc["applications"][0]
    dep = app["deployments"][0]
    dep["num_replicas"] = replicas
    args = app.setdefault("args", {})
    args["memory"] = {**(args.get("memory") or {}), "calibration_cache_dir": str(cache_dir)}
    if device == "cuda":
        args["load_format"] = "dummy"
    else:
        dep.setdefault("ray_actor_options", {})["num_cpus"] = 0.5
    doc["http_options"] = {**(doc.get("http_options") or {}), "host": "127.0.0.1"}
    return doc


def autoscaling_config(controller_doc: dict[str, Any], max_replicas: int) -> dict[str, Any]:
    """configs/controller.yaml's autoscaling_config (HeadroomPolicy) from 1 to ``max_replicas``
    replicas, with COOLDOWNS_S and LOOK_BACK_PERIOD_S."""
    dep = controller_doc["applications"][0]["deployments"][0]
    config = copy.deepcopy(dep["autoscaling_config"])
    config.update(min_replicas=1, max_replicas=max_replicas, look_back_period_s=LOOK_BACK_PERIOD_S)
    config["policy"]["policy_kwargs"].update(COOLDOWNS_S)
    return config


# ---- rows ----------------------------------------------------------------------------------


def make_row(setup: str, repeat: int, reports: Iterable[dict[str, Any]], **measures: Any) -> dict:
    """One row: ``setup``, ``repeat``, the measures (a None ``note`` left out), the largest
    graph pool of the measured replicas, and each one's report fields."""
    replicas = [{k: r.get(k) for k in REPORT_FIELDS} for r in reports]
    pools = [r["cuda_graph_pool_bytes"] for r in replicas if r["cuda_graph_pool_bytes"] is not None]
    row: dict[str, Any] = {"setup": setup, "repeat": repeat}
    row.update({k: v for k, v in measures.items() if not (k == "note" and v is None)})
    row["graph_pool_bytes"] = max(pools) if pools else None
    row["replicas"] = replicas
    return row


def count_rows(rows: Iterable[dict[str, Any]], setup: str) -> int:
    return sum(1 for r in rows if r["setup"] == setup)


Result = tuple[
    float, float, Any, str, str
]  # harness.load.Load: (sent, took, status, type, replica)


def first_answers(results: Iterable[Result], known: set[str]) -> list[tuple[float, str]]:
    """(end time, replica id) of the first 200 answered by each replica not in ``known``, in
    the order of their end times (the clock of the results: sent + took)."""
    first: dict[str, float] = {}
    for sent, took, status, _, rid in results:
        if status == 200 and rid and rid not in known:
            first[rid] = min(first.get(rid, sent + took), sent + took)
    return sorted((t, rid) for rid, t in first.items())


def parse_decisions(lines: Iterable[str], deployment: str, since_s: float) -> list[Decision]:
    """The scale-ups of ``deployment`` (``app/deployment``) in the policy's log lines, at or
    after ``since_s`` (epoch seconds; log times are local time to the millisecond), in order."""
    ups = []
    for line in lines:
        m = _DECISION_LINE.search(line)
        at_s = log_time_s(line)
        if m is None or at_s is None or m.group(1) != deployment:
            continue
        before, after = int(m.group(2)), int(m.group(3))
        if after > before and at_s >= since_s:
            ups.append((at_s, before, after, m.group(4)))
    return sorted(ups)


def expand_ups(ups: Iterable[Decision]) -> list[tuple[float, int, int]]:
    """One (decision time, before, after) per replica each scale-up added (1 -> 3 gives two)."""
    return [(at_s, before, after) for at_s, before, after, _ in ups for _ in range(after - before)]


# ---- summary -------------------------------------------------------------------------------


def stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {
        "n": len(values),
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def graph_pools(rows: Iterable[dict[str, Any]]) -> list[float]:
    """Every measured replica's graph pool bytes, once per replica."""
    pools = {
        rep["replica_id"]: rep["cuda_graph_pool_bytes"]
        for row in rows
        for rep in row["replicas"]
        if rep.get("cuda_graph_pool_bytes") is not None
    }
    return list(pools.values())


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per target: n, median, min, max, the target, ``met`` (the statistic ``met_by`` within
    the target; None without samples), ``enough_samples`` and ``missing`` (rows whose clock
    never stopped); then the informational clocks and every start-up phase's median."""
    out: dict[str, Any] = {}
    for name, (limit, by) in TARGETS.items():
        if name == "graph_pool_bytes":
            values, missing = graph_pools(rows), 0
        else:
            values = [r[name] for r in rows if r.get(name) is not None]
            missing = sum(1 for r in rows if name in r and r[name] is None)
        s = stats(values)
        s.update(
            target=limit,
            met_by=by,
            met=None if not values else s[by] <= limit,
            enough_samples=len(values) >= MIN_SAMPLES,
            missing=missing,
        )
        out[name] = s
    out["informational"] = {
        name: stats([r[name] for r in rows if r.get(name) is not None]) for name in INFORMATIONAL
    }
    phases: dict[str, list[float]] = {}
    for row in rows:
        for rep in row["replicas"]:
            for phase, seconds in (rep.get("startup_phases_s") or {}).items():
                phases.setdefault(phase, []).append(seconds)
            if rep.get("first_request_s") is not None:
                phases.setdefault("first_request", []).append(rep["first_request_s"])
    out["phases_median_s"] = {p: stats(v)["median"] for p, v in phases.items()}
    return out
