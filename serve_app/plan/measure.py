"""``serve-app plan CONFIG --measure --targets FILE --out DIR``: measure each serve_app
application of CONFIG on this host, write DIR/measurements.json (the schema ``serve-app plan``
reads), then plan from it (serve_app.plan.write).

A local Ray as ``serve-app run`` starts it (ops.launch), then for each application in turn ONE
replica of it alone, at the route ``/`` of a free port, with ``--share`` of the GPU (the CPU
when there is none):

1. at the largest batch cap (targets.batch_cap), calibrating into DIR/calibration, so that
   calibration's probes give the activation peak at every candidate; ``GET /v1/memory`` right
   after start-up and after the loads gives the rest (serve_app.plan.readings);
2. at each candidate batch cap (targets.candidate_batch_sizes; the smaller ones redeployed
   with that cap and calibration off), a closed loop at saturation, then one request at a time
   (serve_app.plan.loop), reading the CPU of the replica and of the ingress (HAProxy, Ray's
   proxy: serve_app.plan.ingress) at the saturated window's edges.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from serve_app.config.args import AppArgs, parse_args
from serve_app.errors import ConfigError, StartupError
from serve_app.plan import readings as rd
from serve_app.plan.targets import (
    Targets,
    batch_cap,
    candidate_batch_sizes,
    check_targets,
    load_targets,
    measured_mode,
    request_for,
    serve_app_apps,
)

MAX_CONCURRENCY = 512
STARTUP_ALL_S = 600.0  # the most AppArgs allows for graph capture and warm-up at start-up
SETTLE_TIMEOUT_S = 120.0
CODE_COMMIT_VAR = "SERVE_APP_CODE_COMMIT"  # names the code where a copied tree has no .git


@dataclass(frozen=True)
class Settings:
    share: float = 0.5  # of the GPU, for the one replica measured: generous, so calibration
    # reaches the largest cap
    candidates: int = 3
    warmup_s: float = 2.0
    duration_s: float = 10.0
    idle_duration_s: float = 5.0
    ready_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ConfigError(f"--share {self.share:g}: a share of one GPU, above 0, at most 1")
        if self.candidates < 1:
            raise ConfigError(f"--candidates {self.candidates}: measure at least 1 batch cap")
        if min(self.warmup_s, self.duration_s, self.idle_duration_s) < 0 or not (
            self.duration_s > 0 and self.idle_duration_s > 0
        ):
            raise ConfigError("--duration-s and --idle-duration-s above 0, --warmup-s at least 0")


def measure_config(
    doc: dict[str, Any],
    name: str,
    batch_size: int,
    *,
    share: float,
    port: int,
    calibrate: bool,
    cache_dir: Path,
) -> dict[str, Any]:
    """CONFIG cut to application ``name``, at route ``/`` on ``port``, one replica of
    ``share`` of a GPU (its num_cpus and the rest of its deployment as configured; no
    autoscaling, no memory.budget), its batch cap ``batch_size``; calibrating into
    ``cache_dir``, or with calibration off (the cap is then ``batch_size`` as set). Start-up
    captures every CUDA graph and runs every warm-up batch before it serves (their start-up
    budgets at their most), so that calibration measures beside the whole graph pool and no
    capture runs between the measured batches."""
    app = json.loads(json.dumps(serve_app_apps(doc)[name]))
    app["route_prefix"] = "/"
    deps = app.get("deployments") or [{"name": "model"}]
    if len(deps) != 1:
        raise ConfigError(f"application {name}: the planner measures one deployment")
    dep = deps[0]
    dep.pop("autoscaling_config", None)
    dep["num_replicas"] = 1
    dep.setdefault("ray_actor_options", {})["num_gpus"] = share
    app["deployments"] = [dep]
    args = app.setdefault("args", {})
    args["max_batch_size"] = batch_size
    args.update(cuda_graph_startup_budget_s=STARTUP_ALL_S, warmup_startup_budget_s=STARTUP_ALL_S)
    memory = args.setdefault("memory", {})
    memory.pop("budget", None)
    memory.update(calibrate=calibrate, calibration_cache_dir=str(cache_dir))
    out = {k: v for k, v in doc.items() if k != "applications"}
    out["http_options"] = {**(doc.get("http_options") or {}), "host": "127.0.0.1", "port": port}
    out["applications"] = [app]
    return out


def saturation_concurrency(batch_size: int, items_per_request: int) -> int:
    """Requests in flight to keep a replica saturated: two batches' worth, and two more."""
    return min(MAX_CONCURRENCY, 2 * math.ceil(batch_size / items_per_request) + 2)


def provenance(gpu: str) -> str:
    """'measured by serve-app plan --measure at <commit> on <host/gpu>'."""
    from serve_app import env

    commit = env.get(CODE_COMMIT_VAR)
    root = Path(__file__).resolve().parents[2]
    if not commit and (root / ".git").exists():
        git = ["git", "-C", str(root)]
        try:
            commit = subprocess.run(
                [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
            dirty = subprocess.run(
                [*git, "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            commit += "+dirty" if dirty else ""
        except (OSError, subprocess.CalledProcessError):
            commit = ""
    where = f"{socket.gethostname()}/{gpu}"
    return f"measured by serve-app plan --measure at {commit or 'unknown'} on {where}"


def _replica(base: str, name: str, not_pid: int | None = None) -> dict[str, Any]:
    """The newest report of application ``name``'s replica in ``GET /v1/memory`` (not that of
    process ``not_pid``: a deleted replica's report stays for a few seconds)."""
    from serve_app.ops.status import read_memory_report

    deadline = time.monotonic() + 30.0
    while True:
        reps = [
            r
            for r in read_memory_report(base)["replicas"]
            if r.get("application") == name and r.get("pid") != not_pid
        ]
        if reps:
            return max(reps, key=lambda r: float(r["process_started_at_s"]))
        if time.monotonic() > deadline:
            raise StartupError(f"{base}/v1/memory lists no replica of {name}")
        time.sleep(0.5)


def _settled(base: str, name: str, not_pid: int | None, log: Callable[[str], None]) -> Any:
    """The replica's report once it has no graph capture or warm-up batch left (its idle
    moments run them), or after SETTLE_TIMEOUT_S, said."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        report = _replica(base, name, not_pid)
        if not rd.startup_left([report]):
            return report
        if time.monotonic() > deadline:
            log(f"plan --measure: {name}: start-up work still pending; measuring anyway")
            return report
        time.sleep(0.5)


class _Cluster:
    """The local Ray of the measurement: the first deploy starts it as ``serve-app run`` does;
    each later one deletes the last application and waits for its process to end."""

    def __init__(self, ready_timeout_s: float) -> None:
        self.ready_timeout_s = ready_timeout_s
        self.started = False
        self.pid: int | None = None

    def deploy(self, doc: dict[str, Any]) -> str:
        from serve_app.ops import launch

        opts = doc["http_options"]
        base = f"http://{opts['host']}:{opts['port']}"
        if not self.started:
            self.started = True
            launch.run(doc, haproxy=True, ready_timeout_s=self.ready_timeout_s)
            return base
        import psutil
        from ray import serve

        for app in list(serve.status().applications):
            serve.delete(app, _blocking=True)
        deadline = time.monotonic() + 60.0
        while self.pid and psutil.pid_exists(self.pid) and time.monotonic() < deadline:
            time.sleep(0.2)  # the last replica's GPU memory and cores given back
        if launch.gpu_count() == 0:
            doc, _ = launch.cpu_fallback(doc)
        launch.deploy(doc)
        launch.wait_ready(base, self.ready_timeout_s)
        return base


def _window_target(base: str, report: dict[str, Any], body: bytes, ctype: str) -> Any:
    from functools import partial

    from serve_app import env
    from serve_app.plan import ingress
    from serve_app.plan.loop import Target
    from serve_app.startup import ray_compat

    name = report["application"]
    session = ray_compat.session_dir()  # None: no ingress read, and model_entry refuses
    key = next(iter(env.api_keys()), None)
    headers = {"content-type": ctype} | ({"authorization": f"Bearer {key}"} if key else {})
    return Target(
        url=base + report["route"],
        body=body,
        headers=headers,
        pid=int(report["pid"]),
        gpu_uuid=report.get("gpu_uuid") if report.get("gpu_mode") == "cuda" else None,
        busy_s=lambda: float(_replica(base, name)["batch_busy_s"]),
        ingress=partial(ingress.snapshot, session) if session else None,
    )


def measure_app(
    cluster: _Cluster,
    doc: dict[str, Any],
    name: str,
    args: AppArgs,
    targets: Targets,
    s: Settings,
    out: Path,
    port: int,
    log: Callable[[str], None],
) -> tuple[rd.MemoryFigures, list[rd.CandidateReading], dict[str, Any]]:
    """One application's memory figures, its candidates' windows, and its last report."""
    from serve_app.plan.loop import run_window

    on_gpu = cluster_gpus() > 0
    cap = batch_cap(args, on_gpu)
    body, ctype, items = request_for(args, targets.models[name])
    cache = out / "calibration"

    def config_at(batch_size: int, calibrate: bool) -> dict[str, Any]:
        return measure_config(
            doc, name, batch_size, share=s.share, port=port, calibrate=calibrate, cache_dir=cache
        )

    base = cluster.deploy(config_at(cap, True))
    first = _settled(base, name, cluster.pid, log)
    cluster.pid = int(first["pid"])
    probes: dict[int, int] = {}
    overhead_then = 0
    if on_gpu:
        match: dict[str, Any] = {"model_name": args.model_name, "adapter": args.adapter}
        match["dtype"] = args.dtype
        match |= {"cap_bytes": int(first["cap_bytes"]), "max_batch_size": cap}
        got = rd.calibration_probes(cache, match)
        if got is None:
            raise StartupError(f"{name}: no calibration entry in {cache} (memory.calibrate off?)")
        probes, overhead_then, _ = got
    measured = int(first["max_batch_size"])
    sizes = [b for b in candidate_batch_sizes(cap, s.candidates) if b <= measured]
    if on_gpu:
        sizes = [b for b in candidate_batch_sizes(measured, s.candidates) if b in probes]
    log(f"plan --measure: {name}: batch caps {sizes} ({items} items a request)")
    found: list[rd.CandidateReading] = []
    last, rss = first, 0
    for b in sorted(sizes, reverse=True):
        report = first
        if b != measured:
            base = cluster.deploy(config_at(b, False))
            report = _settled(base, name, cluster.pid, log)
        cluster.pid = int(report["pid"])
        t = _window_target(base, report, body, ctype)
        conc = saturation_concurrency(b, items)
        sat = run_window(t, conc, s.warmup_s, s.duration_s)
        idle = run_window(t, 1, min(1.0, s.warmup_s), s.idle_duration_s)
        found.append(rd.CandidateReading(b, sat, idle))
        log(
            f"plan --measure: {name} at batch {b}: {sat.throughput_rps:.1f} req/s with {conc} "
            f"in flight ({sat.errors} errors), p99 {sat.p99_s or 0:.4f} s; alone p99 "
            f"{idle.p99_s or 0:.4f} s; replica CPU {sat.replica_cpu_s / max(sat.requests, 1):.5f}"
            f" s/request, ingress CPU {sat.ingress_cpu_s / max(sat.requests, 1):.5f} s/request "
            f"{sat.ingress_processes_by_kind}; busiest of {sat.client_processes} client "
            f"processes at {sat.client_cpu_fraction:.2f} of a core"
        )
        if b == measured:  # the replica whose start-up calibrated, after its loads
            import psutil

            last = _replica(base, name)
            rss = int(psutil.Process(int(last["pid"])).memory_info().rss)
    if on_gpu:
        memory = rd.gpu_memory(first, last, probes, overhead_then)
        return rd.with_serving_peaks(memory, found), found, last
    return rd.cpu_memory(rss), found, last


def cluster_gpus() -> int:
    from serve_app.ops import launch

    return launch.gpu_count()


def gpu_spec(report: dict[str, Any]) -> dict[str, Any]:
    """``gpus[0]`` of the measurements: this host's GPU (by NVML), or its memory and cores."""
    import psutil

    from serve_app.gpu import nvml

    cores = len(os.sched_getaffinity(0))
    uuid = report.get("gpu_uuid") if report.get("gpu_mode") == "cuda" else None
    if uuid:
        count = cluster_gpus()
        total = nvml.value(nvml.device_memory(uuid))
        named = nvml.value(nvml.utilization_and_name(uuid))
        if total is None:
            raise StartupError(f"NVML cannot read GPU {uuid}'s memory")
        name = named[1] if named else uuid
        return {
            "name": name,
            "total_bytes": total.cuda_total_bytes,  # what a replica's share is taken of
            "cores": cores / count,
            "count": count,
        }
    host = int(psutil.virtual_memory().total)
    return {"name": "CPU (no GPU): host memory", "total_bytes": host, "cores": cores, "count": 1}


def measure(
    config: str, targets_path: str, out: str, s: Settings, log: Callable[[str], None] = print
) -> Path:
    """Measure every serve_app application of CONFIG; write OUT/measurements.json and
    OUT/readings.json (every window); the measurements' path. ConfigError before anything
    starts on a bad config or targets file; StartupError when a replica cannot be measured."""
    from serve_app.config.deploy import check_deploy_config, load_deploy_config
    from serve_app.ops import launch, ports

    doc = load_deploy_config(config)
    targets = load_targets(targets_path)
    errors = check_targets(doc, targets) + check_deploy_config(doc)
    mode, mode_errors = measured_mode(doc)
    errors += mode_errors
    if errors:
        raise ConfigError("cannot measure:\n  " + "\n  ".join(errors))
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    ports.private_haproxy_ports()
    # Beside a server or a test session: never their metrics port (launch pins one).
    os.environ[launch.METRICS_PORT_VAR] = str(ports.free_port())
    port = ports.free_port()
    cluster = _Cluster(s.ready_timeout_s)
    models: dict[str, Any] = {}
    raw: dict[str, Any] = {"settings": asdict(s), "models": {}}
    gpu: dict[str, Any] = {}
    try:
        for name, app in serve_app_apps(doc).items():
            args = parse_args(app.get("args"), prefix=f"{name}.args")
            memory, found, last = measure_app(
                cluster, doc, name, args, targets, s, folder, port, log
            )
            gpu = gpu or gpu_spec(last)
            opts = (app.get("deployments") or [{}])[0].get("ray_actor_options") or {}
            try:
                models[name] = rd.model_entry(
                    memory,
                    found,
                    targets.models[name],
                    float(opts.get("num_cpus", 1.0)),
                    last.get("gpu_mode") == "cuda",
                    provenance(gpu["name"]),
                )
            except ValueError as exc:
                raise StartupError(f"application {name}: {exc}") from None
            raw["models"][name] = {
                "memory": asdict(memory),
                "candidates": [asdict(c) for c in found],
                "report": last,
            }
    finally:
        (folder / "readings.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
        if cluster.started:
            launch.shutdown()
    notes = [
        f"Measured one replica at a time, alone on its GPU ({mode}); "
        f"each batch cap {s.duration_s:g} s at saturation after {s.warmup_s:g} s, and "
        f"{s.idle_duration_s:g} s one request at a time. Every window: readings.json."
    ]
    doc_out = rd.measurements_doc(
        models=models,
        gpu=gpu,
        margin_fraction=targets.margin_fraction,
        max_utilization=targets.max_utilization,
        reserve=targets.reserve.model_dump(),
        notes=notes,
        mode=mode,
    )
    path = folder / "measurements.json"
    path.write_text(json.dumps(doc_out, indent=1) + "\n")
    return path
