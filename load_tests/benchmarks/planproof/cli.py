"""The phases of the proof (see the package's docstring): plan, deploy the plan, load every
route at once at its planned rate, then the naive config under the same loads, the NVML watch
throughout each, the verdict, the JSON."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from load_tests.benchmarks.planproof.proof import (
    goodput_per_s,
    keep_applications,
    model_row,
    naive_config,
    stage_times,
    tail_by_second,
    targets_from_measurements,
    verdict,
)
from load_tests.benchmarks.stack.cli import replicas_summary
from load_tests.benchmarks.stack.plan import (
    KNOWN_ROUTES,
    Family,
    Request,
    families,
    quick_config,
    request_for,
    with_port,
)
from load_tests.benchmarks.throughput.options import parse_cores
from load_tests.harness.meta import PROVENANCE_HELP, ROOT, run_meta
from load_tests.harness.nvml import BudgetWatch, nvml_devices
from load_tests.harness.run import error_doc, log, write_json

PROG = "python -m load_tests.benchmarks.planproof"
DEFAULT_CONFIG = ROOT / "configs" / "rag-stack.yaml"
DEFAULT_MEASUREMENTS = ROOT / "examples" / "planning" / "rag-stack-measurements.json"
QUICK_MEASUREMENTS = Path(__file__).resolve().parent / "cpu-measurements.json"
RESULT = "planproof.json"
REPLAN_START_S = 5.0  # --from-running's start-up (imports) before its first read
RATE_PER_CLIENT_PROC = 1000.0  # req/s one open-loop process is given (it sends a few thousand)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Issue 27's proof: plan CONFIG from the measurements (serve_app.plan), "
        "deploy the plan, offer each model its planned rate (open loop, Poisson, all routes at "
        "once), then the naive config (equal shares) under the same loads; NVML's per-process "
        "bytes judged against each replica's budget throughout. Writes OUT/planproof.json.",
        epilog=PROVENANCE_HELP,
    )
    p.add_argument("--out", required=True, type=Path, help="folder for planproof.json, plans")
    p.add_argument("--config", type=Path, default=None, help="default configs/rag-stack.yaml")
    p.add_argument(
        "--measurements",
        type=Path,
        default=None,
        help="default examples/planning/rag-stack-measurements.json (--quick: the CPU file "
        "beside this module)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a CPU dry run in about a minute: the config rewritten for the CPU, the models of "
        "the CPU measurements file, short loads (checks the tool, proves nothing)",
    )
    p.add_argument("--duration-s", type=float, default=None, help="each load (default 30)")
    p.add_argument("--warmup-s", type=float, default=None, help="before each window (5)")
    p.add_argument("--items-per-request", type=int, default=None, help="texts a request (16)")
    p.add_argument("--client-cores", default="", help="the open-loop client's cores, e.g. 8-15")
    p.add_argument(
        "--server-cores",
        default="",
        help="the cores Ray and every replica are pinned to (default: the others, when "
        "--client-cores is given, and the client's are the others when only this is given); "
        "the plan is made for these cores",
    )
    p.add_argument(
        "--reserve-cores",
        type=float,
        default=None,
        help="the plan's reserve on the server's cores (Ray's daemons, the OS); default: the "
        "measurements file's",
    )
    p.add_argument(
        "--max-utilization",
        type=float,
        default=None,
        help="plan each replica at most this fraction of its measured saturation rate; "
        "default: the measurements file's",
    )
    p.add_argument(
        "--phases",
        default="plan,naive",
        choices=["plan,naive", "plan"],
        help="plan alone: deploy and load the plan, no naive config and no verdict",
    )
    p.add_argument(
        "--replan-window-s",
        type=float,
        default=None,
        help="also run serve-app plan --from-running against the deployed plan under its load, "
        "reading this many seconds (inside --duration-s); writes OUT/replan",
    )
    p.add_argument("--ready-timeout-s", type=float, default=300.0)
    return p


def settings(a: argparse.Namespace) -> dict[str, Any]:
    quick = bool(a.quick)
    pick = lambda v, full, small: v if v is not None else (small if quick else full)  # noqa: E731
    mine = sorted(os.sched_getaffinity(0))
    given_client = parse_cores(a.client_cores) if a.client_cores else None
    given_server = parse_cores(a.server_cores) if a.server_cores else None
    # One side given: the other is the rest of this process's cores. Neither: not pinned.
    others = lambda side: [c for c in mine if c not in side]  # noqa: E731
    cores = given_client or (others(given_server) if given_server else mine)
    server = given_server or (others(given_client) if given_client else [])
    if server and set(server) & set(cores):
        raise SystemExit(
            f"--server-cores and --client-cores share {sorted(set(server) & set(cores))}"
        )
    if (given_client or given_server) and not (server and cores):
        raise SystemExit("--client-cores and --server-cores must each leave the other a core")
    duration_s = pick(a.duration_s, 30.0, 3.0)
    if a.replan_window_s is not None and not 0 < a.replan_window_s <= duration_s - REPLAN_START_S:
        raise SystemExit(
            f"--replan-window-s {a.replan_window_s:g} must be above 0 and leave "
            f"{REPLAN_START_S:g} s of --duration-s ({duration_s:g}) for the command to start"
        )
    return {
        "quick": quick,
        "config": str(a.config or DEFAULT_CONFIG),
        "measurements": str(
            a.measurements or (QUICK_MEASUREMENTS if quick else DEFAULT_MEASUREMENTS)
        ),
        "duration_s": duration_s,
        "replan_window_s": a.replan_window_s,
        "warmup_s": pick(a.warmup_s, 5.0, 1.0),
        # The example measurements' MiniLM throughput is at 16 short texts a request.
        "items_per_request": pick(a.items_per_request, 16, 4),
        "image_size": 64 if quick else 224,
        "client_cores": cores,
        "server_cores": server,  # empty: not pinned (the CPU dry run)
        "reserve_cores": a.reserve_cores,
        "max_utilization": a.max_utilization,
        "phases": a.phases.split(","),
        "request_timeout_s": 10.0,
        "ready_timeout_s": a.ready_timeout_s,
        # Until the replicas' deferred graph captures and warm-up batches are done.
        "settle_timeout_s": 60.0,
        "rate_per_client_proc": RATE_PER_CLIENT_PROC,
    }


def client_cores_for(rates: Mapping[str, float], cores: Sequence[int]) -> dict[str, list[int]]:
    """Each model's open-loop processes (one per RATE_PER_CLIENT_PROC req/s, at least one),
    as the cores they are pinned to, dealt round-robin over ``cores``."""
    out, k = {}, 0
    for name, rate in rates.items():
        n = max(1, math.ceil(rate / RATE_PER_CLIENT_PROC))
        out[name] = [cores[(k + i) % len(cores)] for i in range(n)]
        k += n
    return out


def spare_cores(client: Sequence[int], taken: Mapping[str, Sequence[int]]) -> list[int]:
    """The cores this process works on while the loads run (its NVML watch, the re-plan, the
    scrapes), off the server's: the client's cores no open loop is pinned to, else all of the
    client's."""
    used = {c for cores in taken.values() for c in cores}
    return [c for c in client if c not in used] or list(client)


def plan_config(cfg: Mapping[str, Any], out: Path, port: int) -> tuple[Path, list[str]]:
    """The config that is planned, written to OUT/config.yaml: CONFIG with this run's port, on
    ``--quick`` rewritten for the CPU (stack's quick_config) and cut to the measured models."""
    from serve_app import adapters
    from serve_app.config.deploy import load_deploy_config
    from serve_app.plan.measurements import load_measurements

    source = load_deploy_config(cfg["config"])
    notes: list[str] = []
    if cfg["quick"]:
        doc, notes = quick_config(source, list(adapters.FAMILIES), port)
        names = list(load_measurements(cfg["measurements"]).models)
        doc, left = keep_applications(doc, names)
        notes += left
    else:
        doc = with_port(source, port)
    path = out / "config.yaml"
    path.write_text(f"# {cfg['config']} as this proof plans it\n" + yaml.safe_dump(doc))
    return path, notes


def server_measurements(cfg: Mapping[str, Any], out: Path) -> tuple[Path, list[str]]:
    """The measurements the plan is made from, OUT/measurements.json: the file given, with its
    GPU's cores set to the server's pinned cores and, with --reserve-cores, that reserve."""
    doc = json.loads(Path(cfg["measurements"]).read_text())
    notes = []
    if cfg["server_cores"]:
        stated = [g.get("cores") for g in doc["gpus"]]
        for g in doc["gpus"]:
            g["cores"] = float(len(cfg["server_cores"]))
        notes.append(
            f"planned for the server's {len(cfg['server_cores'])} pinned cores "
            f"{cfg['server_cores']} (the measurements file stated {stated}); the client has "
            f"{len(cfg['client_cores'])} others {cfg['client_cores']}"
        )
    if cfg["reserve_cores"] is not None:
        old = (doc.get("reserve") or {}).get("cores", 0.0)
        doc.setdefault("reserve", {})["cores"] = float(cfg["reserve_cores"])
        notes.append(f"the plan's reserve: {cfg['reserve_cores']:g} cores (the file stated {old})")
    if cfg["max_utilization"] is not None:
        old = doc.get("max_utilization")
        doc["max_utilization"] = float(cfg["max_utilization"])
        notes.append(f"max_utilization {cfg['max_utilization']:g} (the file stated {old})")
    path = out / "measurements.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path, notes


def deploy_phase(name: str, doc: dict[str, Any], first: bool, cfg: Mapping[str, Any]) -> str:
    """Deploy ``doc`` the way ``serve-app run`` does (derive.for_run, then launch.run; later
    phases into the same Ray: the previous applications deleted, their GPU memory seen freed);
    the base URL once every application is ready."""
    from serve_app.ops import launch
    from serve_app.plan.derive import for_run

    doc, notes = for_run(doc)
    for note in notes:
        log(f"planproof: {name}: {note}")
    if first:
        return launch.run(doc, haproxy=True, ready_timeout_s=cfg["ready_timeout_s"]).url
    from ray import serve

    from load_tests.harness.nvml import nvml_process_pids

    pids = {int(r["pid"]) for r in replicas_summary(_base(doc)) if r.get("pid") is not None}
    for app in list(serve.status().applications):
        serve.delete(app, _blocking=True)
    deadline = time.monotonic() + 60.0
    while pids and time.monotonic() < deadline:
        seen = nvml_process_pids()
        if seen is None or not (seen & pids):
            break
        time.sleep(0.5)
    from serve_app.config.deploy import check_deploy_config
    from serve_app.errors import ConfigError

    errors = check_deploy_config(doc, gpus=max(1, launch.gpu_count()))  # as launch.run checks
    if errors:
        raise ConfigError(f"the {name} config:\n  " + "\n  ".join(errors))
    if launch.gpu_count() == 0:
        doc, _ = launch.cpu_fallback(doc)
    launch.deploy(doc)
    launch.wait_ready(_base(doc), cfg["ready_timeout_s"])
    return _base(doc)


def _base(doc: Mapping[str, Any]) -> str:
    opts = doc.get("http_options") or {}
    return f"http://{opts.get('host', '127.0.0.1')}:{opts['port']}"


METRICS_REFRESH_S = 6.0


def scrape_metrics() -> str:
    """Ray's metrics endpoint's serve_app lines (the port launch pinned); empty when
    unreachable (the phase's rows stand without the stage split)."""
    import httpx

    from serve_app.ops import launch

    try:
        text = httpx.get(f"http://127.0.0.1:{launch.metrics_port()}/metrics", timeout=10.0).text
    except httpx.HTTPError as exc:
        log(f"planproof: metrics not read: {exc}")
        return ""
    return "\n".join(x for x in text.splitlines() if "serve_app_" in x) + "\n"


def read_threads(base: str) -> tuple[dict[str, Any], dict[Any, dict[int, float]], float] | None:
    """The server's memory report, its replicas' threads' CPU seconds (those on this host) and
    when they were read; None when the report cannot be read."""
    from serve_app.errors import ServeAppError
    from serve_app.plan.fromrunning import read_server
    from serve_app.plan.hostprocs import thread_seconds

    try:
        doc = read_server(base)
    except ServeAppError:
        return None
    return doc, thread_seconds(list(doc.get("replicas") or [])), time.monotonic()


def wait_settled(base: str, timeout_s: float) -> dict[str, Any]:
    """Until no replica has start-up work left for between batches (plan.readings.startup_left),
    at most ``timeout_s``; what was waited for, and what was left when the wait ended."""
    from serve_app.errors import ServeAppError
    from serve_app.plan.fromrunning import read_server
    from serve_app.plan.readings import startup_left

    t0, left = time.monotonic(), ["the memory report not read yet"]
    while time.monotonic() - t0 < timeout_s:
        try:
            left = startup_left(read_server(base).get("replicas") or [])
        except ServeAppError as exc:
            left = [f"the memory report: {exc}"]
        if not left:
            break
        time.sleep(0.5)
    return {"waited_s": round(time.monotonic() - t0, 1), "left": left}


def thread_figures(
    before: tuple[dict[str, Any], dict[Any, dict[int, float]], float] | None,
    after: tuple[dict[str, Any], dict[Any, dict[int, float]], float] | None,
    apps: Sequence[str],
) -> dict[str, dict[str, Any]]:
    """Per application over the load: the model threads' busy fraction (their reports) and
    the mean of each replica process's busiest thread's CPU fraction, with that thread's name:
    which one saturates first (serve_app.plan.live.bound_busy_s)."""
    from serve_app.plan import live
    from serve_app.plan.hostprocs import Threads

    if before is None or after is None:
        return {}
    threads = Threads(before[1], after[1], after[2] - before[2])
    reps0, reps1 = live.by_application(before[0]), live.by_application(after[0])
    out: dict[str, dict[str, Any]] = {}
    for app in apps:
        w = live.app_window(app, reps0.get(app, []), reps1.get(app, []))
        busiest = threads.busiest(list(w.items_by_replica))
        out[app] = {
            "model_busy_fraction": round(live.busy_fraction(w), 3),
            "busiest_thread_fraction": round(busiest[0], 3) if busiest else None,
            "busiest_thread_name": busiest[1] if busiest else None,
            "window_s": round(threads.window_s, 2),
        }
    return out


def load_phase(
    name: str,
    base: str,
    fams: Sequence[Family],
    reqs: Mapping[str, Request],
    plan_models: Mapping[str, Mapping[str, Any]],
    pools: Mapping[str, Any],
    cfg: Mapping[str, Any],
    out: Path,
    replan: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Every route at once at its planned rate for warmup_s + duration_s, NVML watched; the
    rows by model, the watch and the replicas. With ``replan`` (config, targets, out),
    ``serve-app plan --from-running`` reads the server inside the load window."""
    from load_tests.bench import PreparedRequest
    from load_tests.harness.cluster import wait_answer

    for f in fams:  # a first answer on each route (HAProxy reloads after a deploy)
        r = reqs[f.application]
        ct = {"content-type": r.content_type}
        wait_answer(PreparedRequest("POST", f"{base}{f.route}", ct, r.body), 120.0)
    settled = wait_settled(base, cfg["settle_timeout_s"])
    log(
        f"planproof: {name}: start-up work between batches done after {settled['waited_s']} s"
        if not settled["left"]
        else f"planproof: {name}: after {settled['waited_s']} s, start-up work still left: "
        + "; ".join(settled["left"])
    )
    before = scrape_metrics()
    threads_before = read_threads(base)
    watch = BudgetWatch(f"{base}/v1/memory", interval_s=0.1).start()
    summaries: dict[str, dict[str, Any]] = {}
    goodput: dict[str, float | None] = {}
    tails: dict[str, dict[str, list[Any]]] = {}
    forgiven: dict[str, float] = {}
    try:
        for f in fams:
            m, r = plan_models[f.application], reqs[f.application]
            rate = float(m["predicted_throughput_rps"])
            body = out / f"body-{f.application}.bin"
            body.write_bytes(r.body)
            pools[f.application].submit(
                f"{base}{f.route}",
                {"content-type": r.content_type},
                body,
                rate_per_s=rate,
                duration_s=cfg["duration_s"],
                warmup_s=cfg["warmup_s"],
                connections=max(8, min(1024, math.ceil(rate * m["p99_target_s"] * 2))),
                seed=sum(map(ord, f.application)),
                timeout_s=cfg["request_timeout_s"],
            )
        log(
            f"planproof: {name}: {len(fams)} routes at once for "
            f"{cfg['warmup_s']:g} + {cfg['duration_s']:g} s"
        )
        replanning = None
        if replan is not None:
            time.sleep(cfg["warmup_s"])  # the loads run in their own processes meanwhile
            replanning = start_replan(base, replan, cfg["replan_window_s"])
        for f in fams:
            pool = pools[f.application]
            try:
                summaries[f.application] = pool.collect()
                window = (
                    pool.last_arrays,
                    float(plan_models[f.application]["p99_target_s"]),
                    cfg["warmup_s"],
                    summaries[f.application]["duration_s"],
                )
                goodput[f.application] = goodput_per_s(*window)
                forgiven[f.application] = goodput_per_s(*window, forgive_lag=True)
                tails[f.application] = tail_by_second(*window)
            except Exception as exc:  # noqa: BLE001 - the row says so; the others stand
                summaries[f.application] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
                goodput[f.application] = None
    finally:
        budget = watch.stop()
    replanned = finish_replan(replanning, replan) if replanning is not None and replan else None
    threads = thread_figures(threads_before, read_threads(base), [f.application for f in fams])
    for app, fig in threads.items():
        log(f"planproof: {name}: {app}: threads {fig}")
    # Ray refreshes its endpoint every few seconds; the dry run only checks the path works.
    time.sleep(1.0 if cfg["quick"] else METRICS_REFRESH_S)
    after = scrape_metrics()
    (out / f"metrics-{name}.txt").write_text(after)
    stages = stage_times(before, after, [f.application for f in fams])
    for app, figures in stages.items():
        log(
            f"planproof: {name}: {app}: by stage (mean / p99 ms) "
            + ", ".join(
                f"{k} {v['mean_s'] * 1e3:.1f} / {(v['p99_s'] or 0) * 1e3:.0f}"
                for k, v in figures.items()
            )
        )
    if not nvml_devices():
        budget["note"] = "no NVML (CPU run): nothing judged"
    rows = [
        model_row(
            f.application,
            f.route,
            float(plan_models[f.application]["predicted_throughput_rps"]),
            float(plan_models[f.application]["p99_target_s"]),
            summaries.get(f.application),
            goodput.get(f.application),
            forgiven.get(f.application),
        )
        for f in fams
    ]
    for row in rows:
        tail = tails.get(row["application"])
        if tail is not None:
            row["tail_by_second"] = tail
        log(
            f"planproof: {name}: {row['application']}: offered {row['offered_rps'] or 0:.1f}, "
            f"answered {row['answered_rps'] or 0:.1f} req/s (predicted "
            f"{row['predicted_rps']:.1f}), p99 {row['p99_ms'] or 0:.1f} ms (target "
            f"{row['p99_target_ms']:g}), errors {row['errors']}, goodput "
            f"{row['goodput_rps'] or 0:.1f}/s"
            + (f"; over target by second {tail['over_target']}" if tail else "")
        )
    return {
        "base_url": base,
        "settled": settled,
        "models": rows,
        "budget_watch": budget,
        "stages": stages,
        "threads": threads,
        "replicas": replicas_summary(base),
        **({"replan": replanned} if replanned is not None else {}),
    }


def start_replan(base: str, replan: Mapping[str, str], window_s: float) -> subprocess.Popen[str]:
    """``serve-app plan --from-running`` against ``base``, in a process of its own, with Ray's
    metrics (the port launch pinned)."""
    from serve_app.ops import launch

    metrics = f"http://127.0.0.1:{os.environ[launch.METRICS_PORT_VAR]}/metrics"
    cmd = [sys.executable, "-m", "serve_app", "plan", replan["config"], "--from-running", base]
    cmd += ["--targets", replan["targets"], "--out", replan["out"], "--window-s", f"{window_s:g}"]
    cmd += ["--metrics", metrics]
    log(f"planproof: replan: {' '.join(cmd[1:])}")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish_replan(proc: subprocess.Popen[str], replan: Mapping[str, str]) -> dict[str, Any]:
    """The replan's exit code, its output's end and its changes.md."""
    try:
        output, _ = proc.communicate(timeout=120.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    changes = Path(replan["out"]) / "changes.md"
    doc = {
        "command": [str(c) for c in proc.args][1:] if isinstance(proc.args, list) else [],
        "rc": proc.returncode,
        "output_tail": output[-3000:],
        "changes_md": changes.read_text()[:8000] if changes.is_file() else None,
    }
    wrote = "written" if doc["changes_md"] else "absent"
    log(f"planproof: replan rc {proc.returncode}; changes.md {wrote}")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    cfg = settings(a)
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    from serve_app import adapters
    from serve_app.ops import launch, ports
    from serve_app.plan.measurements import load_measurements
    from serve_app.plan.write import write_plan

    ports.private_haproxy_ports()
    # Beside a server or a test session: never their metrics port (launch pins one).
    os.environ[launch.METRICS_PORT_VAR] = str(ports.free_port())
    gpus = nvml_devices()
    path = out / RESULT
    result: dict[str, Any] = {
        "schema_version": 1,
        "title": "issue 27: the plan deployed and measured, against equal shares",
        "status": "running",
        "meta": run_meta(PROG, argv, gpu=gpus[0]["name"] if gpus else None),
        "device": "cuda" if gpus else "cpu",
        "settings": cfg,
        "notes": [],
    }
    write_json(path, result)
    pools: dict[str, Any] = {}
    try:
        config_path, notes = plan_config(cfg, out, ports.free_port())
        result["notes"] += notes
        measurements, notes = server_measurements(cfg, out)
        result["notes"] += notes
        printed = write_plan(str(config_path), str(measurements), str(out / "plan"))
        plan_doc = json.loads((out / "plan" / "plan.json").read_text())
        planned = yaml.safe_load((out / "plan" / "serve_config.yaml").read_text())
        m = load_measurements(measurements)
        num_cpus = {name: spec.num_cpus for name, spec in m.models.items()}
        naive, naive_notes = naive_config(planned, plan_doc, num_cpus)
        (out / "naive").mkdir(exist_ok=True)
        (out / "naive" / "serve_config.yaml").write_text(yaml.safe_dump(naive, sort_keys=False))
        result["notes"] += naive_notes
        plan_models = {p["application"]: p for p in plan_doc["models"]}
        replan = None
        if cfg["replan_window_s"] is not None:
            targets = out / "replan-targets.yaml"
            asks = targets_from_measurements(json.loads(measurements.read_text()))
            targets.write_text(yaml.safe_dump(asks, sort_keys=False))
            replan = {"config": str(config_path), "targets": str(targets)}
            replan["out"] = str(out / "replan")
        served = {k: adapters.ROUTES.get(k, KNOWN_ROUTES.get(k, "")) for k in adapters.FAMILIES}
        fams = [f for f in families(planned, served) if f.application in plan_models]
        reqs = {
            f.application: request_for(f, cfg["items_per_request"], cfg["image_size"]) for f in fams
        }
        result["plan"] = {"printed": printed, "plan": plan_doc, "serve_config": planned}
        result["naive"] = {"serve_config": naive}
        result["requests"] = {
            k: {"items": r.items, "content_type": r.content_type, "body_bytes": len(r.body)}
            for k, r in reqs.items()
        }
        rates = {
            f.application: float(plan_models[f.application]["predicted_throughput_rps"])
            for f in fams
        }
        from load_tests.harness.openloop import OpenLoopPool

        cores = client_cores_for(rates, cfg["client_cores"])
        result["client"] = {"cores_by_model": cores}
        for name, its in cores.items():
            work = out / "work" / name
            work.mkdir(parents=True, exist_ok=True)
            pools[name] = OpenLoopPool(its, None, work)
        driver = spare_cores(cfg["client_cores"], cores)
        result["client"]["driver_cores"] = driver
        write_json(path, result)
        phases: dict[str, Any] = {}
        for phase, doc in (("plan", planned), ("naive", naive)):
            if phase not in cfg["phases"]:
                continue
            log(f"planproof: deploying the {phase} config")
            t0 = time.time()
            if cfg["server_cores"]:  # Ray, started here, and every replica inherit it
                os.sched_setaffinity(0, cfg["server_cores"])
            base = deploy_phase(phase, doc, phase == "plan", cfg)
            if cfg["server_cores"] and driver:  # the watch, the re-plan: the client's side
                os.sched_setaffinity(0, driver)
            deploy_s = round(time.time() - t0, 1)
            log(f"planproof: {phase}: serving at {base} after {deploy_s} s")
            phases[phase] = {
                "deploy_s": deploy_s,
                **load_phase(
                    phase,
                    base,
                    fams,
                    reqs,
                    plan_models,
                    pools,
                    cfg,
                    out,
                    replan if phase == "plan" else None,
                ),
            }
            result["phases"] = phases
            write_json(path, result)
        if "naive" in cfg["phases"]:
            result["verdict"] = verdict(
                phases["plan"]["models"],
                phases["naive"]["models"],
                phases["plan"]["budget_watch"],
                phases["naive"]["budget_watch"],
                on_gpu=bool(gpus),
            )
            log(f"planproof: verdict {result['verdict']}")
        else:
            result["notes"].append("--phases plan: no naive config deployed, so no verdict")
        result["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - the JSON says what failed, then the exit code
        result.update(status="error", **error_doc(exc))
        log(f"planproof: failed: {result['error']}")
    finally:
        for pool in pools.values():
            pool.close()
        result["finished_at_unix_s"] = time.time()
        write_json(path, result)
        launch.shutdown()
    log(f"planproof: wrote {path}")
    return 0 if result["status"] == "ok" else 1
