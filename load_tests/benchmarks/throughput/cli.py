"""The run in order: the in-process ceiling, the clients' own ceiling, then serve_app and the
plain Ray Serve no-op per replica count in one Ray session; throughput.json rewritten as rows
arrive, so a run cut short still leaves what it measured."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from load_tests.benchmarks.throughput import rows as rowlib
from load_tests.benchmarks.throughput.options import PROG, build_parser, format_cores, make_config
from load_tests.benchmarks.throughput.setups import (
    PEER_MODELS,
    PEERS,
    SETUP_OF_KIND,
    client_ceiling_est_s,
    plan_estimate,
)
from load_tests.benchmarks.throughput.workers import spawn, wait_worker, worker_main
from load_tests.harness.meta import machine_info, run_meta
from load_tests.harness.run import error_doc, log, write_json

SCHEMA_VERSION = 1


def plan_jobs(models: Sequence[str], replicas: Sequence[int], phases: Sequence[str]) -> list:
    """Replica counts in the order given; at each, every model, then the no-op, then the peers
    (MiniLM only), so that a run cut short by its time budget has every setup at the first
    counts."""
    jobs: list[dict[str, Any]] = []
    for n in replicas:
        if "serve" in phases:
            for m in models:
                jobs.append({"key": f"{m}/r{n}", "kind": "serve_app", "model": m, "replicas": n})
        if "noop" in phases:
            jobs.append({"key": f"noop/r{n}", "kind": "noop", "model": None, "replicas": n})
        for peer in PEERS:
            if peer in phases:
                for m in (m for m in models if m in PEER_MODELS):
                    key = f"{peer}-{m}/r{n}"
                    jobs.append({"key": key, "kind": peer, "model": m, "replicas": n})
    return jobs


def ceiling_phase(
    cfg: Mapping[str, Any], work: Path, out_dir: Path, deadline: float
) -> list[dict[str, Any]]:
    spec = {"cfg": dict(cfg)}
    worker = spawn("ceiling", spec, work, out_dir / "ceiling_worker.log")
    limit_s = 120.0 if cfg["device"] == "cpu" else 240.0
    res, rc = wait_worker(worker, min(deadline, time.time() + limit_s))
    cores = format_cores(cfg["server_cores"])
    out = [rowlib.ceiling_row(m, doc, cores) for m, doc in (res.get("models") or {}).items()]
    for m in cfg["models"]:
        if m not in (res.get("models") or {}):
            note = "; ".join(str(e.get("error")) for e in res.get("errors", [])) or f"exit {rc}"
            out.append(rowlib.new_row(setup="in_process", model=m, status="error", note=note))
    return out


def client_phase(cfg: Mapping[str, Any], work: Path, deadline: float) -> list[dict[str, Any]]:
    """wrk and the open-loop client against the static HAProxy no-op, per payload."""
    from load_tests.benchmarks.throughput.measure import Clients, measure_client_ceiling
    from load_tests.benchmarks.throughput.noop_server import NoopHAProxy
    from load_tests.benchmarks.throughput.proccpu import ServerCpu
    from load_tests.benchmarks.throughput.setups import client_payloads
    from load_tests.harness.openloop import OpenLoopPool
    from load_tests.harness.wrk import find_wrk

    payloads = client_payloads(cfg)
    common = {
        "setup": "client_ceiling",
        "server": "haproxy-static-noop",
        "server_cores": format_cores(cfg["server_cores"]),
        "client_cores": format_cores(cfg["client_cores"]),
        "mps": False,
    }
    out: list[dict[str, Any]] = []
    server = NoopHAProxy(cfg["server_cores"], payloads, work)
    pool = None
    try:
        pool = OpenLoopPool(
            cfg["client_cores"], cfg["openloop_procs"], work, cfg["max_send_lag_p99_ms"]
        )
        clients = Clients(find_wrk(cfg["wrk"]), pool, cfg, work, log)
        clients.server_cpu = ServerCpu([server.proc.pid])  # HAProxy's own CPU per request
        per_payload_s = client_ceiling_est_s(cfg)
        for p in payloads:
            c = dict(common, model=p.model, payload=p.key, inputs_per_request=p.inputs_per_request)
            c.update(workload=p.workload, tokens_per_request=p.tokens_per_request)
            c["response_bytes"] = len(p.response)
            if deadline - time.time() < per_payload_s:
                for client in ("wrk", "open-loop"):
                    out.append(rowlib.status_row(c, client, "skipped", "time budget"))
                continue
            log(f"client ceiling: {p.key} ({p.description}) against HAProxy's no-op")
            out += measure_client_ceiling(clients, server.url_for(p), p, c)
    finally:
        if pool is not None:
            pool.close()
        server.stop()
    return out


def serve_phase(
    cfg: Mapping[str, Any],
    work: Path,
    out_dir: Path,
    deadline: float,
    on_rows: Callable[[list], None],
) -> dict[str, Any]:
    """The jobs in one serve worker (a second one for the rest if the first dies early)."""
    planned = jobs = plan_jobs(cfg["models"], cfg["replicas"], cfg["phases"])
    done_rows: list[dict[str, Any]] = []
    info: dict[str, Any] = {"server_reports": {}, "errors": [], "notes": [], "workers": 0}
    while jobs and deadline - time.time() > 30.0 and info["workers"] < 2:
        info["workers"] += 1
        spec = {"cfg": dict(cfg), "jobs": jobs, "work_dir": str(work)}
        spec["deadline_unix"] = deadline - cfg["teardown_reserve_s"]
        worker = spawn("serve", spec, work, out_dir / "serve_worker.log")
        more = functools.partial(_more, on_rows, list(done_rows))
        res, rc = wait_worker(worker, deadline - 5.0, more)
        done_rows += res.get("rows", [])
        on_rows(done_rows)
        info["server_reports"].update(res.get("server_reports") or {})
        info["errors"] += res.get("errors", [])
        info["notes"] += res.get("notes", [])
        info.setdefault("ray_start_s", []).append(res.get("ray_start_s"))
        finished = set(res.get("jobs_done", []))
        touched = {_job_id_of_row(r) for r in done_rows}
        jobs = [j for j in jobs if j["key"] not in finished]
        started = [j for j in jobs if _job_id(j) in touched]
        if started or rc != 0:
            log(f"serve worker exit {rc}; jobs left: {[j['key'] for j in jobs]}")
        jobs = [j for j in jobs if _job_id(j) not in touched]
    done_rows += missing_rows(planned, cfg, done_rows)
    on_rows(done_rows)
    return info


def missing_rows(
    jobs: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], done: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """A ``skipped`` row for each planned (job, payload, client) that has no row: the time
    budget ran out, or the serve worker stopped, before it was reached."""
    from load_tests.benchmarks.throughput.setups import job_payloads

    have = {(*_job_id_of_row(r), r.get("payload"), r.get("client")) for r in done}
    out = []
    for j in jobs:
        for p in job_payloads(j, cfg):
            for client in ("wrk", "open-loop"):
                if (*_job_id(j), p.key, client) in have:
                    continue
                c = {"setup": _job_id(j)[0], "model": j["model"], "replicas": j["replicas"]}
                c.update(payload=p.key, inputs_per_request=p.inputs_per_request, mps=cfg["mps"])
                c.update(workload=p.workload, tokens_per_request=p.tokens_per_request)
                note = "not reached: time budget or the serve worker stopped"
                out.append(rowlib.status_row(c, client, "skipped", note))
    return out


def _more(on_rows: Callable[[list], None], done: list, result: Mapping[str, Any]) -> None:
    """Rows of the finished workers plus those the running one has written so far."""
    on_rows(list(done) + list(result.get("rows", [])))


def _job_id(job: Mapping[str, Any]) -> tuple[Any, ...]:
    return (SETUP_OF_KIND[job["kind"]], job["model"], job["replicas"])


def _job_id_of_row(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row.get("setup"), row.get("model"), row.get("replicas"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a._worker:
        return worker_main(a)
    cfg = make_config(a, parser)
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    json_path, meta_path = out / "throughput.json", out / "meta.json"

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    t_start = time.time()
    deadline = t_start + cfg["max_time_s"]
    previous = json.loads(json_path.read_text()) if cfg["merge"] and json_path.is_file() else []
    work = Path(tempfile.mkdtemp(prefix="throughput-"))
    from load_tests.harness.wrk import find_wrk

    wrk = find_wrk(cfg["wrk"])
    machine = machine_info()
    meta: dict[str, Any] = {
        **run_meta(PROG, argv, gpu=machine["gpu_name"]),
        "schema_version": SCHEMA_VERSION,
        "created_unix_s": t_start,
        "cores": {
            "server": format_cores(cfg["server_cores"]),
            "client": format_cores(cfg["client_cores"]),
            "usable": len(os.sched_getaffinity(0)),
        },
        "machine": machine,
        "wrk": wrk,
        "config": cfg,
        "timings": {},
        "notes": [] if wrk else [f"no wrk at {cfg['wrk']} or on PATH: wrk rows are skipped"],
        "errors": [],
        "flags": [],
    }
    parts: dict[str, list[dict[str, Any]]] = {"ceiling": [], "client": [], "serve": []}
    if cfg["shared_physical_cores"] and len(cfg["server_cores"]) > 1:
        pairs = ", ".join(f"{s}/{c}" for s, c in cfg["shared_physical_cores"][:8])
        note = f"server and client CPUs share physical cores (server/client: {pairs}...)"
        meta["notes"].append(note)
        log(f"WARNING: {note}: the client's load takes the server's cores")
    plan = plan_estimate(cfg, plan_jobs(cfg["models"], cfg["replicas"], cfg["phases"]))
    meta["plan"] = plan
    log(
        f"plan: {len(plan['jobs'])} jobs ({', '.join(j['key'] for j in plan['jobs'])}); about "
        f"{plan['total_s']} s in all for a budget of {cfg['max_time_s']:.0f} s, so about "
        f"{plan['jobs_fitting']} jobs fit; the rest will be skipped and noted"
    )

    def save() -> None:
        rows = rowlib.merge_rows(previous, [r for p in parts.values() for r in p])
        meta["flags"] = rowlib.apply_ceilings(rows) + rowlib.openloop_ceiling_flags(
            rows, len(cfg["client_cores"])
        )
        meta["client_headroom_ok"] = not meta["flags"]
        meta["timings"]["total_s"] = round(time.time() - t_start, 1)
        write_json(json_path, rows)
        write_json(meta_path, meta)

    def phase(name: str, fn: Callable[[], list[dict[str, Any]]]) -> None:
        t = time.time()
        log(f"phase {name} ({deadline - t:.0f} s left of the budget)")
        try:
            parts[name] = fn()
        except Exception as exc:  # noqa: BLE001 - recorded; the next phase still runs
            meta["errors"].append({"phase": name, **error_doc(exc)})
            log(f"phase {name} FAILED: {exc!r}")
        meta["timings"][f"{name}_s"] = round(time.time() - t, 1)
        save()

    save()
    try:
        if "ceiling" in cfg["phases"]:
            phase("ceiling", lambda: ceiling_phase(cfg, work, out, deadline - 60.0))
        if "client" in cfg["phases"]:
            phase("client", lambda: client_phase(cfg, work, deadline - 60.0))
        if {"serve", "noop", *PEERS} & set(cfg["phases"]):

            def on_rows(r: list[dict[str, Any]]) -> None:
                parts["serve"] = r
                save()

            def serve() -> list[dict[str, Any]]:
                info = serve_phase(cfg, work, out, deadline, on_rows)
                write_json(out / "server_reports.json", info.pop("server_reports"))
                meta["serve"] = info
                return parts["serve"]

            phase("serve", serve)
    finally:
        save()
        shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {json_path} and {meta_path} in {time.time() - t_start:.0f} s")
    from load_tests.benchmarks.throughput.render import render_markdown

    print(render_markdown(json.loads(json_path.read_text()), meta), flush=True)
    return 0
