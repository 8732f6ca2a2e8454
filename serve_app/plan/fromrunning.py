"""``serve-app plan CONFIG --from-running URL --targets FILE --out DIR``: read a running
server's reports twice, ``--window-s`` apart (and Ray's metrics with ``--metrics``), turn them
into DIR/measurements.json (serve_app.plan.live), plan from it as ``serve-app plan
--measurements`` does (serve_app.plan.write), and say what to change (serve_app.plan.changes).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from serve_app.errors import ConfigError, ServeAppError
from serve_app.plan import live
from serve_app.plan.gputime import GpuSampler, fit_to_nvml
from serve_app.plan.hostprocs import (
    HostFacts,
    Threads,
    cpu_seconds,
    host_facts,
    local_process,
    thread_seconds,
)
from serve_app.plan.targets import DEFAULT_TEXTS_PER_REQUEST, Targets, builtin_kind

MIN_WINDOW_S = 1.0


class NotServeApp(ServeAppError):
    """The URL answers, but not as a serve_app server."""

    error_type = "not_serve_app"


def read_server(url: str) -> dict[str, Any]:
    """``GET URL/v1/memory``, checked to be a serve_app memory report."""
    from serve_app.ops.status import read_memory_report

    doc: Any
    try:
        doc = read_memory_report(url)  # StatusUnavailable: unreachable, or not 200 (named)
    except ServeAppError as exc:
        if " answered 404" in exc.message:
            raise NotServeApp(f"{url} is not a serve_app server: {exc.message[:300]}") from None
        raise
    except ValueError:  # 200, but not JSON
        doc = None
    if not isinstance(doc, dict) or doc.get("object") != "memory_report":
        raise NotServeApp(
            f"{url} is not a serve_app server: GET /v1/memory answered 200 without a "
            "memory_report (give the base URL serve-app run printed)"
        )
    return doc


def scrape(metrics_url: str, apps: set[str]) -> str:
    """The part of Ray's metrics exposition at ``metrics_url`` that the re-plan reads."""
    import httpx

    from serve_app.plan.scrape import excerpt, parse

    try:
        resp = httpx.get(metrics_url, timeout=10.0)
    except httpx.HTTPError as exc:
        raise ConfigError(f"--metrics {metrics_url}: cannot reach it ({exc})") from None
    if resp.status_code != 200:
        raise ConfigError(f"--metrics {metrics_url}: answered {resp.status_code}")
    text = excerpt(resp.text, apps)
    try:
        parse(text)
    except ValueError as exc:
        raise ConfigError(f"--metrics {metrics_url}: not a Prometheus exposition ({exc})") from None
    return text


def _apps(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    from serve_app.plan.targets import serve_app_apps

    return serve_app_apps(doc)


def check_inputs(
    config: dict[str, Any], targets: Targets, running: set[str], url: str
) -> list[str]:
    """Every serve_app application of CONFIG runs and has a target, and every target names
    one (ConfigError); notes for applications that run but are not in CONFIG."""
    apps = set(_apps(config))
    errors = [
        f"application {a}: no target; add models.{a} to the targets file"
        for a in sorted(apps - set(targets.models))
    ]
    errors += [
        f"targets models.{a}: no serve_app application of that name in CONFIG"
        for a in sorted(set(targets.models) - apps)
    ]
    errors += [
        f"application {a} of CONFIG is not running at {url} (running: "
        f"{', '.join(sorted(running)) or 'none'})"
        for a in sorted(apps - running)
    ]
    if errors:
        raise ConfigError("cannot re-plan:\n  " + "\n  ".join(errors))
    return [
        f"application {a} runs at {url} but is not in CONFIG: the plan does not count its "
        "replicas, which may share the plan's GPUs and cores"
        for a in sorted(running - apps)
    ]


def items_per_request(app: dict[str, Any], target: Any) -> int:
    """Items a request carries, as ``plan --measure`` sends them: the target's, else one
    image or 16 texts (a given request body: 1)."""
    from serve_app.config.args import parse_args

    if target.items_per_request:
        return int(target.items_per_request)
    if target.request is not None:
        return 1
    kind = builtin_kind(parse_args(app.get("args"), prefix="args"))
    return 1 if kind == "image-classification" else DEFAULT_TEXTS_PER_REQUEST


def traffic(
    name: str,
    w: live.AppWindow,
    per_request: float,
    metrics: tuple[list[Any], list[Any]] | None,
    cpu: tuple[dict[Any, float], dict[Any, float]],
    threads: Threads | None = None,
) -> live.Traffic:
    """The window's requests (its batched items over the items a request carries: the
    metrics' mean, else ``per_request``), their p99 (the metrics), the replicas' CPU and their
    busiest threads."""
    from serve_app.plan.scrape import mean_items, request_window

    why = "no --metrics" if metrics is None else "--metrics had no request_items for it yet"
    how = (
        f"{w.items} batched items in the window over {per_request} items a request (the "
        f"targets' items_per_request, else plan --measure's default; {why})"
    )
    p99, p99_how = None, "no --metrics given"
    if metrics is not None:
        mean = mean_items(metrics[1], name)
        if mean is not None:
            per_request = mean
            how = (
                f"{w.items} batched items in the window over {mean:.2f} items a request (the "
                "mean of ray_serve_app_request_items over the replicas' lives, Ray's metrics)"
            )
        rw = request_window(metrics[0], metrics[1], name)
        p99, p99_how = rw.p99_s, rw.p99_note
        if p99 is not None:
            p99_how = (
                f"p99 of the replicas' ray_serve_app_request_seconds {rw.p99_note} (HAProxy's "
                "time not in it)"
            )
    requests = w.items / per_request
    before, after = cpu
    local = [k for k in w.items_by_replica if k in before and k in after]
    cpu_s = sum(after[k] - before[k] for k in local)
    local_items = sum(w.items_by_replica[k] for k in local)
    served = requests * local_items / w.items if w.items else 0.0
    busiest = threads.busiest(local) if threads is not None else None
    return live.Traffic(
        requests,
        how,
        p99,
        p99_how,
        cpu_s if local else None,
        served,
        busiest[0] if busiest else None,
        busiest[1] if busiest else "",
    )


def build_measurements(
    doc: dict[str, Any],
    targets: Targets,
    first: dict[str, Any],
    last: dict[str, Any],
    texts: tuple[str, str] | None,
    host: HostFacts,
    *,
    url: str,
    window_s: float,
    cores_per_gpu: float | None = None,
    gpu_busy_s: float | None = None,
) -> tuple[dict[str, Any], dict[str, live.AppWindow]]:
    """The measurements file from two reads of ``GET /v1/memory`` (and two metrics excerpts),
    and each application's window. Pure. ConfigError naming every application that cannot be
    estimated."""
    from serve_app.plan.scrape import parse

    scraped = (parse(texts[0]), parse(texts[1])) if texts else None
    apps, reps0, reps1 = _apps(doc), live.by_application(first), live.by_application(last)
    provenance = (
        f"read from the running server at {url} (GET /v1/memory twice, {window_s:g} s apart)"
    )
    models, windows, errors = {}, {}, []
    every = [r for reps in reps1.values() for r in reps]
    for name, app in apps.items():
        w = live.app_window(name, reps0.get(name, []), reps1.get(name, []))
        target = targets.models[name]
        t = traffic(
            name,
            w,
            items_per_request(app, target),
            scraped,
            (host.cpu_before, host.cpu_after),
            host.threads,
        )
        w = windows[name] = dataclasses.replace(w, p99_seen_s=t.p99_s)
        try:
            live.saturation_rps(w, t)  # too little traffic: said before anything else
            if any(r.get("gpu_mode") == "cuda" for r in w.replicas):
                memory = live.gpu_memory_live(w.replicas)
            else:
                keys = [(r.get("replica_id"), r.get("pid")) for r in w.replicas]
                rss = [host.rss_bytes[k] for k in keys if k in host.rss_bytes]
                memory = live.cpu_memory_live(w.replicas, max(rss) if rss else None)
            opts = (app.get("deployments") or [{}])[0].get("ray_actor_options") or {}
            num_cpus = float(opts.get("num_cpus", 1.0))
            models[name] = live.live_model_entry(w, t, memory, target, num_cpus, provenance)
        except ValueError as exc:  # NotEnoughTraffic among them
            errors.append(str(exc) if str(exc).startswith("application") else f"{name}: {exc}")
    if errors:
        raise ConfigError("cannot re-plan from the running server:\n  " + "\n  ".join(errors))
    if any(r.get("gpu_mode") == "cuda" for r in every):
        count = len({g.get("uuid") for g in last.get("gpus") or []}) or 1
        if cores_per_gpu is None and host.all_local:
            cores_per_gpu = host.cores / count
        try:
            gpu, gpu_how = live.gpu_entry(last, every, cores_per_gpu)
        except ValueError as exc:
            raise ConfigError(f"cannot re-plan: {exc}") from None
    else:
        cores = cores_per_gpu or host.cores
        gpu = {"name": "CPU (no GPU): host memory", "total_bytes": host.memory_bytes}
        gpu["cores"] = cores
        gpu_how = "no GPU replica: this host's memory and cores (the replicas run on it)"
    notes = [
        f"Read from the running server at {url}: GET /v1/memory twice, {window_s:g} s apart"
        + (", and Ray's metrics" if texts else " (no --metrics)")
        + ". One candidate per model, its batch cap in force: live traffic measures no other. "
        f"gpus: {gpu_how}.",
        "The controller keeps its last decision per deployment (GET /v1/memory's controller) "
        "and counts its decisions by reason (ray_serve_app_autoscale_decisions_total, with "
        "--metrics); no longer history of its decisions exists.",
    ]
    notes += check_inputs(doc, targets, set(reps1), url)
    if host.all_local:  # NVML here reads the replicas' GPUs
        fitted = fit_to_nvml(models, {k: w.busy_s for k, w in windows.items()}, gpu_busy_s)
        notes += [fitted] if fitted else []
    doc_out = live.measurements_live(
        models=models,
        gpu=gpu,
        mps=any(r.get("enforcement") == "mps" for r in every),
        margin_fraction=targets.margin_fraction,
        max_utilization=targets.max_utilization,
        reserve=targets.reserve.model_dump(),
        notes=notes,
    )
    return doc_out, windows


def local_gpus(report: Mapping[str, Any]) -> list[str]:
    """The GPUs (uuids) of a server's report whose replicas run on this host: NVML here can
    read their utilisation. Empty when any replica runs elsewhere or none is on a GPU."""
    reps = list(report.get("replicas") or [])
    if not any(r.get("gpu_mode") == "cuda" for r in reps):
        return []
    if any(local_process(r) is None for r in reps):
        return []
    return sorted({str(g["uuid"]) for g in report.get("gpus") or [] if g.get("uuid")})


def decisions_of(texts: tuple[str, str] | None, apps: list[str]) -> dict[str, Any] | None:
    """The controller's decisions by reason per application: since it started, in the window."""
    if texts is None:
        return None
    from serve_app.plan.scrape import decisions, decisions_in_window, parse

    before, after = parse(texts[0]), parse(texts[1])
    return {
        name: {
            "since_start": decisions(after, name),
            "in_window": decisions_in_window(decisions(before, name), decisions(after, name)),
        }
        for name in apps
    }


def plan_from_running(
    config: str,
    url: str,
    targets_path: str,
    out: str,
    *,
    window_s: float = 30.0,
    metrics_url: str | None = None,
    cores_per_gpu: float | None = None,
    log: Callable[[str], None] = print,
) -> str:
    """The command (see the module docstring); what to print. ConfigError or the status
    errors on bad input, an unreachable URL, or too little traffic."""
    from serve_app.config.deploy import load_deploy_config
    from serve_app.plan import changes
    from serve_app.plan.targets import load_targets
    from serve_app.plan.write import write_plan

    if window_s < MIN_WINDOW_S:
        raise ConfigError(f"--window-s {window_s:g}: at least {MIN_WINDOW_S:g} s")
    doc = load_deploy_config(config)
    targets = load_targets(targets_path)
    apps = list(_apps(doc))
    first = read_server(url)
    check_inputs(doc, targets, set(live.by_application(first)), url)
    m0 = scrape(metrics_url, set(apps)) if metrics_url else None
    cpu0 = cpu_seconds(list(first.get("replicas") or []))
    threads0, threads0_at = thread_seconds(list(first.get("replicas") or [])), time.monotonic()
    log(f"plan --from-running: reading {url} again in {window_s:g} s")
    with GpuSampler(local_gpus(first)) as gpu:
        begin = time.perf_counter()
        time.sleep(window_s)
        last = read_server(url)
        gpu_busy_s = gpu.busy_s(begin, time.perf_counter())
    m1 = scrape(metrics_url, set(apps)) if metrics_url else None
    host = host_facts(cpu0, last, threads0, threads0_at)
    check_inputs(doc, targets, set(live.by_application(last)), url)
    texts = (m0, m1) if m0 is not None and m1 is not None else None
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    raw = {"url": url, "window_s": window_s, "first": first, "last": last}
    raw |= {"metrics_first": m0, "metrics_last": m1}
    (folder / "live.json").write_text(json.dumps(raw, indent=1) + "\n")
    doc_out, windows = build_measurements(
        doc,
        targets,
        first,
        last,
        texts,
        host,
        url=url,
        window_s=window_s,
        cores_per_gpu=cores_per_gpu,
        gpu_busy_s=gpu_busy_s,
    )
    path = folder / "measurements.json"
    path.write_text(json.dumps(doc_out, indent=1) + "\n")
    log(f"wrote {path}")
    text = write_plan(config, str(path), out)
    plan_path = folder / "plan.json"
    plan = json.loads(plan_path.read_text())
    found = changes.diff(doc, plan, doc_out, windows, last, decisions_of(texts, apps))
    plan["changes"] = found
    plan_path.write_text(json.dumps(plan, indent=1) + "\n")
    (folder / "changes.md").write_text(changes.markdown(found, url, Path(config).name))
    return text + "\n" + changes.summary(found) + f"\nwrote {folder / 'changes.md'}"
