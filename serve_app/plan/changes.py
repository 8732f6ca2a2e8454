"""What ``serve-app plan --from-running`` says to change: per application, what runs now
(replicas, num_gpus and budget, max_batch_size) against what the plan says, and why (what binds
the plan, which target is missed now). Pure: the plan (plan.json), the live measurements, the
window and the last report come in as data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from serve_app.plan.live import AppWindow, busy_fraction
from serve_app.plan.targets import serve_app_apps

GIB = 1 << 30
SATURATED = 0.85  # a busy fraction at or above it: the model threads are near saturation
FAR_ABOVE = 2.0  # a budget this many times the need the plan computes is "far above"
SHARE_EPS = 1e-4  # Ray's share unit: shares closer than this are the same


def _one(values: set[Any]) -> Any:
    """The one value, or the sorted values when replicas differ."""
    return next(iter(values)) if len(values) == 1 else sorted(values)


def need_bytes(model: Mapping[str, Any], batch_size: int) -> int:
    """What the live figures say a replica needs at a batch cap, before the margin."""
    return int(
        model["context_bytes"]
        + model["weights_bytes"]
        + model["graph_pool_bytes"]
        + model["activation_peak_bytes"][str(batch_size)]
    )


def now_of(w: AppWindow) -> dict[str, Any]:
    reps = w.replicas
    return {
        "replicas": len(reps),
        "num_gpus": _one({float(r.get("num_gpus") or 0.0) for r in reps}),
        "budget_bytes": _one({int(r.get("budget_bytes") or 0) for r in reps}),
        "max_batch_size": _one({int(r["max_batch_size"]) for r in reps}),
        "on_gpu": any(r.get("gpu_mode") == "cuda" for r in reps),
    }


def reasons(
    name: str,
    w: AppWindow,
    now: Mapping[str, Any],
    planned: Mapping[str, Any],
    model: Mapping[str, Any],
    plan: Mapping[str, Any],
) -> list[str]:
    """Why: the targets missed now, and what binds the plan."""
    out = []
    busy = busy_fraction(w)
    if w.refused > 0:
        out.append(
            f"{w.refused} requests refused (503: queue full or past its deadline) in the "
            "window: the replicas did not keep up"
        )
    if busy >= SATURATED:
        out.append(f"model threads busy {busy:.0%} of the window: at saturation")
    cand = model["candidates"][0]
    capacity = now["replicas"] * cand["throughput_rps"]
    load = model.get("load_rps")
    if load is not None and capacity < load:
        out.append(
            f"{now['replicas']} replica(s) carry about {capacity:,.1f} req/s (estimated), "
            f"below the stated load of {load:g} req/s"
        )
    if w.p99_seen_s is not None and w.p99_seen_s > model["p99_target_s"]:
        out.append(
            f"p99 {w.p99_seen_s * 1000:.1f} ms in the window, over the target of "
            f"{model['p99_target_s'] * 1000:g} ms"
        )
    if now["on_gpu"] and isinstance(now["budget_bytes"], int) and now["budget_bytes"] > 0:
        need = need_bytes(model, cand["batch_size"])
        if now["budget_bytes"] >= FAR_ABOVE * need:
            out.append(
                f"budget {now['budget_bytes'] / GIB:.2f} GiB is {now['budget_bytes'] / need:.1f}x "
                f"the peak seen ({need / GIB:.2f} GiB with the context)"
            )
        elif now["budget_bytes"] < need:
            out.append(
                f"budget {now['budget_bytes'] / GIB:.2f} GiB is below the peak seen "
                f"({need / GIB:.2f} GiB with the context)"
            )
    replicas = sum(planned.get("replicas_per_gpu") or [])
    if replicas == model["min_replicas"] and now["replicas"] < replicas:
        out.append(f"the targets ask for at least {replicas} replicas (min_replicas)")
    if replicas == model["max_replicas"] and now["replicas"] > replicas:
        out.append(f"the targets allow at most {replicas} replicas (max_replicas)")
    if load is None:
        out.append(f"planned by weight {model['weight']:g}: as much throughput as fits")
    else:
        out.append(
            f"stated load {load:g} req/s: planned {planned['predicted_throughput_rps']:,.1f} "
            f"req/s at a predicted p99 of {planned['predicted_p99_s'] * 1000:.1f} ms"
        )
    for g, gpu in enumerate(plan.get("gpus") or []):
        if (gpu.get("per_model") or {}).get(name, {}).get("replicas"):
            out.append(f"the plan on GPU {g} is bound by: {', '.join(gpu['binds'])}")
    return out


def diff(
    config: dict[str, Any],
    plan: Mapping[str, Any],
    measurements: Mapping[str, Any],
    windows: Mapping[str, AppWindow],
    last: Mapping[str, Any],
    decisions: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """Per application of the config: now, the plan, what to change and why."""
    planned_by = {m["application"]: m for m in plan["models"]}
    controller = last.get("controller") or {}
    out = []
    for name, app in serve_app_apps(config).items():
        w, planned = windows[name], planned_by[name]
        model = measurements["models"][name]
        now = now_of(w)
        then = {
            "replicas": sum(planned["replicas_per_gpu"]),
            "num_gpus": planned["num_gpus"],
            "budget_bytes": planned["budget_bytes"],
            "max_batch_size": planned["batch_size"],
        }
        what = []
        if now["replicas"] != then["replicas"]:
            what.append(f"replicas {now['replicas']} -> {then['replicas']}")
        if now["on_gpu"]:
            shares = now["num_gpus"] if isinstance(now["num_gpus"], list) else [now["num_gpus"]]
            if any(abs(s - then["num_gpus"]) >= SHARE_EPS for s in shares):
                what.append(
                    f"num_gpus {now['num_gpus']} -> {then['num_gpus']:g} (budget "
                    f"{now['budget_bytes']} -> {then['budget_bytes']} bytes)"
                )
        if now["max_batch_size"] != then["max_batch_size"]:
            what.append(f"max_batch_size {now['max_batch_size']} -> {then['max_batch_size']}")
        dep = (app.get("deployments") or [{}])[0]
        if what and dep.get("autoscaling_config") is not None:
            what.append("autoscaling_config removed: the plan fixes the replicas")
        entry: dict[str, Any] = {
            "application": name,
            "now": now,
            "plan": then,
            "change": bool(what),
            "what": what,
            "why": reasons(name, w, now, planned, model, plan),
            "busy_fraction": round(busy_fraction(w), 4),
            "refused_requests": w.refused,
            "controller": {k: v for k, v in controller.items() if k.split("/")[0] == name},
        }
        if not now["on_gpu"]:
            entry["note"] = "CPU replicas: num_gpus not compared (no GPU share runs now)"
        if decisions is not None:
            entry["decisions"] = decisions.get(name, {})
        out.append(entry)
    return out


def summary(found: list[dict[str, Any]]) -> str:
    lines = []
    for c in found:
        lines.append(f"{c['application']}: " + ("; ".join(c["what"]) or "no change"))
    return "\n".join(lines)


def markdown(found: list[dict[str, Any]], url: str, config_name: str) -> str:
    lines = [
        f"# Changes for {config_name}, re-planned from {url}",
        "",
        "What runs now against what the plan says. The plan is a prediction from one window "
        "of live traffic (measurements.json says how each figure was read); the batch cap is "
        "the one in force, since live traffic measures no other.",
        "",
        "| application | replicas | num_gpus | budget | max_batch_size | change |",
        "|---|---|---|---|---|---|",
    ]
    for c in found:
        now, plan = c["now"], c["plan"]
        budget_now = now["budget_bytes"]
        if not now["on_gpu"]:
            budget_now = "- (CPU)"
        elif isinstance(budget_now, int):
            budget_now = f"{budget_now / GIB:.2f}"
        budget_text = f"{budget_now} -> {plan['budget_bytes'] / GIB:.2f} GiB"
        lines.append(
            f"| {c['application']} | {now['replicas']} -> {plan['replicas']} "
            f"| {now['num_gpus']} -> {plan['num_gpus']:g} | {budget_text} "
            f"| {now['max_batch_size']} -> {plan['max_batch_size']} "
            f"| {'yes' if c['change'] else 'No change'} |"
        )
    for c in found:
        lines += ["", f"## {c['application']}", ""]
        lines.append("Change: " + ("; ".join(c["what"]) if c["what"] else "No change."))
        lines.append("")
        lines.append(
            f"Seen in the window: model threads busy {c['busy_fraction']:.0%}, "
            f"{c['refused_requests']} requests refused."
        )
        if c.get("note"):
            lines.append(f"Note: {c['note']}.")
        lines += ["", "Why:", ""] + [f"- {r}" for r in c["why"]]
        for dep, d in c["controller"].items():
            lines.append(
                f"- the controller's last decision for {dep}: {d.get('current_replicas')} -> "
                f"{d.get('target_replicas')} ({d.get('reason')}): {d.get('detail')}"
            )
        if not c["controller"]:
            lines.append("- the controller has made no decision for it (no autoscaling policy)")
        if "decisions" in c:
            counted = c["decisions"].get("since_start") or {}
            text = ", ".join(f"{k} {v:g}" for k, v in sorted(counted.items())) or "none"
            lines.append(f"- the controller's decisions since it started, by reason: {text}")
    return "\n".join(lines) + "\n"
