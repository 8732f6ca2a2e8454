"""The headroom controller end to end on the real Ray cluster, with NVML scripted.

Replica stats -> node monitor -> HeadroomPolicy in the Serve controller -> Serve replica count,
driven by real HTTP load through the HAProxy ingress. The replicas run MiniLM on the CPU while
holding a quarter of the cluster's logical GPU; with ``SERVE_APP_FAKE_NVML`` set they name that
GPU through the script and budget a quarter of its scripted total ("logical-scripted" mode), so
the only thing not real here is the NVML reading, which the tests rewrite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve_app.control import readings
from tests.helpers import wait_for
from tests.integration.conftest import Cluster

APP = "controller"
PREFIX = "/controller"
DEPLOYMENT = f"{APP}/model"
GIB = 1 << 30
TOTAL_BYTES = 80 * GIB
UUID = "GPU-c0ffee00-0000-4000-8000-000000000001"
LABEL = readings.gpu_label(readings.gpu_key(UUID))  # how the planner names the GPU
MARGIN_BYTES = 2 * GIB
PLENTY_FREE_BYTES = TOTAL_BYTES - GIB
ARGS = {"adapter": "embeddings", "max_batch_size": 4, "batch_wait_timeout_s": 0.002}
POLICY_KWARGS = {
    "target_ongoing_requests": 1,
    "safety_margin_bytes": MARGIN_BYTES,
    "upscale_cooldown_s": 1,
    "downscale_cooldown_s": 5,
    "shed_cooldown_s": 1,
    "max_reading_age_s": 30,
}
AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 4,
    "target_ongoing_requests": 1,
    "upscale_delay_s": 0,
    "downscale_delay_s": 0,
    # Ray Serve 2.60 pushes replica metrics every metrics_interval_s (default 10 s; the
    # RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S variable is not read), and records
    # them every 0.2 x look_back_period_s, which must be above metrics_interval_s.
    "metrics_interval_s": 1,
    "look_back_period_s": 2,
    "policy": {
        "policy_function": "serve_app.autoscale:HeadroomPolicy",
        "policy_kwargs": POLICY_KWARGS,
    },
}
LOAD_THREADS = 8
ROOT = Path(__file__).resolve().parents[2]

# metrics_interval_s is deprecated in favour of environment variables that 2.60 does not read yet.
pytestmark = pytest.mark.filterwarnings("ignore:The `metrics_interval_s`:DeprecationWarning")


# --------------------------------------------------------------------------- helpers


def write_script(path: Path, free_bytes: int) -> None:
    """Point the scripted NVML at one GPU with ``free_bytes`` free; atomic, so a reader never
    sees half a file."""
    doc = {"devices": {UUID: {"total_bytes": TOTAL_BYTES, "free_bytes": free_bytes}}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def replica_states() -> dict[str, int]:
    from ray import serve

    app = serve.status().applications.get(APP)
    if app is None or "model" not in app.deployments:
        return {}
    states = app.deployments["model"].replica_states
    return {str(getattr(k, "value", k)): int(v) for k, v in states.items()}


def running(states: dict[str, int]) -> int:
    return states.get("RUNNING", 0)


def memory_doc(base: str) -> dict[str, Any]:
    resp = httpx.get(f"{base}/v1/memory", timeout=10.0)
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


def decision(base: str) -> dict[str, Any]:
    controller: dict[str, Any] = memory_doc(base).get("controller") or {}
    return dict(controller.get(DEPLOYMENT) or {})


class Load:
    """Closed-loop HTTP load: ``threads`` clients, each sending one request after another until
    stopped (or ``max_s`` passes). Counts every status code and every transport error."""

    def __init__(self, url: str, threads: int = LOAD_THREADS, max_s: float = 120.0) -> None:
        self.url = url
        self.threads = threads
        self.max_s = max_s
        self.codes: Counter[int] = Counter()
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def _run(self, worker: int) -> None:
        deadline = time.monotonic() + self.max_s
        body = {"model": "all-MiniLM-L6-v2", "input": [f"load from client {worker}"]}
        with httpx.Client(timeout=30.0) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    resp = client.post(self.url, json=body)
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                with self._lock:
                    self.codes[resp.status_code] += 1
                    if resp.status_code >= 500:
                        self.errors.append(f"{resp.status_code}: {resp.text[:200]}")

    def start(self) -> Load:
        for i in range(self.threads):
            t = threading.Thread(target=self._run, args=(i,), name=f"load-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(timeout=35.0)

    def ok(self) -> int:
        with self._lock:
            return self.codes[200]

    def failures(self) -> list[str]:
        with self._lock:
            return list(self.errors)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def app(cluster: Cluster) -> Iterator[str]:
    """The embeddings app with the headroom controller on; the NVML script restored after."""
    original = cluster.nvml_script.read_text()
    write_script(cluster.nvml_script, PLENTY_FREE_BYTES)
    base = cluster.deploy(
        APP,
        PREFIX,
        ARGS,
        ray_actor_options={"num_cpus": 0.5, "num_gpus": 0.25},
        autoscaling_config=AUTOSCALING,
    )
    try:
        yield base
    finally:
        cluster.delete(APP)
        cluster.nvml_script.write_text(original)


@pytest.fixture
def load_url(app: str) -> str:
    return f"{app}/v1/embeddings"


def at_min(app: str) -> None:
    wait_for("one replica and nothing starting or stopping", replica_states, _only_one, 60.0)


def _only_one(states: dict[str, int]) -> bool:
    return running(states) == 1 and sum(states.values()) == 1


# --------------------------------------------------------------------------- tests


def test_load_scales_up_memory_pressure_sheds_and_status_says_why(
    cluster: Cluster, app: str, load_url: str
) -> None:
    write_script(cluster.nvml_script, PLENTY_FREE_BYTES)
    at_min(app)
    report = wait_for(
        "the replica's memory report",
        lambda: memory_doc(app)["replicas"],
        lambda reps: len(reps) == 1,
        30.0,
    )[0]
    assert report["gpu_mode"] == "logical-scripted", report
    assert report["gpu_uuid"] == UUID, report
    assert report["budget_bytes"] == TOTAL_BYTES // 4, report
    assert report["torch_fraction"] == 0.0, report  # no CUDA: no torch cap

    load = Load(load_url).start()
    try:
        states = wait_for(
            "a scale-up to >= 2 replicas", replica_states, lambda s: running(s) >= 2, 60
        )
        print(f"scaled up under load: {states}, {load.ok()} requests served so far")

        # Another process takes the GPU's memory: free falls below the margin.
        write_script(cluster.nvml_script, MARGIN_BYTES // 2)
        wait_for("the shed back to min_replicas (1)", replica_states, _only_one, 60.0)
        held = wait_for(
            "the controller's reason for holding at min under memory pressure",
            lambda: decision(app),
            lambda d: d.get("reason") == "hold_at_min",
            20.0,
        )
        assert held["target_replicas"] == 1, held
        assert "< margin 2.00 GiB" in held["detail"], held
        served_during_shed = load.ok()
    finally:
        load.stop()
    assert served_during_shed > 0
    assert load.failures() == [], f"requests failed while shedding: {load.failures()[:5]}"
    assert set(load.codes) == {200}, load.codes

    cli = subprocess.run(
        [sys.executable, "-m", "serve_app", "status", "--url", app],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert cli.returncode == 0, cli.stderr
    assert f"controller {DEPLOYMENT}: 1 -> 1 (hold_at_min): {LABEL} free 1.00 GiB" in cli.stdout, (
        cli.stdout
    )

    # Memory back, load gone: the controller settles in band at min, and says so. On a loaded
    # host the last load samples can still be in its look-back window when memory returns (CI
    # once saw a step to 2, in band there); it must come back to 1 once they age out.
    write_script(cluster.nvml_script, PLENTY_FREE_BYTES)
    settled = wait_for(
        "the controller to settle in band at min",
        lambda: decision(app),
        lambda d: d.get("reason") == "hold_in_band" and d.get("target_replicas") == 1,
        45.0,
    )
    assert settled["target_replicas"] == 1, settled
    wait_for("one replica running", replica_states, lambda s: running(s) == 1, 30.0)


def test_bad_reading_never_scales_up_under_load(cluster: Cluster, app: str, load_url: str) -> None:
    at_min(app)
    write_script(cluster.nvml_script, TOTAL_BYTES + GIB)  # free > total: a broken reading
    held = wait_for(
        "the controller to hold on the bad reading",
        lambda: decision(app),
        lambda d: d.get("reason") == "hold_bad_reading",
        20.0,
    )
    assert "free" in held["detail"] and "> total" in held["detail"], held

    load = Load(load_url).start()
    seen: list[dict[str, int]] = []
    try:
        # Good readings scale this load up within a few seconds (the test above).
        until = time.monotonic() + 8.0
        while time.monotonic() < until:
            seen.append(replica_states())
            time.sleep(0.25)
        still = decision(app)
    finally:
        load.stop()
        write_script(cluster.nvml_script, PLENTY_FREE_BYTES)
    assert load.ok() > 0
    assert load.failures() == [], load.failures()[:5]
    grew = [s for s in seen if sum(s.values()) > 1]
    assert grew == [], f"the controller added replicas on a bad reading: {grew[:3]}"
    assert still.get("reason") == "hold_bad_reading", still
    assert still.get("target_replicas") == 1, still
