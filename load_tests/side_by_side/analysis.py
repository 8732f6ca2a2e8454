"""Pure functions over measured points: pass/fail, the sweep's next rate, best sustained,
ratios, memory summaries, the cluster plan and merging a previous run."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from load_tests.side_by_side.constants import NOOP_LIMIT_S, SETUPS


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
    return _figures(max(passing, key=lambda s: float(s["throughput_per_s"])))


def point_at(summaries: Iterable[Mapping[str, Any]], rate: float) -> dict[str, Any] | None:
    """p50/p99/throughput of the point offered at `rate` (within 1%; the last one, i.e. the
    re-run of a failed point), or None."""
    for s in reversed(list(summaries)):
        if abs(float(s["offered_rate_per_s"]) - rate) <= 0.01 * rate:
            return _figures(s)
    return None


def _figures(s: Mapping[str, Any]) -> dict[str, Any]:
    """A point's rates, p50/p99 and error rate."""
    return {
        "offered_rate_per_s": float(s["offered_rate_per_s"]),
        "throughput_per_s": float(s["throughput_per_s"]),
        "p50_s": _p(s.get("latency_s"), "p50"),
        "p99_s": _p(s.get("latency_s"), "p99"),
        "error_rate": float(s.get("error_rate", 0.0)),
    }


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


def best_of(setups: Mapping[str, Any], key: str) -> float | None:
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
            out[f"{key}_vs_ceiling"] = ratio(best_of(setups, key), ceiling)
    app = best_of(setups, "serve_app")
    for base in ("plain_shared", "plain_1", "plain_shared_haproxy", "plain_1_haproxy"):
        if base in setups:
            out[f"serve_app_vs_{base}"] = ratio(app, best_of(setups, base))
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
