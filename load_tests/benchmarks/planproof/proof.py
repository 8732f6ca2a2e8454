"""Pure parts of the planner's proof: the config the CPU dry run plans, the naive config the plan
is compared with, goodput, one model's row, and the verdict of issue 27.

The naive config (docs/planning.md, "The proof"): the plan's applications, with their planned
batch caps, and the plan's total GPU share split equally among all replicas of all models, or,
where that equal share is below the largest planned budget, that budget's share for every
replica (else its replicas could not start). Every model gets the same replica count: the most
for which the replicas' ``num_cpus`` fit the cores the plan may use (its ``cores_cap``) and the
equal shares hold no more than the plan's total (one replica each may hold more) and fit the
GPU. Its replicas state no ``memory.budget``: the budget is the share's bytes, as in a
hand-written config of fractions.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from serve_app.config.args import IMPORT_PATH

UNITS = 10_000  # Ray's unit of a GPU share (serve_app.plan.solver.UNITS)
THROUGHPUT_TOLERANCE = 0.15  # issue 27: measured throughput within 15% of the prediction
GOODPUT_RATIO_MIN = 1.3  # issue 27: the plan carries at least 1.3x the naive goodput


def keep_applications(
    doc: Mapping[str, Any], names: Sequence[str]
) -> tuple[dict[str, Any], list[str]]:
    """``doc`` with only the serve_app applications named in ``names`` (the CPU dry run plans
    the ones its measurements file measures); the notes name those left out."""
    out = copy.deepcopy(dict(doc))
    kept, notes = [], []
    for app in out.get("applications") or []:
        if app.get("import_path") == IMPORT_PATH and app.get("name") not in names:
            notes.append(f"{app.get('name')}: not in the measurements file; left out")
            continue
        kept.append(app)
    out["applications"] = kept
    return out, notes


def naive_counts(plan: Mapping[str, Any], num_cpus: Mapping[str, float]) -> tuple[int, int]:
    """(replicas of each model, share units of each replica) of the naive config for ``plan``
    (plan.json's document); ``num_cpus``: each application's, as the plan gives it. ValueError
    when not even one replica each fits."""
    gpus, models = plan["gpus"], plan["models"]
    if len(gpus) != 1:
        raise ValueError(f"the proof compares plans on one GPU; this plan has {len(gpus)}")
    total_units = sum(round(m["num_gpus"] * UNITS) * sum(m["replicas_per_gpu"]) for m in models)
    need_units = max(round(m["num_gpus"] * UNITS) for m in models)
    cores_each = sum(float(num_cpus[m["application"]]) for m in models)
    cores_cap = float(gpus[0]["cores_cap"])
    units_cap = int(gpus[0]["share_units_cap"])
    n = len(models)
    best = 0
    for r in range(1, 257):
        # At most the plan's total share, save one replica each at the largest budget.
        held = r * n * max(total_units // (r * n), need_units)
        too_many_cores = r * cores_each > cores_cap + 1e-9
        if too_many_cores or held > max(total_units, n * need_units) or held > units_cap:
            break
        best = r
    if best == 0:
        raise ValueError(
            f"no naive config: one replica of each of the {n} models needs {cores_each:g} cores "
            f"(the plan may use {cores_cap:g}) and {need_units} share units each (the GPU has "
            f"{units_cap})"
        )
    return best, max(total_units // (best * n), need_units)


def naive_config(
    planned: Mapping[str, Any], plan: Mapping[str, Any], num_cpus: Mapping[str, float]
) -> tuple[dict[str, Any], list[str]]:
    """The naive config (see the module docstring) from the plan's serve config ``planned``
    and its plan.json ``plan``; the notes say what it is."""
    replicas, units = naive_counts(plan, num_cpus)
    names = {m["application"] for m in plan["models"]}
    out = copy.deepcopy(dict(planned))
    for app in out.get("applications") or []:
        if app.get("import_path") != IMPORT_PATH or app.get("name") not in names:
            continue
        dep = app["deployments"][0]
        dep["num_replicas"] = replicas
        dep.setdefault("ray_actor_options", {})["num_gpus"] = units / UNITS
        memory = (app.get("args") or {}).get("memory")
        if isinstance(memory, dict):
            memory.pop("budget", None)
    total = sum(round(m["num_gpus"] * UNITS) * sum(m["replicas_per_gpu"]) for m in plan["models"])
    notes = [
        f"naive: {replicas} replica(s) of each of the {len(names)} models, num_gpus "
        f"{units / UNITS:g} each ({units * replicas * len(names)} of the plan's {total} share "
        "units), the plan's batch caps, no memory.budget (the share's bytes)"
    ]
    return out, notes


def goodput_per_s(
    arrays: Sequence[np.ndarray],
    target_s: float,
    warmup_s: float,
    duration_s: float,
    forgive_lag: bool = False,
) -> float:
    """Answers within ``target_s`` a second: requests scheduled in the measured window
    [warmup_s, warmup_s + duration_s) answered 2xx within the target, over ``duration_s``.
    ``arrays``: the open-loop workers' records (scheduled s, latency s, send lag s, status).
    ``forgive_lag``: latency counted from the send, not the schedule: the most a config could
    have made of a client that sent late (an upper bound on its goodput)."""
    if duration_s <= 0 or not arrays:
        return 0.0
    rec = np.concatenate([np.asarray(a, dtype=np.float64) for a in arrays], axis=1)
    times, latency, status = rec[0], rec[1], rec[3]
    if forgive_lag:
        latency = latency - np.nan_to_num(rec[2], nan=0.0)
    measured = (times >= warmup_s) & (times < warmup_s + duration_s)
    ok = (status >= 200) & (status < 300)
    within = np.nan_to_num(latency, nan=np.inf) <= target_s
    return float((measured & ok & within).sum()) / duration_s


def tail_by_second(
    arrays: Sequence[np.ndarray], target_s: float, warmup_s: float, duration_s: float
) -> dict[str, list[Any]]:
    """Whether a p99 miss is a burst or spread: for each second of the measured window (by
    scheduled time), the p99 in ms of the requests answered 2xx (None for a second without
    one), how many of those missed ``target_s``, and how many failed or got no answer."""
    seconds = max(0, math.ceil(duration_s))
    out: dict[str, list[Any]] = {
        "p99_ms": [None] * seconds,
        "over_target": [0] * seconds,
        "errors": [0] * seconds,
    }
    if not arrays or not seconds:
        return out
    rec = np.concatenate([np.asarray(a, dtype=np.float64) for a in arrays], axis=1)
    times, latency, status = rec[0], rec[1], rec[3]
    ok = (status >= 200) & (status < 300) & np.isfinite(latency)
    index = np.floor(times - warmup_s).astype(np.int64)
    for k in range(seconds):
        here = index == k
        answered = latency[here & ok]
        out["errors"][k] = int((here & ~ok).sum())
        if answered.size:
            out["p99_ms"][k] = round(float(np.quantile(answered, 0.99, method="higher")) * 1e3, 1)
            out["over_target"][k] = int((answered > target_s).sum())
    return out


def model_row(
    application: str,
    route: str,
    predicted_rps: float,
    target_s: float,
    summary: Mapping[str, Any] | None,
    goodput_rps: float | None,
    goodput_lag_forgiven_rps: float | None = None,
) -> dict[str, Any]:
    """One model's figures in one config: offered and answered req/s against the plan's
    prediction, p50/p99 against its target, errors, goodput, whether the client kept up."""
    s = dict(summary or {})
    answered = s.get("requests_per_s")
    p99 = s.get("p99_ms")
    ratio = answered / predicted_rps if answered is not None and predicted_rps > 0 else None
    return {
        "application": application,
        "route": route,
        "predicted_rps": predicted_rps,
        "offered_rps": s.get("offered_per_s"),
        "answered_rps": answered,
        "answered_over_predicted": round(ratio, 4) if ratio is not None else None,
        "throughput_ok": ratio is not None and abs(ratio - 1.0) <= THROUGHPUT_TOLERANCE,
        "p50_ms": s.get("p50_ms"),
        "p99_ms": p99,
        "p99_target_ms": target_s * 1e3,
        "p99_ok": p99 is not None and p99 <= target_s * 1e3,
        "requests": s.get("requests"),
        "errors": s.get("errors"),
        "error_counts": s.get("error_counts"),
        "goodput_rps": goodput_rps,
        # Latency from the send: what the goodput could have been had the client sent on time.
        "goodput_lag_forgiven_rps": goodput_lag_forgiven_rps,
        "client_keeps_up": bool(s.get("client_keeps_up")),
        "send_lag_p99_ms": s.get("send_lag_p99_ms"),
        "client_cpu_frac_max": s.get("client_cpu_frac_max"),
        "error": s.get("error"),
    }


def _watch_ok(watch: Mapping[str, Any] | None, on_gpu: bool) -> bool:
    w = watch or {}
    judged = int(w.get("nvml_samples_judged") or 0)
    return w.get("budget_violations") == 0 and (judged > 0 or not on_gpu)


def _late_gain(row: Mapping[str, Any]) -> float:
    """How much more goodput a row's late client may have cost it (infinite when unknown)."""
    forgiven = row.get("goodput_lag_forgiven_rps")
    if forgiven is None:
        return math.inf
    return max(0.0, float(forgiven) - float(row.get("goodput_rps") or 0.0))


def verdict(
    plan_rows: Sequence[Mapping[str, Any]],
    naive_rows: Sequence[Mapping[str, Any]],
    plan_watch: Mapping[str, Any] | None,
    naive_watch: Mapping[str, Any] | None,
    on_gpu: bool,
) -> dict[str, Any]:
    """Issue 27's criteria: each planned model's answered req/s within 15% of its prediction
    and its p99 within its target; 0 budget violations in either config (on a GPU, a watch that
    judged no NVML sample fails); the plan's goodput at least 1.3x the naive config's. A
    client that fell behind (``client_keeps_up``) in a plan row makes the run prove nothing:
    it fails too. In a naive row it fails only if it could have changed the goodput verdict:
    the ratio is judged again with that row's latency counted from the send (the naive
    config's best case), and must still hold."""
    plan_goodput = sum(float(r.get("goodput_rps") or 0.0) for r in plan_rows)
    naive_goodput = sum(float(r.get("goodput_rps") or 0.0) for r in naive_rows)
    ratio = plan_goodput / naive_goodput if naive_goodput > 0 else None
    lagged = [r for r in naive_rows if not r["client_keeps_up"]]
    naive_best = naive_goodput + sum(_late_gain(r) for r in lagged)
    ratio_best = plan_goodput / naive_best if naive_best > 0 else None
    lag_harmless = not lagged or (ratio_best is not None and ratio_best >= GOODPUT_RATIO_MIN)
    out = {
        "throughput_tolerance": THROUGHPUT_TOLERANCE,
        "throughput_ok": bool(plan_rows) and all(r["throughput_ok"] for r in plan_rows),
        "p99_ok": bool(plan_rows) and all(r["p99_ok"] for r in plan_rows),
        "budget_violations": {
            "plan": (plan_watch or {}).get("budget_violations"),
            "naive": (naive_watch or {}).get("budget_violations"),
        },
        "nvml_samples_judged": {
            "plan": (plan_watch or {}).get("nvml_samples_judged"),
            "naive": (naive_watch or {}).get("nvml_samples_judged"),
        },
        "budget_ok": _watch_ok(plan_watch, on_gpu) and _watch_ok(naive_watch, on_gpu),
        "goodput_rps": {"plan": plan_goodput, "naive": naive_goodput},
        "goodput_ratio": round(ratio, 4) if ratio is not None else None,
        "goodput_ratio_min": GOODPUT_RATIO_MIN,
        "goodput_ok": (ratio is not None and ratio >= GOODPUT_RATIO_MIN)
        or (ratio is None and plan_goodput > 0 and bool(naive_rows)),
        "naive_clients_late": [r["application"] for r in lagged],
        "goodput_ratio_late_forgiven": round(ratio_best, 4) if ratio_best is not None else None,
        "client_ok": bool(plan_rows)
        and bool(naive_rows)
        and all(r["client_keeps_up"] for r in plan_rows)
        and lag_harmless,
    }
    keys = ("throughput_ok", "p99_ok", "budget_ok", "goodput_ok", "client_ok")
    out["failed"] = [k for k in keys if not out[k]]
    out["all_ok"] = not out["failed"]
    return out


STAGES = ("request", "decode", "queue", "inference", "encode")  # docs/metrics.md


def stage_times(before: str, after: str, apps: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per application, each stage's mean and p99 (interpolated within its bucket) between two
    scrapes of Ray's metrics (``ray_serve_app_<stage>_seconds``, summed over replicas), and
    the count each is of; a stage with no new observations is left out. ``inference`` is per
    batch, the others per request."""
    from serve_app.plan.scrape import _p99, _summed, parse

    b, a = parse(before), parse(after)

    def summed(samples: Sequence[Any], name: str, app: str) -> dict[str, float]:
        return _summed(samples, name, app, key="le")  # "" for the unlabelled _count and _sum

    result: dict[str, dict[str, Any]] = {}
    for app in apps:
        stages: dict[str, Any] = {}
        for stage in STAGES:
            base = f"ray_serve_app_{stage}_seconds"
            count = summed(a, base + "_count", app).get("", 0.0) - summed(
                b, base + "_count", app
            ).get("", 0.0)
            if count <= 0:
                continue
            total = summed(a, base + "_sum", app).get("", 0.0) - summed(b, base + "_sum", app).get(
                "", 0.0
            )
            nb, na = summed(b, base + "_bucket", app), summed(a, base + "_bucket", app)
            buckets = sorted((float(le), na[le] - nb.get(le, 0.0)) for le in na)
            p99, _ = _p99(buckets, count)
            stages[stage] = {"count": count, "mean_s": total / count, "p99_s": p99}
        result[app] = stages
    return result


TARGET_FIELDS = ("p99_target_s", "load_rps", "weight", "min_replicas", "max_replicas")


def targets_from_measurements(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The targets file (serve_app.plan.targets) that states the asks a measurements file
    carries, for ``serve-app plan --from-running`` against the plan it gave."""
    out: dict[str, Any] = {"format": 1}
    for key in ("margin_fraction", "max_utilization", "reserve"):
        if doc.get(key) is not None:
            out[key] = doc[key]
    out["models"] = {
        name: {k: m[k] for k in TARGET_FIELDS if m.get(k) is not None}
        for name, m in doc["models"].items()
    }
    return out
