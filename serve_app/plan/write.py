"""A plan written out: the Serve config ``serve deploy`` and ``serve-app run`` take as they are,
the plan as JSON (which ``python -m load_tests.plan_plot`` draws), and a markdown report."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from serve_app.config.args import IMPORT_PATH
from serve_app.errors import ConfigError
from serve_app.plan.measurements import Measurements
from serve_app.plan.solver import Plan

GIB = 1 << 30


def apply_plan(
    doc: dict[str, Any], plan: Plan, measurements: Measurements
) -> tuple[dict[str, Any], list[str]]:
    """``doc`` with each planned application's deployment set to the plan: num_replicas,
    ray_actor_options.num_gpus (the share, of the smallest GPU) and num_cpus (as measured),
    memory.budget in bytes, and max_batch_size (the candidate's batch cap). Every serve_app
    application must be planned, or the plan's GPUs would be shared with replicas it did not
    count."""
    out = copy.deepcopy(doc)
    notes: list[str] = []
    by_name = {m.name: m for m in plan.models}
    apps = [a for a in out.get("applications") or [] if isinstance(a, dict)]
    ours = {str(a.get("name")): a for a in apps if a.get("import_path") == IMPORT_PATH}
    unplanned = sorted(set(ours) - set(by_name))
    unknown = sorted(set(by_name) - set(ours))
    if unplanned or unknown:
        raise ConfigError(
            "the measurements and the config name different applications: "
            + (f"in the config, not measured: {', '.join(unplanned)}; " if unplanned else "")
            + (f"measured, not in the config: {', '.join(unknown)}; " if unknown else "")
            + "measure every serve_app application of the config, by its name"
        )
    for name, app in ours.items():
        mp = by_name[name]
        deps = app.get("deployments") or [{"name": "model"}]
        if len(deps) != 1:
            raise ConfigError(f"application {name}: the planner writes one deployment")
        dep = deps[0]
        app["deployments"] = deps
        if dep.pop("autoscaling_config", None) is not None:
            notes.append(f"{name}: autoscaling_config removed; the plan fixes the replicas")
        dep["num_replicas"] = mp.total_replicas
        opts = dep.setdefault("ray_actor_options", {})
        opts["num_gpus"] = mp.num_gpus
        opts["num_cpus"] = measurements.models[name].num_cpus
        args = app.setdefault("args", {})
        args["max_batch_size"] = mp.candidate.batch_size
        args.setdefault("memory", {})["budget"] = mp.candidate.budget_bytes
        if mp.total_replicas == 0:
            notes.append(f"{name}: the plan gives it no replica")
    return out, notes


def _round(value: Any) -> Any:
    """Floats to 6 significant digits: the solver's last digits are not figures."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_round(v) for v in value]
    return value


def plan_json(plan: Plan, measurements: Measurements) -> dict[str, Any]:
    return _round(_plan_doc(plan, measurements))  # type: ignore[no-any-return]


def _plan_doc(plan: Plan, measurements: Measurements) -> dict[str, Any]:
    return {
        "format": 1,
        "mode": measurements.mode,
        "max_utilization": measurements.max_utilization,
        "objective_rps": plan.objective,
        "models": [
            {
                "application": m.name,
                "batch_size": m.candidate.batch_size,
                "budget_bytes": m.candidate.budget_bytes,
                "num_gpus": m.num_gpus,
                "replicas_per_gpu": list(m.replicas),
                "predicted_throughput_rps": m.throughput_rps,
                "predicted_p99_s": m.p99_s,
                "p99_target_s": measurements.models[m.name].p99_target_s,
                "load_rps": measurements.models[m.name].load_rps,
            }
            for m in plan.models
        ],
        "gpus": [
            {
                "name": u.gpu.name,
                "total_bytes": u.gpu.total_bytes,
                "memory_bytes": u.memory_bytes,
                "memory_cap_bytes": u.memory_cap_bytes,
                "share_units": u.units,
                "share_units_cap": u.units_cap,
                "cores": u.cores,
                "ingress_cores": u.ingress_cores,
                "cores_cap": u.cores_cap,
                "gpu_time": u.gpu_time,
                "gpu_time_even_split": u.gpu_time_even_split,
                "gpu_time_cap": u.gpu_time_cap,
                "binds": list(u.binds) or ["nothing"],
                "per_model": {
                    m.name: {
                        "replicas": m.replicas[g],
                        "memory_bytes": int(m.num_gpus * u.gpu.total_bytes) * m.replicas[g],
                        "cores": measurements.models[m.name].num_cpus * m.replicas[g],
                    }
                    for m in plan.models
                },
            }
            for g, u in enumerate(plan.gpus)
        ],
    }


def report_markdown(plan: Plan, measurements: Measurements, config_name: str) -> str:
    lines = [
        f"# Plan for {config_name}",
        "",
        f"Predicted from measurements ({measurements.mode}), not measured under this plan. "
        f"Total weighted throughput: {plan.objective:,.1f} requests/s.",
        "",
        "| application | batch cap | budget | num_gpus | replicas | load | predicted req/s "
        "| predicted p99 | p99 target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in plan.models:
        spec = measurements.models[m.name]
        load = f"{spec.load_rps:g} req/s" if spec.load_rps else f"weight {spec.weight:g}"
        lines.append(
            f"| {m.name} | {m.candidate.batch_size} | {m.candidate.budget_bytes / GIB:.2f} GiB "
            f"| {m.num_gpus:g} | {' + '.join(map(str, m.replicas))} | {load} "
            f"| {m.throughput_rps:,.1f} | {m.p99_s * 1000:.1f} ms "
            f"| {spec.p99_target_s * 1000:g} ms |"
        )
    lines += [
        "",
        "| GPU | memory held (of the room less the reserve) | shares (of 1) | cores: replicas "
        "+ ingress | GPU time (even split) | binds |",
        "|---|---|---|---|---|---|",
    ]
    for g, u in enumerate(plan.gpus):
        binds = [
            f"cores (the ingress {u.ingress_cores:.2f} of them)"
            if b == "cores" and u.ingress_cores > 0
            else b
            for b in u.binds
        ]
        lines.append(
            f"| {g}: {u.gpu.name} "
            f"| {u.memory_bytes / GIB:.1f} of {u.memory_cap_bytes / GIB:.1f} GiB "
            f"| {u.units / 10_000:g} of {u.units_cap / 10_000:g} "
            f"| {u.cores:g} + {u.ingress_cores:.2f} of {u.cores_cap:g} "
            f"| {u.gpu_time:.2f} ({u.gpu_time_even_split:.2f}) of {u.gpu_time_cap:.2f} "
            f"| {', '.join(binds) or 'nothing'} |"
        )
    lines += [
        "",
        "Assumptions and sources: see the measurements file's `sources` and `notes`.",
        f"- Each replica is planned at most {measurements.max_utilization:.0%} of its measured "
        "saturation rate (`max_utilization`), and within its p99 target.",
    ]
    if not any(spec.ingress_cpu_s_per_request for spec in measurements.models.values()):
        lines.append(
            "- The ingress (HAProxy, Ray's proxy) is charged no cores: no model has an "
            "`ingress_cpu_s_per_request`, so the reserve must hold it."
        )
    lines += [f"- {n}" for n in measurements.notes]
    return "\n".join(lines) + "\n"


def write_plan(config: str, measurements: str, out: str) -> str:
    """``serve-app plan``: solve, check the written config as ``serve-app check`` would, write
    OUT/serve_config.yaml, plan.json and plan.md; what to print. Raises ConfigError (bad input,
    or a written config the check refuses: a bug of the planner) or solver.Infeasible."""
    import yaml

    from serve_app.config.deploy import check_deploy_config, load_deploy_config
    from serve_app.plan import measurements as meas
    from serve_app.plan.solver import solve

    doc = load_deploy_config(config)
    m = meas.load_measurements(measurements)
    problem = meas.to_problem(m)
    plan = solve(problem)
    planned, notes = apply_plan(doc, plan, m)
    gpus = len(problem.gpus)
    errors = check_deploy_config(planned, gpus=gpus)
    if errors:
        raise ConfigError("the written plan fails serve-app check:\n  " + "\n  ".join(errors))
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Written by serve-app plan from {config} and {measurements} (docs/planning.md):\n"
        "# num_replicas, num_gpus, num_cpus, memory.budget and max_batch_size are the plan's.\n"
    )
    (folder / "serve_config.yaml").write_text(header + yaml.safe_dump(planned, sort_keys=False))
    (folder / "plan.json").write_text(json.dumps(plan_json(plan, m), indent=1) + "\n")
    report = report_markdown(plan, m, Path(config).name)
    (folder / "plan.md").write_text(report)
    return "\n".join(
        [f"note: {n}" for n in notes]
        + [
            report,
            f"wrote {folder / 'serve_config.yaml'} (serve deploy / serve-app run; check it with "
            f"serve-app check --gpus {gpus}), plan.json and plan.md; the plot: "
            f"python -m load_tests.plan_plot {folder / 'plan.json'}",
        ]
    )
