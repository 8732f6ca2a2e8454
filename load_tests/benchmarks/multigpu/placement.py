"""Part "placement": one Ray node with both GPUs, six MiniLM replicas at ``num_gpus: 0.3``.

Ray places fractional replicas by best fit per GPU (docs/cluster.md), so 3 + 3 are expected.
From ``GET /v1/memory`` (``placement``, ``gpus``, ``replicas``) and NVML per process, sampled
every 0.25 s during ``load_s`` of light load (harness.load.Load, a few clients), it records per GPU
UUID the replicas, the sum of their budgets against the GPU's total, and each replica's NVML
bytes against its budget (rows.placement_rows). On the CPU the GPUs are logical (Ray's
``num_gpus``) and named by a scripted NVML: no per-process bytes, so those fields are null.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx

from load_tests.benchmarks.multigpu import rows
from load_tests.benchmarks.multigpu.common import (
    cleanup_first,
    failed,
    start_load,
    stop_load,
    write_json,
)
from load_tests.harness.run import log
from serve_app.gpu.nvml import FAKE_NVML_VAR

REPLICAS = 6
SHARE = 0.3
CONFIG = "configs/gpu-shared.yaml"  # its args: MiniLM, fp16, threshold cache policy, calibration


def app_args(device: str) -> dict[str, Any]:
    """configs/gpu-shared.yaml's args with dummy weights (the GPU host has none)."""
    from load_tests.harness.meta import ROOT
    from serve_app.config.deploy import load_deploy_config

    args = dict(load_deploy_config(ROOT / CONFIG)["applications"][0]["args"])
    args.update(load_format="dummy", dtype="float16")
    if device == "cpu":  # the CPU dry run: no calibration to run, a small batch
        args.update(max_batch_size=8)
        args["memory"] = {**args.get("memory", {}), "calibrate": False}
    return args


def placement_worker(spec: dict[str, Any]) -> None:
    from load_tests.harness.cluster import private_haproxy_files, start_cluster
    from load_tests.harness.nvml import MemorySampler
    from serve_app.ops import launch

    out = Path(spec["out_dir"]) / "placement.json"
    cuda = spec["device"] == "cuda"
    scratch = Path(spec["scratch"]) / "placement"
    scratch.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "part": "placement",
        "status": "running",
        "device": spec["device"],
        "replicas_asked": REPLICAS,
        "num_gpus_per_replica": SHARE,
        "scratch_dir": str(scratch),
        "notes": [],
        "errors": [],
    }
    if not cuda:
        doc["notes"].append(
            "CPU dry run: two logical GPUs (ray num_gpus=2) named by a scripted NVML; no NVML "
            "per-process bytes and no CUDA, so the nvml_* and violation fields are null"
        )
    write_json(out, doc)
    deadline = float(spec["deadline_unix"])
    private_haproxy_files(scratch)
    if cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
    else:  # Ray's logical GPUs; the replicas name theirs through the script
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        os.environ[FAKE_NVML_VAR] = spec["nvml_script"]
    try:
        args = {**app_args(spec["device"]), "device": "auto"}
        actor = {"num_gpus": SHARE, "num_cpus": 1 if cuda else 0.25}
        doc.update(args=args, ray_actor_options=actor)
        t0 = time.time()
        target = start_cluster(
            REPLICAS,
            args,
            actor,
            num_gpus=2,
            num_cpus=16 if cuda else 8,
            timeout_s=max(10.0, deadline - time.time() - spec["load_s"] - 15.0),
        )
        from serve_app.startup import ray_compat

        doc["session_dir"] = ray_compat.session_dir()
        doc["deploy_s"] = round(time.time() - t0, 1)
        log(f"placement: {REPLICAS} replicas up in {doc['deploy_s']} s")
        write_json(out, doc)
        load_s = max(1.0, min(spec["load_s"], deadline - time.time() - 10.0))
        sampler = MemorySampler(None, use_nvml=cuda, interval_s=0.25).start()
        t_load = time.time()
        load = start_load(target.url, spec["clients"])
        try:
            time.sleep(load_s)
        finally:
            stop_load(load)
            memory_log = sampler.stop()
        lost, refused, statuses = load.tally()
        memory = httpx.get(f"{target.base}/v1/memory", timeout=30.0).json()
        doc.update(
            load={
                "seconds": round(time.time() - t_load, 1),
                "clients": spec["clients"],
                "sent": len(load.results),
                "lost": lost,
                "failed": refused,
                "statuses": statuses,
            },
            gpus=memory.get("gpus"),
            placement=memory.get("placement"),
            memory_errors=memory.get("errors"),
            by_gpu=rows.placement_rows(memory, memory_log.samples),
            nvml_notes=memory_log.notes,
        )
        doc["replicas_by_gpu"] = {r["gpu_uuid"]: r["replica_count"] for r in doc["by_gpu"]}
        doc["all_budgets_within_total"] = all(r["budgets_within_total"] for r in doc["by_gpu"])
        violations = [r["budget_violations"] for r in doc["by_gpu"]]
        doc["budget_violations"] = None if None in violations else sum(violations)
        doc["status"] = "ok"
        log(
            f"placement: replicas by GPU {doc['replicas_by_gpu']}, budgets within total "
            f"{doc['all_budgets_within_total']}, violations {doc['budget_violations']}, "
            f"load sent {len(load.results)} lost {lost} failed {refused}"
        )
    except BaseException as exc:  # noqa: BLE001 - SIGTERM arrives as SystemExit; recorded
        doc.update(failed(exc, deadline))
        log(f"placement: {doc['status']}: {type(exc).__name__}: {str(exc)[:500]}")
    finally:
        cleanup_first()
        write_json(out, doc)
        try:
            launch.shutdown()
        except Exception as exc:  # noqa: BLE001
            doc["errors"].append({"error": f"shutdown: {exc!r}"})
        write_json(out, doc)
