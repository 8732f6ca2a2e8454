"""Start-up on the GPU host: the calibration cache, end to end through Ray Serve.

One embedding replica (``num_gpus: 0.25``, dummy fp16 MiniLM) is deployed five times in turn,
each time under a new application name with the same args, and its report read from
``GET /v1/memory``:

1. an empty cache directory: calibration is measured, and an entry is written;
2. the same key again: the batch cap comes from the cache (``calibration_source: cache``), the
   same as measured, and the calibration phase is shorter;
3. the entry overwritten with garbage: ignored, measured again, rewritten whole;
4. a changed key (``dtype: float32``): measured, in a second entry beside the first;
5. the fp16 key once more: from the cache again.

Every report carries ``startup_phases_s`` and, after one request, ``first_request_s``. The
test writes ``startup_gpu_calibration_cache.json`` under ``$SERVE_APP_RESULTS_DIR`` (default
``benchmarks/results/gpu_tests``) before asserting, and prints generously: it runs unattended.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import wait_http

pytestmark = pytest.mark.gpu

MODEL = "all-MiniLM-L6-v2"
PHASES = (
    "process",
    "imports",
    "partition",
    "weights",
    "graph_capture",
    "calibration",
    "warmup",
    "total",
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _value(status: Any) -> str:
    return str(getattr(status, "value", status))


def deploy(base_url: str, name: str, args: dict[str, Any], timeout_s: float = 240.0) -> None:
    """One replica at num_gpus 0.25 under route ``/<name>``; waits until it answers."""
    from ray import serve
    from ray.serve.api import _run

    from serve_app.config.args import parse_args
    from serve_app.serving.replica import ModelServer

    log(f"deploying {name}: args={args}")
    t0 = time.monotonic()
    app = ModelServer.options(  # type: ignore[attr-defined]
        num_replicas=1,
        ray_actor_options={"num_gpus": 0.25, "num_cpus": 1},
        max_constructor_retry_count=1,
    ).bind(parse_args(args).model_dump())
    _run(app, _blocking=False, name=name, route_prefix=f"/{name}")
    deadline = time.monotonic() + timeout_s
    status = "MISSING"
    while time.monotonic() < deadline:
        got = serve.status().applications.get(name)
        status = _value(got.status) if got else "MISSING"
        if status == "RUNNING":
            break
        if status == "DEPLOY_FAILED":
            raise AssertionError(f"{name} failed to deploy: {got}")
        time.sleep(0.5)
    else:
        raise AssertionError(f"{name} not RUNNING after {timeout_s:.0f} s: {status}")
    wait_http(f"{base_url}/{name}/healthz")
    log(f"{name} running after {time.monotonic() - t0:.1f} s")


def delete(name: str) -> None:
    from ray import serve

    try:
        serve.delete(name)
        log(f"deleted {name}")
    except Exception as exc:  # noqa: BLE001 - cleanup must go on
        log(f"delete {name} failed: {exc!r}")


def one_request(base_url: str, name: str) -> None:
    body = {"input": ["a sentence to embed", "another one"], "model": MODEL}
    resp = httpx.post(f"{base_url}/{name}/v1/embeddings", json=body, timeout=60.0)
    assert resp.status_code == 200, f"{name}: {resp.status_code} {resp.text[:300]}"


def new_report(base_url: str, name: str, seen: set[str], timeout_s: float = 30.0) -> dict[str, Any]:
    """The report of ``name``'s replica: a replica id not in ``seen`` (earlier deploys' replicas
    report for a few seconds after their deletion), once it has answered a request."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        resp = httpx.get(f"{base_url}/{name}/v1/memory", timeout=30.0)
        assert resp.status_code == 200, f"GET /{name}/v1/memory: {resp.status_code}"
        for rep in resp.json()["replicas"]:
            if (
                rep.get("app") == MODEL
                and rep["replica_id"] not in seen
                and rep.get("first_request_s") is not None
            ):
                seen.add(rep["replica_id"])
                return dict(rep)
        time.sleep(0.5)
    raise AssertionError(f"no new report for {name} within {timeout_s:.0f} s")


def start_once(
    base_url: str, name: str, args: dict[str, Any], seen: set[str], cache_dir: Path
) -> dict[str, Any]:
    """Deploy, answer one request, read the report, delete; the figures of interest."""
    deploy(base_url, name, args)
    try:
        one_request(base_url, name)
        rep = new_report(base_url, name, seen)
    finally:
        delete(name)
    row = {
        "app": name,
        "dtype": args.get("dtype"),
        "calibration_source": rep.get("calibration_source"),
        "calibrated_batch_size": rep.get("calibrated_batch_size"),
        "max_batch_size": rep.get("max_batch_size"),
        "calibration_peak_bytes": rep.get("calibration_peak_bytes"),
        "cap_bytes": rep.get("cap_bytes"),
        "startup_phases_s": rep.get("startup_phases_s"),
        "first_request_s": rep.get("first_request_s"),
        "cache_files": sorted(p.name for p in cache_dir.glob("*.json")),
    }
    log(f"{name}: {json.dumps(row)}")
    return row


def test_calibration_cache_reuse_and_invalidation(
    gpu_base_url: str, results_dir: Path, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "calibration-cache"
    args = {
        "adapter": "embeddings",
        "load_format": "dummy",
        "dtype": "float16",
        "memory": {"calibration_cache_dir": str(cache_dir)},
    }
    seen: set[str] = set()
    doc: dict[str, Any] = {"cache_dir": str(cache_dir), "steps": {}}
    out = results_dir / "startup_gpu_calibration_cache.json"

    def step(key: str, name: str, step_args: dict[str, Any]) -> dict[str, Any]:
        row = start_once(gpu_base_url, name, step_args, seen, cache_dir)
        doc["steps"][key] = row
        out.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
        return row

    first = step("1_measured", "startup-cache-1", args)
    second = step("2_cached", "startup-cache-2", args)
    entries = list(cache_dir.glob("*.json"))
    for path in entries:  # 3: a corrupt entry
        path.write_text('{"format": 1, "key": {"truncated')
    third = step("3_after_corruption", "startup-cache-3", args)
    fourth = step("4_other_key", "startup-cache-4", {**args, "dtype": "float32"})
    fifth = step("5_cached_again", "startup-cache-5", args)
    log(f"wrote {out}")

    for row in (first, second, third, fourth, fifth):
        phases = row["startup_phases_s"]
        assert phases and all(p in phases for p in PHASES), row
        assert row["first_request_s"] is not None and row["first_request_s"] >= phases["total"]
    assert first["calibration_source"] == "measured", first
    assert len(entries) == 1, f"one entry after the first start: {first['cache_files']}"
    assert second["calibration_source"] == "cache", second
    assert second["max_batch_size"] == first["max_batch_size"], (first, second)
    assert second["calibrated_batch_size"] == first["calibrated_batch_size"], (first, second)
    assert second["cap_bytes"] == first["cap_bytes"], (first, second)
    assert second["startup_phases_s"]["calibration"] < first["startup_phases_s"]["calibration"], (
        first["startup_phases_s"],
        second["startup_phases_s"],
    )
    assert third["calibration_source"] == "measured", third
    assert third["max_batch_size"] == first["max_batch_size"], (first, third)
    rewritten = json.loads(entries[0].read_text())  # whole again, this replica's figures
    assert rewritten["result"]["batch_size"] == third["calibrated_batch_size"], rewritten
    assert fourth["calibration_source"] == "measured", fourth
    assert len(fourth["cache_files"]) == 2, fourth["cache_files"]
    assert fifth["calibration_source"] == "cache", fifth
    assert fifth["max_batch_size"] == first["max_batch_size"], (first, fifth)


def test_gpu_count_reads_nvml_without_torch() -> None:
    """``serve-app run`` counts the GPUs before Ray starts; through NVML, in a fresh process,
    without importing torch (1.9 to 2.5 s on the H200 host), and as many as torch then sees,
    with and without CUDA_VISIBLE_DEVICES."""
    import os
    import subprocess
    import sys

    script = (
        "import sys, json; from serve_app.ops import launch; n = launch.gpu_count(); "
        "had = 'torch' in sys.modules; import torch; "
        "print(json.dumps([n, had, torch.cuda.device_count()]))"
    )
    for visible in (None, "0"):
        env = dict(os.environ)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        count, torch_imported, torch_count = json.loads(done.stdout.strip().splitlines()[-1])
        log(f"CUDA_VISIBLE_DEVICES={visible}: NVML {count}, torch {torch_count}")
        assert count == torch_count >= 1 and not torch_imported
