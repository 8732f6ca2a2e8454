"""The serve worker: one Ray session on the server cores, started as ``serve-app run`` starts it
(serve_app.ops.launch: start_ray, deploy, wait_ready), with each job's application deployed in turn
into it (the previous one deleted first, and its GPU memory seen released) and measured.

Pinning: this process sets its affinity to the server cores before ray.init, so every Ray
process, Serve's HAProxy and every replica inherits it; wrk and the open-loop workers are
pinned to the client cores. NVML is sampled every 0.1 s during each job (GPU runs), and each
replica's samples are judged against its ``budget_bytes`` from ``GET /v1/memory``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from load_tests.benchmarks.throughput import rows, stats
from load_tests.benchmarks.throughput.measure import Clients, measure_served
from load_tests.benchmarks.throughput.options import format_cores
from load_tests.benchmarks.throughput.payload import Payload
from load_tests.benchmarks.throughput.proccpu import ServerCpu
from load_tests.benchmarks.throughput.setups import (
    DEPLOY_EST_S,
    SETUP_OF_KIND,
    gpu_share,
    job_payloads,
    measure_est_s,
    noop_doc,
    ray_serve_batch_doc,
    serve_app_doc,
)
from load_tests.harness.meta import ROOT
from load_tests.harness.nvml import budget_violations
from load_tests.harness.run import error_doc, log, write_json


def _wait_running(name: str, timeout_s: float) -> None:
    from ray import serve

    deadline = time.monotonic() + timeout_s
    status = "?"
    while time.monotonic() < deadline:
        app = serve.status().applications.get(name)
        status = str(app.status) if app is not None else "absent"
        if status.endswith("RUNNING"):
            return
        if "FAILED" in status:
            raise RuntimeError(f"{name}: {status}: {app.message if app else ''}"[:3000])
        time.sleep(0.5)
    raise TimeoutError(f"{name} not RUNNING after {timeout_s:.0f} s (last status {status})")


def _budgets(base_url: str) -> dict[int, int]:
    """Each replica's ``budget_bytes`` by pid from ``GET /v1/memory`` ({} when unreadable)."""
    import httpx

    try:
        reps = httpx.get(f"{base_url}/v1/memory", timeout=10.0).json().get("replicas", [])
        return {int(r["pid"]): int(r["budget_bytes"]) for r in reps if r.get("budget_bytes")}
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log(f"GET {base_url}/v1/memory failed: {exc!r}")
        return {}


def _delete(name: str, pids: set[int], cuda: bool) -> None:
    """Delete the application, then wait (up to 30 s) until NVML no longer lists its replicas'
    processes, so that the next replicas' start-up check sees the memory free."""
    from ray import serve

    from load_tests.harness.nvml import nvml_process_pids

    serve.delete(name, _blocking=True)
    deadline = time.monotonic() + 30.0
    while cuda and pids and time.monotonic() < deadline:
        seen = nvml_process_pids()
        if seen is None or not (seen & pids):
            return
        time.sleep(0.5)


def run_job(
    job: Mapping[str, Any], ctx: dict[str, Any], clients: Clients, result: dict[str, Any]
) -> None:
    """Deploy ``job``'s application (deleting the previous one), then measure each payload;
    rows go to ``result["rows"]`` as they are made."""
    from load_tests.benchmarks.throughput import litserve_app
    from load_tests.benchmarks.throughput.peer_process import LitServeProcess
    from load_tests.harness.cluster import server_memory, wait_answer, wait_one_haproxy
    from load_tests.harness.nvml import MemorySampler
    from serve_app.config.deploy import check_deploy_config
    from serve_app.ops import launch

    cfg, cuda = ctx["cfg"], ctx["cuda"]
    kind, replicas = job["kind"], job["replicas"]
    payloads = job_payloads(job, cfg)
    on_gpu = kind in ("serve_app", "ray_serve_batch") and cuda
    base_row = {
        "setup": SETUP_OF_KIND[kind],
        "model": job.get("model"),
        "replicas": replicas,
        "num_gpus": gpu_share(replicas, cfg) if on_gpu else None,
        "num_cpus": stats.replica_cpus(replicas, len(cfg["server_cores"])),
        "mps": ctx["mps"],
        "server_cores": format_cores(cfg["server_cores"]),
        "client_cores": format_cores(cfg["client_cores"]),
    }
    if kind == "serve_app" and cfg.get("serve_app_layers") is not None:
        base_row["encoder_layers"] = cfg["serve_app_layers"]  # not the full model: see options
    if kind in ("ray_serve_batch", "litserve"):
        base_row["peer_settings"] = peer_settings(kind, replicas, cfg)
        if kind == "litserve":  # its workers share one device; Ray's CPU share does not apply
            base_row["num_cpus"] = None

    def common(p: Payload) -> dict[str, Any]:
        return dict(
            base_row,
            payload=p.key,
            inputs_per_request=p.inputs_per_request,
            payload_description=p.description,
            workload=p.workload,
            tokens_per_request=p.tokens_per_request,
        )

    def skip_rest(ps: list[Payload], status: str, note: str) -> None:
        for p in ps:
            for client in ("wrk", "open-loop"):
                result["rows"].append(rows.status_row(common(p), client, status, note))

    if kind == "litserve" and not litserve_app.available():
        skip_rest(payloads, "skipped", f"litserve is not installed: {litserve_app.INSTALL_HINT}")
        return
    left = ctx["deadline"] - time.time()
    if left < DEPLOY_EST_S[kind][0 if cuda else 1] + measure_est_s(cfg):
        skip_rest(payloads, "skipped", f"time budget: {left:.0f} s left")
        return
    port, base = ctx["port"], f"http://127.0.0.1:{ctx['port']}"
    t0 = time.time()
    litserve = None
    ray_cpu = clients.server_cpu
    try:
        if ctx.get("app"):
            _delete(ctx["app"], ctx.get("pids", set()), cuda)
            ctx["app"] = None
        timeout_s = min(cfg["deploy_timeout_s"], max(10.0, ctx["deadline"] - time.time()))
        if kind == "litserve":
            name = f"litserve-r{replicas}"
            log(f"{name}: starting LitServe with {replicas} workers")
            litserve = LitServeProcess(replicas, cfg, ctx["scratch"])
            # LitServe's rows count its own processes: the idle Ray cluster beside it is not its.
            clients.server_cpu = ServerCpu([litserve.proc.pid], litserve_roots=[litserve.proc.pid])
            base = litserve.base_url
            litserve.wait_healthy(timeout_s)
        else:
            if kind == "serve_app":
                doc = serve_app_doc(job["model"], replicas, cfg, port)
            elif kind == "ray_serve_batch":
                doc = ray_serve_batch_doc(replicas, cfg, port)
            else:
                doc = noop_doc(replicas, cfg, port)
            if not cuda:
                doc, _ = launch.cpu_fallback(doc)
            name = doc["applications"][0]["name"]
            errors = check_deploy_config(doc) if kind == "serve_app" else []
            if errors:
                raise ValueError("invalid config: " + "; ".join(errors))
            log(f"{name}: deploying {replicas} replicas")
            ctx["app"] = name  # deleted before the next job even if this deploy fails part-way
            launch.deploy(doc)
            if kind == "serve_app":
                launch.wait_ready(base, timeout_s)
            else:
                _wait_running(name, timeout_s)
        first = payloads[0]
        from load_tests.bench import PreparedRequest

        probe = PreparedRequest("POST", base + first.path, first.headers, first.body)
        wait_answer(probe, 60.0)
        if kind != "litserve":
            # A reload's old HAProxy still draining would exit inside the first CPU window,
            # and its CPU there would be lost (server_processes_exited).
            left = wait_one_haproxy(30.0)
            if left > 1:
                log(f"{name}: {left} HAProxy processes after 30 s; CPU windows may be short")
        budgets = _budgets(base) if kind == "serve_app" else {}
        # The replicas whose GPU memory must be gone before the next job deploys.
        ctx["pids"] = set(budgets) or _replica_pids(clients)
    except Exception as exc:  # noqa: BLE001 - the job fails, the run goes on
        err = error_doc(exc)
        log(f"job {job['key']} FAILED to deploy: {err['error'][:800]}")
        result["errors"].append({"job": job["key"], **err})
        skip_rest(payloads, "error", f"deploy failed: {err['error'][:1500]}")
        if litserve is not None:
            litserve.stop()
            clients.server_cpu = ray_cpu
        return
    deploy_s = round(time.time() - t0, 1)
    log(f"{name}: serving after {deploy_s} s")
    sampler = MemorySampler(None, use_nvml=cuda, interval_s=0.1).start() if cuda else None
    try:
        for i, p in enumerate(payloads):
            left = ctx["deadline"] - time.time()
            if left < measure_est_s(cfg):
                skip_rest(payloads[i:], "skipped", f"time budget: {left:.0f} s left")
                break
            log(f"{name}: {p.key} ({p.description})")
            if kind == "serve_app":  # a replica may have reported after the first read
                budgets.update(_budgets(base))
                ctx["pids"] = set(budgets)
            for row in measure_served(clients, base, p, common(p)):
                row["deploy_s"] = deploy_s
                _judge_memory(row, sampler, budgets)
                result["rows"].append(row)
            write_json(ctx["result_path"], result)
    finally:
        if sampler is not None:
            sampler.stop()
        if kind == "serve_app":
            result["server_reports"][job["key"]] = server_memory(base)
        if litserve is not None:
            litserve.stop()
            clients.server_cpu = ray_cpu


def peer_settings(kind: str, replicas: int, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The peer's own batching settings, as its rows record them."""
    if kind == "litserve":
        return {
            "workers_per_device": replicas,
            "devices": 1,
            "max_batch_size": cfg["peer_max_batch_size"],
            "batch_timeout": cfg["peer_batch_wait_s"],
            "fast_queue": True,
            "num_api_servers": "default (one per worker)",
        }
    return {
        "max_batch_size": cfg["peer_max_batch_size"],
        "batch_wait_timeout_s": cfg["peer_batch_wait_s"],
        "max_ongoing_requests": 512,
    }


def _replica_pids(clients: Clients) -> set[int]:
    if clients.server_cpu is None:
        return set()
    return {pid for pid, p in clients.server_cpu.snapshot().items() if p.kind == "replica"}


def _judge_memory(row: dict[str, Any], sampler: Any, budgets: Mapping[int, int]) -> None:
    """Budget violations in the NVML samples of this row's time window."""
    if sampler is None:
        row["note"] = ((row.get("note") or "") + "; no NVML sampling (CPU run)").lstrip("; ")
        return
    t0, t1 = row.get("started_unix_s"), row.get("ended_unix_s")
    window = [
        s
        for s in list(sampler.log.samples)
        if t0 is not None and t1 is not None and t0 <= s["t_unix_s"] <= t1
    ]
    judged = budget_violations(window, budgets)
    row["budget_violations"] = judged["budget_violations"] if budgets else None
    if row.get("setup") == "serve_app" and not budgets:
        row["note"] = ((row.get("note") or "") + "; no budgets from /v1/memory").lstrip("; ")
    row["nvml_samples"] = judged["nvml_samples_judged"]
    peaks = judged["peak_bytes"]
    row["peak_process_bytes"] = max(peaks.values()) if peaks else None
    row["budget_bytes"] = min(budgets.values()) if budgets else None


def serve_worker(spec: dict[str, Any]) -> None:
    """Run ``spec["jobs"]`` in one Ray session; the result file is rewritten after each row."""
    from load_tests.harness.cluster import kill_matching, private_haproxy_files
    from load_tests.harness.openloop import OpenLoopPool
    from load_tests.harness.wrk import find_wrk

    cfg = spec["cfg"]
    cuda = cfg["device"] == "cuda"
    result_path = Path(spec["result_path"])
    result: dict[str, Any] = {"rows": [], "errors": [], "server_reports": {}, "notes": []}
    os.sched_setaffinity(0, set(cfg["server_cores"]))
    scratch = Path(tempfile.mkdtemp(prefix="tp-serve-"))
    result["scratch_dir"] = str(scratch)
    write_json(result_path, result)
    private_haproxy_files(scratch)
    os.environ["CUDA_VISIBLE_DEVICES"] = str(cfg["gpu"]) if cuda else ""
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)
    daemon = None
    if cfg["mps"]:  # as `serve-app run` does for memory.enforcement: mps (serve_app/mps.py)
        from serve_app.gpu import mps as serve_app_mps

        try:
            daemon = serve_app_mps.ensure_daemon()
            result["notes"].append(daemon.describe())
        except Exception as exc:  # noqa: BLE001 - the run goes on and says so
            result["notes"].append(f"--mps asked, but no MPS: {exc}")
    mps = daemon is not None
    pool = None
    ctx: dict[str, Any] = {"cfg": cfg, "cuda": cuda, "mps": mps, "result_path": result_path}
    ctx["deadline"] = spec["deadline_unix"]
    ctx["scratch"] = scratch
    try:
        from serve_app.ops import launch, ports

        work = Path(spec["work_dir"])
        pool = OpenLoopPool(
            cfg["client_cores"], cfg["openloop_procs"], work, cfg["max_send_lag_p99_ms"]
        )
        clients = Clients(find_wrk(cfg["wrk"]), pool, cfg, work, log)
        # Every process this worker starts is the server's (Ray's daemons and workers, Serve's
        # HAProxy, a LitServe server), except the clients and this process itself.
        clients.server_cpu = ServerCpu([os.getpid()], clients.client_pids, count_roots=False)
        t0 = time.time()
        # Beside a server or a test session: never their metrics port (launch pins one).
        os.environ[launch.METRICS_PORT_VAR] = str(ports.free_port())
        launch.start_ray(launch.gpu_count() if cuda else 0, haproxy=True)
        from serve_app.startup import ray_compat

        result["session_dir"] = ray_compat.session_dir()
        ctx["port"] = ports.free_port()
        result["ray_start_s"] = round(time.time() - t0, 1)
        for job in spec["jobs"]:
            run_job(job, ctx, clients, result)
            result.setdefault("jobs_done", []).append(job["key"])
            write_json(result_path, result)
    except BaseException as exc:  # noqa: BLE001 - SIGTERM arrives as SystemExit
        result["errors"].append(error_doc(exc))
        log(f"serve worker FAILED: {type(exc).__name__}: {str(exc)[:500]}")
    finally:
        write_json(result_path, result)
        if pool is not None:
            pool.close()
        try:
            from serve_app.ops import launch, ports

            launch.shutdown()
        except Exception as exc:  # noqa: BLE001
            log(f"shutdown failed: {exc!r}")
        killed = kill_matching(str(scratch), names=("haproxy",))
        if killed:
            result["killed_haproxy_pids"] = killed
        if daemon is not None:
            serve_app_mps.stop_daemon(daemon)
        write_json(result_path, result)
