"""Orchestration: the phases in order, each worker in its own process, the JSON and plots."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from load_tests.side_by_side import util
from load_tests.side_by_side.analysis import (
    best_of,
    cluster_weight,
    compute_ratios,
    merge_previous,
    noop_verdict,
    plan_clusters,
    ratio,
)
from load_tests.side_by_side.baselines import ceiling_worker, client_ceiling, in_process_noop
from load_tests.side_by_side.cluster import cluster_worker, kill_matching
from load_tests.side_by_side.constants import (
    DEFAULT_OUT,
    MODELS,
    PHASES,
    RESULTS_ENV,
    ROOT,
    SCHEMA_VERSION,
    setup_label,
)
from load_tests.side_by_side.options import _config, build_parser
from load_tests.side_by_side.util import _error, _write_json, log, machine_info


def _stop_worker(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM the worker's process group (it shuts its Ray cluster down), SIGKILL after 45 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=45)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()
    except ProcessLookupError:
        return proc.wait()


def _run_worker(mode: str, spec: dict[str, Any], timeout_s: float, out_dir: Path) -> dict[str, Any]:
    """Run a worker subprocess on `spec`; on timeout, SIGTERM (it tears its cluster down), then
    SIGKILL, then kill what its Ray session left. Returns its result file's contents."""
    fd, spec_path = tempfile.mkstemp(prefix=f"sbs-{mode}-", suffix=".json", dir=out_dir)
    os.close(fd)
    result_path = Path(spec_path).with_suffix(".result.json")
    spec = dict(spec, result_path=str(result_path), out_dir=str(out_dir))
    Path(spec_path).write_text(json.dumps(spec))
    proc = subprocess.Popen(
        [sys.executable, "-m", "load_tests.side_by_side", "--_worker", mode, "--_spec", spec_path],
        cwd=str(ROOT),
        start_new_session=True,
    )
    try:
        rc = proc.wait(timeout=max(5.0, timeout_s))
    except subprocess.TimeoutExpired:
        log(f"worker {mode} over its {timeout_s:.0f} s: stopping it")
        rc = _stop_worker(proc)
    except BaseException:  # Ctrl-C or SIGTERM here: the worker tears its cluster down first
        _stop_worker(proc)
        raise
    result: dict[str, Any] = {}
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError) as exc:
        result = {"errors": [{"error": f"no result from worker {mode}: {exc!r}"}]}
    if rc != 0:
        result.setdefault("errors", []).append({"error": f"worker {mode} exited with {rc}"})
        for marker in (result.get("session_dir"), result.get("scratch_dir")):
            if marker:
                pids = kill_matching(marker)
                if pids:
                    log(f"killed {len(pids)} processes left by worker {mode}")
    for p in (Path(spec_path), result_path):
        p.unlink(missing_ok=True)
    return result


def _cluster_jobs(
    proxy_jobs: Sequence[str], models: Sequence[str], cfg: Mapping[str, Any], noop: bool
) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = [{"key": "noop", "kind": "noop"}] if noop else []
    for key in proxy_jobs:
        for model in models:
            jobs.append(
                {
                    "key": f"{model}/{key}",
                    "kind": "setup",
                    "setup": key,
                    "model": model,
                    "p99_target_s": cfg["p99_target_s"][model],
                }
            )
    return jobs


def _worker_main(a: argparse.Namespace) -> int:
    if a._worker == "noop-server":
        import uvicorn

        uvicorn.run(
            "load_tests.side_by_side:create_noop_app",
            factory=True,
            host="127.0.0.1",
            port=a._port,
            workers=a._workers,
            log_level="warning",
            access_log=False,
        )
        return 0

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    spec = json.loads(Path(a._spec).read_text())
    util.set_t0(spec.get("t0_unix"))
    if a._worker == "ceiling":
        if spec["device"] == "cuda":
            os.environ["CUDA_VISIBLE_DEVICES"] = str(spec["gpu"])
        result: dict[str, Any] = {}
        try:
            result = {"models": ceiling_worker(spec)}
        except BaseException as exc:  # noqa: BLE001
            result = {"errors": [_error(exc)]}
        _write_json(Path(spec["result_path"]), result)
        return 0
    cluster_worker(spec)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a._worker:
        return _worker_main(a)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    only = {x.strip() for x in a.only.split(",") if x.strip()}
    bad = [m for m in models if m not in MODELS] + [x for x in only if x not in PHASES]
    if bad or not models:
        parser.error(f"unknown model or phase {bad}; models: {sorted(MODELS)}, phases: {PHASES}")
    if a.haproxy_plain:
        only.add("haproxy_plain")
    if a.replicas is None:
        a.replicas = 2 if a.device == "cpu" else 4
    if a.replicas < 1 or a.plain_batch < 1 or a.client_procs is not None and a.client_procs < 1:
        parser.error("--replicas, --plain-batch and --client-procs must be >= 1")
    out = a.out or Path(os.environ.get(RESULTS_ENV) or DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    cfg = _config(a)
    cpu = a.device == "cpu"

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)  # so a running worker is stopped, not orphaned
    t_start = time.time()
    deadline = t_start + cfg["max_time_s"]
    spec_base: dict[str, Any] = {
        "device": a.device,
        "gpu": a.gpu,
        "replicas": a.replicas,
        "client_procs": a.client_procs or (1 if cpu else 4),
        "max_connections": a.max_connections,
        "max_in_flight": a.max_in_flight,
        "timeout_s": a.request_timeout_s,
        "replica_cpus": 0.5 if cpu else 1.0,
        "ray_cpus": 8 if cpu else None,
        "deploy_timeout_s": 240.0 if cpu else 150.0,
        "cfg": cfg,
        "t0_unix": util.start_time(),
    }
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "created_unix_s": t_start,
        "command": " ".join(
            [
                Path(sys.executable).name,
                "-m",
                "load_tests.side_by_side",
                *(argv if argv is not None else sys.argv[1:]),
            ]
        ),
        "config": {
            **cfg,
            **{k: v for k, v in spec_base.items() if k not in ("cfg", "t0_unix")},
            "models": models,
            "only": sorted(only),
        },
        "machine": machine_info(),
        "client": {},
        "noop": {},
        "models": {
            name: {
                "kind": MODELS[name]["kind"],
                "items": MODELS[name]["items"],
                "p99_target_s": cfg["p99_target_s"][name],
                "moderate_rate_per_s": cfg["moderate_rate"],
                "inputs_per_request": cfg["inputs_per_request"],
                "ceiling": {},
                "setups": {},
                "ratios": {},
            }
            for name in models
        },
        "errors": [],
        "timings": {},
    }
    json_path = out / "side_by_side.json"
    previous = None
    if a.merge and json_path.is_file():
        try:
            previous = json.loads(json_path.read_text())
        except ValueError as exc:
            parser.error(f"--merge: {json_path} is not valid JSON: {exc}")

    def save() -> None:
        doc["timings"]["total_s"] = round(time.time() - t_start, 1)
        _write_json(json_path, doc)

    m = doc["machine"]
    log(
        f"machine: {m['gpu_name']} driver {m['driver_version']}, torch {m['torch_version']}, "
        f"ray {m['ray_version']}, {m['cpu_count']} CPUs; budget {cfg['max_time_s']:.0f} s; "
        f"out {out}"
    )
    if not cpu and not m["gpus"]:
        log(
            "WARNING: --device cuda but NVML sees no GPU; the GPU setups will fail "
            "(for a dry run use --device cpu)"
        )
    save()

    # 1. the in-process ceiling
    if "ceiling" in only:
        t = time.time()
        log("phase ceiling: the model alone, in one process")
        spec = dict(
            spec_base,
            models=models,
            batches=[64, 8] if not cpu else [8, 2],
            min_s=0.5 if (cpu or a.quick) else 1.0,
            cpu_min_s=0.5,
        )
        res = _run_worker("ceiling", spec, min(180.0, deadline - time.time()), out)
        for name, c in (res.get("models") or {}).items():
            doc["models"][name]["ceiling"] = c
        doc["errors"].extend({"phase": "ceiling", **e} for e in res.get("errors", []))
        doc["timings"]["ceiling_s"] = round(time.time() - t, 1)
        save()

    # 2. the client's own ceiling and the HTTP baseline
    if "client" in only or "noop" in only:
        t = time.time()
        log("phase client: the same client against a bare uvicorn + Starlette no-op server")
        try:
            doc["client"] = client_ceiling(
                cfg, spec_base, models, min(deadline, time.time() + 60.0)
            )
        except Exception as exc:  # noqa: BLE001
            doc["client"] = {"status": "error", **_error(exc)}
            log(f"client ceiling FAILED: {exc!r}")
        try:
            doc["noop"]["in_process"] = in_process_noop(cfg)
        except Exception as exc:  # noqa: BLE001
            doc["noop"]["in_process"] = {"status": "error", **_error(exc)}
        doc["timings"]["client_s"] = round(time.time() - t, 1)
        save()

    # 3-5. the served setups, one fresh cluster per proxy mode; serve_app first
    clusters = plan_clusters(only)
    for i, (tag, proxy, keys, noop) in enumerate(clusters):
        t = time.time()
        left = deadline - t
        jobs = _cluster_jobs(keys, models, cfg, noop)
        if left < (60.0 if tag == "haproxy_plain" else 30.0):
            log(f"skipping cluster[{tag}]: {left:.0f} s left of the budget")
            for job in jobs:
                skipped = {"status": "skipped", "error": "time budget"}
                if job["kind"] == "noop":
                    doc["noop"][f"serve_{proxy}"] = skipped
                else:
                    doc["models"][job["model"]]["setups"][job["setup"]] = skipped
            continue
        # haproxy_plain is the optional extra: it gets what the others leave, never a share.
        weights = [
            cluster_weight(k, n, len(models))
            for tg, _, k, n in clusters[i:]
            if tg != "haproxy_plain" or tg == tag
        ]
        cluster_deadline = t + max(30.0, left * weights[0] / sum(weights))
        log(
            f"phase cluster[{tag}]: {proxy} proxy, jobs {[j['key'] for j in jobs]}, "
            f"{cluster_deadline - t:.0f} s"
        )
        spec = dict(spec_base, proxy=proxy, jobs=jobs, deadline=cluster_deadline)
        res = _run_worker("cluster", spec, cluster_deadline - time.time() + 60.0, out)
        for job in jobs:
            got = (res.get("jobs") or {}).get(job["key"]) or {
                "status": "error",
                "error": "no result (the cluster failed to start or the worker died)",
            }
            if job["kind"] == "noop":
                doc["noop"][f"serve_{proxy}"] = got
            else:
                got.setdefault("label", setup_label(job["setup"], a.replicas))
                doc["models"][job["model"]]["setups"][job["setup"]] = got
        doc["errors"].extend({"phase": f"cluster[{tag}]", **e} for e in res.get("errors", []))
        doc["timings"][f"cluster_{tag}_s"] = round(time.time() - t, 1)
        doc["timings"][f"cluster_{tag}_startup_s"] = res.get("startup_s")
        save()

    if previous is not None:
        taken = merge_previous(doc, previous)
        doc["merged_from_previous"] = taken
        log(f"merged from the previous {json_path.name}: {', '.join(taken) or 'nothing'}")
    finalize(doc)
    save()
    log(f"wrote {json_path}")
    from load_tests.render_benchmarks import plot_all, render_markdown

    try:
        print(render_markdown(doc), flush=True)
    except Exception as exc:  # noqa: BLE001 - the JSON is written; the table can be redone
        log(f"markdown table failed: {exc!r} (python -m load_tests.render_benchmarks {json_path})")
    try:
        written = plot_all(doc, out)
        log("wrote " + ", ".join(str(p) for p in written))
    except Exception as exc:  # noqa: BLE001 - matplotlib may be missing on the GPU host
        log(
            f"plots failed: {exc!r}; redraw elsewhere: python -m load_tests.render_benchmarks "
            f"{json_path} --plots {out}"
        )
    log(f"done in {time.time() - t_start:.0f} s")
    return 0


def finalize(doc: dict[str, Any]) -> None:
    """Ratios per model and the no-op verdict, from what was measured."""
    for model_doc in doc["models"].values():
        model_doc["ratios"] = compute_ratios(model_doc)
        ceiling = (model_doc.get("ceiling") or {}).get("items_per_s_max")
        for key, s in model_doc["setups"].items():
            s["vs_ceiling"] = ratio(best_of(model_doc["setups"], key), ceiling)
    noop = doc["noop"]
    bare = ((doc.get("client") or {}).get("bare_uvicorn_noop") or {}).get("p50_s")
    direct = (noop.get("in_process") or {}).get("asgi_in_process_p50_s")
    for proxy in ("haproxy", "default"):
        served = (noop.get(f"serve_{proxy}") or {}).get("p50_s")
        noop[f"verdict_{proxy}_vs_bare_uvicorn"] = noop_verdict(served, bare)
        noop[f"verdict_{proxy}_vs_in_process_asgi"] = noop_verdict(served, direct)
