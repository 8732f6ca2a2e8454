"""The cluster worker: one fresh Ray cluster per proxy mode, its setups deployed and swept."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from load_tests.side_by_side.analysis import (
    _p,
    add_items_rate,
    best_sustained,
    limit_hint,
    memory_summary,
    point_at,
)
from load_tests.side_by_side.client import LoadClient, describe_point, sweep
from load_tests.side_by_side.constants import MODELS, ROOT, SETUPS, setup_label
from load_tests.side_by_side.deployments import (
    minilm_dir,
    noop_deployment,
    noop_request,
    plain_embeddings_deployment,
    plain_image_deployment,
)
from load_tests.side_by_side.util import _error, _write_json, log, nvml_devices
from serve_app.ops.launch import free_port


def _private_env(proxy: str, scratch: Path, spec: Mapping[str, Any]) -> None:
    """Environment for this worker's Ray cluster; set before ray.init so every Ray process
    (and Serve's constants in this driver) sees it."""
    os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1" if proxy == "haproxy" else "0"
    # serve_app's cluster runs as `serve-app run` starts Ray (user code on Serve's own loop);
    # plain Ray Serve keeps Ray's default.
    serve_app_here = any(
        SETUPS[j["setup"]]["server"] == "serve_app" for j in spec["jobs"] if "setup" in j
    )
    os.environ["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] = "0" if serve_app_here else "1"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "2")
    private_haproxy_files(scratch)
    if spec["device"] == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(spec["gpu"])
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)


def private_haproxy_files(scratch: Path) -> None:
    """HAProxy's files default to a shared /tmp/haproxy-serve and its side ports are fixed.
    Private ones (set before ray.init) let this cluster run beside another Serve and tell its
    HAProxy apart by its config path (see kill_matching)."""
    os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"] = str(scratch / "haproxy.cfg")
    os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"] = str(scratch / "admin.sock")
    os.environ["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] = str(scratch)
    os.environ["RAY_SERVE_HAPROXY_SERVER_STATE_FILE"] = str(scratch / "server-state")
    from serve_app.ops.launch import private_haproxy_ports

    private_haproxy_ports()


def kill_matching(marker: str, names: Sequence[str] = ()) -> list[int]:
    """Terminate (then kill) processes whose command line contains `marker` (and, when
    `names` is given, whose name contains one of them). Returns their PIDs."""
    import psutil

    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = " ".join(proc.info.get("cmdline") or [])
            name = proc.info.get("name") or ""
            if proc.pid == me or marker not in cmd:
                continue
            if names and not any(n in name or n in cmd.split(" ")[0] for n in names):
                continue
            found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for proc in found:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(found, timeout=5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return [p.pid for p in found]


def _deploy(app: Any, name: str, timeout_s: float) -> None:
    from ray import serve
    from ray.serve import RunTarget

    serve.run_many(
        [RunTarget(target=app, name=name, route_prefix="/")],
        wait_for_ingress_deployment_creation=False,
        wait_for_applications_running=False,
    )
    deadline = time.monotonic() + timeout_s
    status = "?"
    while time.monotonic() < deadline:
        app_status = serve.status().applications.get(name)
        if app_status is not None:
            status = str(app_status.status)
            if status.endswith("RUNNING"):
                return
            if "FAILED" in status:
                details = [app_status.message] + [
                    f"{dep}: {d.message}" for dep, d in app_status.deployments.items() if d.message
                ]
                raise RuntimeError(f"{name}: {status}: " + "\n".join(details)[:3000])
        time.sleep(0.5)
    raise TimeoutError(f"{name} not RUNNING after {timeout_s:.0f} s (last status {status})")


def _wait_answer(request: Any, timeout_s: float) -> float:
    """Send the real request until it gets a 2xx (HAProxy reloads after deploy; the first
    forward pass initialises the GPU). Returns the seconds it took."""
    import httpx

    t0 = time.monotonic()
    last = ""
    with httpx.Client(timeout=30.0) as http:
        while time.monotonic() - t0 < timeout_s:
            try:
                resp = http.request(
                    request.method, request.url, headers=request.headers, content=request.content
                )
                if 200 <= resp.status_code < 300:
                    return time.monotonic() - t0
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.3)
    raise TimeoutError(f"{request.url} gave no 2xx within {timeout_s:.0f} s; last: {last}")


def _serve_app_args(model: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    from serve_app.config.args import parse_args

    m = MODELS[model]
    raw: dict[str, Any] = {
        "load_format": "dummy",
        "dtype": "float16",
        "model_name": m["model_name"],
    }
    if m["kind"] == "image":
        raw.update(adapter="image-classification", arch="resnet50")
    else:
        raw.update(adapter="embeddings", model_path=minilm_dir())
    raw.update(spec["cfg"].get("serve_app_args") or {})
    return parse_args(raw).model_dump()


def run_setup(
    job: Mapping[str, Any],
    spec: Mapping[str, Any],
    load: LoadClient,
    base_url: str,
    memory: Any,
    totals: Mapping[str, int],
) -> dict[str, Any]:
    from ray import serve

    from load_tests import bench

    key, model = job["setup"], job["model"]
    m, s = MODELS[model], SETUPS[key]
    replicas = spec["replicas"] if s["shared"] else 1
    num_gpus = 1.0 / replicas
    cfg = spec["cfg"]
    per_request = int(cfg.get("inputs_per_request", 1))
    label = f"{model}/{key}"
    doc: dict[str, Any] = {
        "inputs_per_request": per_request,
        "label": setup_label(key, spec["replicas"]),
        "server": s["server"],
        "proxy": s["proxy"],
        "replicas": replicas,
        "num_gpus_per_replica": num_gpus,
        "status": "error",
    }
    options: dict[str, Any] = {
        "num_replicas": replicas,
        "ray_actor_options": {"num_gpus": num_gpus, "num_cpus": spec["replica_cpus"]},
    }
    name = f"{key}_{model}"
    t0 = time.time()
    try:
        if s["server"] == "serve_app":
            from serve_app.serving.replica import ModelServer

            app = ModelServer.options(**options).bind(_serve_app_args(model, spec))  # type: ignore[attr-defined]
            doc["config"] = {
                "args": "load_format=dummy dtype=float16, calibrated batch, default cache policy",
                "extra_args": spec["cfg"].get("serve_app_args") or {},
            }
        else:
            factory = (
                plain_image_deployment if m["kind"] == "image" else plain_embeddings_deployment
            )
            dep = factory(cfg["plain_batch"], cfg["batch_wait_timeout_s"])
            options["max_ongoing_requests"] = 2 * cfg["plain_batch"]
            app = dep.options(**options).bind()
            doc["config"] = {
                "max_batch_size": cfg["plain_batch"],
                "batch_wait_timeout_s": cfg["batch_wait_timeout_s"],
                "max_ongoing_requests": 2 * cfg["plain_batch"],
            }
        log(f"{label}: deploying {doc['label']}")
        _deploy(app, name, min(spec["deploy_timeout_s"], max(10.0, spec["deadline"] - time.time())))
        doc["deploy_s"] = round(time.time() - t0, 1)
        url = base_url + m["route"]
        requests = bench.build_requests(
            url, m["kind"], model=m["model_name"], seed=cfg["seed"], batch=per_request
        )
        doc["request_bytes"] = [len(r.content) for r in requests]
        doc["first_answer_s"] = round(_wait_answer(requests[0], 60.0), 2)
        log(f"{label}: serving after {doc['deploy_s']:.1f} s deploy; sweeping")
        t_sweep = time.time()
        points: list[dict[str, Any]] = []
        doc["sweep"] = points
        sweep(
            load,
            requests,
            cfg,
            p99_target_s=job["p99_target_s"],
            deadline=spec["deadline"],
            label=label,
            points=points,
        )
        doc["sweep_s"] = round(time.time() - t_sweep, 1)
        doc["best"] = add_items_rate(
            best_sustained(points, job["p99_target_s"], cfg["max_error_rate"]), per_request
        )
        doc["moderate"] = point_at(points, cfg["moderate_rate"])
        doc["limit_hint"] = limit_hint(points)
        if s["server"] == "serve_app":
            doc["server_memory"] = _server_memory(base_url)
        doc["status"] = "ok" if points else "skipped"
        if not points:
            doc["error"] = "no rate point ran (time budget)"
    except Exception as exc:  # noqa: BLE001 - keep what was measured, record why it stopped
        doc.update(status="error", **_error(exc))
        points = doc.get("sweep") or []
        doc["best"] = add_items_rate(
            best_sustained(points, job["p99_target_s"], cfg["max_error_rate"]), per_request
        )
        doc["moderate"] = point_at(points, cfg["moderate_rate"])
        log(f"{label} FAILED: {doc['error'][:500]}")
    finally:
        t1 = time.time()
        try:
            serve.delete(name)
        except Exception as exc:  # noqa: BLE001 - keep the results; note the failed teardown
            doc["teardown_error"] = repr(exc)
        doc["memory"] = memory_summary(list(memory.log.samples), t0, t1, num_gpus, totals)
        doc["memory"]["notes"] = list(memory.log.notes)
    return doc


def _server_memory(base_url: str) -> list[dict[str, Any]]:
    import httpx

    keep = (
        "replica_id",
        "pid",
        "node_id",
        "gpu_uuid",
        "budget_bytes",
        "cap_bytes",
        "torch_fraction",
        "reserved_bytes",
        "peak_reserved_bytes",
        "non_torch_overhead_bytes",
        "nvml_process_bytes",
        "calibrated_batch_size",
        "calibration_peak_bytes",
        "max_batch_size",
        "largest_batch",
        "batches",
        "batched_items",
        "batch_busy_s",
        "queued_items",
        "warmup_s",
        "cuda_graphs",
        "cuda_graph_pool_bytes",
        "cuda_graph_capture_s",
        "cuda_graph_replays",
        "oom_recoveries",
        "cache_policy",
        "cache_frees",
    )
    try:
        reps = httpx.get(f"{base_url}/v1/memory", timeout=10.0).json().get("replicas", [])
        return [{k: r.get(k) for k in keep} for r in reps if isinstance(r, dict)]
    except Exception as exc:  # noqa: BLE001 - the report is extra, not the measurement
        return [{"error": repr(exc)}]


def run_noop(spec: Mapping[str, Any], load: LoadClient, base_url: str) -> dict[str, Any]:
    from ray import serve

    cfg = spec["cfg"]
    name = "noop"
    t0 = time.time()
    try:
        app = (
            noop_deployment()
            .options(
                num_replicas=1,
                max_ongoing_requests=512,
                ray_actor_options={"num_cpus": spec["replica_cpus"]},
            )
            .bind()
        )
        _deploy(app, name, 120.0)
        req = noop_request(f"{base_url}/noop")
        _wait_answer(req, 60.0)
        s = load.point([req], cfg["noop_rate"], cfg["noop_duration_s"], 1.0, cfg["seed"])
        log(f"noop via Serve ({spec['proxy']} proxy): {describe_point(s)}")
        return {
            "status": "ok",
            "deploy_s": round(time.time() - t0, 1),
            "p50_s": _p(s.get("latency_s"), "p50"),
            "p99_s": _p(s.get("latency_s"), "p99"),
            "summary": s,
        }
    finally:
        try:
            serve.delete(name)
        except Exception:  # noqa: BLE001
            pass


def cluster_worker(spec: dict[str, Any]) -> None:
    """One fresh Ray cluster with one proxy mode; runs spec's jobs and writes the results."""
    result_path = Path(spec["result_path"])
    result: dict[str, Any] = {"proxy": spec["proxy"], "jobs": {}, "errors": []}
    scratch = Path(tempfile.mkdtemp(prefix=f"sbs-{spec['proxy']}-"))
    result["scratch_dir"] = str(scratch)
    _write_json(result_path, result)
    _private_env(spec["proxy"], scratch, spec)
    load = memory = None
    ray_started = False
    try:
        import ray
        from ray import serve

        from load_tests import bench

        t0 = time.time()
        load = LoadClient(
            spec["client_procs"], spec["max_connections"], spec["timeout_s"], spec["max_in_flight"]
        )
        port = free_port()
        ray.init(
            address="local",
            num_cpus=spec["ray_cpus"],
            num_gpus=1,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            namespace="side_by_side",
            log_to_driver=False,
        )
        ray_started = True
        node = ray._private.worker._global_node
        result["session_dir"] = node.get_session_dir_path() if node else None
        _write_json(result_path, result)
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        base_url = f"http://127.0.0.1:{port}"
        result["startup_s"] = round(time.time() - t0, 1)
        log(f"cluster[{spec['proxy']}]: Ray + Serve up in {result['startup_s']} s at {base_url}")
        totals = {g["uuid"]: g["total_bytes"] for g in nvml_devices()}
        memory = bench.MemorySampler(
            None, use_nvml=spec["device"] == "cuda", interval_s=1.0
        ).start()
        for job in spec["jobs"]:
            key = job["key"]
            if time.time() + 25.0 > spec["deadline"]:
                result["jobs"][key] = {"status": "skipped", "error": "time budget reached"}
                log(f"cluster[{spec['proxy']}]: skipping {key}: time budget reached")
                _write_json(result_path, result)
                continue
            try:
                if job["kind"] == "noop":
                    result["jobs"][key] = run_noop(spec, load, base_url)
                else:
                    result["jobs"][key] = run_setup(job, spec, load, base_url, memory, totals)
            except Exception as exc:  # noqa: BLE001 - record, move on to the next setup
                result["jobs"][key] = {"status": "error", **_error(exc)}
                what = f"{type(exc).__name__}: {str(exc)[:500]}"
                log(f"cluster[{spec['proxy']}]: {key} FAILED: {what}")
            _write_json(result_path, result)
    except BaseException as exc:  # noqa: BLE001 - SIGTERM arrives as SystemExit
        result["errors"].append(_error(exc))
        log(f"cluster[{spec['proxy']}] FAILED: {type(exc).__name__}: {str(exc)[:500]}")
    finally:
        if memory is not None:
            memory.stop()
        if load is not None:
            load.close()
        if result.get("session_dir"):
            _save_logs(
                Path(result["session_dir"]), Path(spec["out_dir"]) / f"ray_logs_{spec['proxy']}"
            )
        if ray_started:
            _shutdown_cluster()
        killed = kill_matching(str(scratch), names=("haproxy",))
        if killed:
            result["killed_haproxy_pids"] = killed
        _write_json(result_path, result)


def _shutdown_cluster() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    except Exception as exc:  # noqa: BLE001
        log(f"serve.shutdown failed: {exc!r}")
    try:
        ray.shutdown()
    except Exception as exc:  # noqa: BLE001
        log(f"ray.shutdown failed: {exc!r}")


def _save_logs(session_dir: Path, dest: Path, max_bytes: int = 400_000) -> None:
    """The tails of Serve's logs (controller, proxy, replicas) for a post-mortem."""
    try:
        logs = session_dir / "logs" / "serve"
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted(logs.glob("*.log")):
            data = f.read_bytes()
            if data:
                (dest / f.name).write_bytes(data[-max_bytes // 8 :])
    except Exception as exc:  # noqa: BLE001
        log(f"could not save Ray logs: {exc!r}")
