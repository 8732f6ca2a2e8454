"""Warm workers on a real Ray cluster (preloaded as serve-app run starts it): the first
replica's keeper asks the raylet for idle workers, and a scale-up's replica starts in one of
them, its imports done before it was asked for."""

from __future__ import annotations

import fcntl
import json
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from serve_app.startup import warmpool
from tests.helpers import wait_for

MODEL = "warm-minilm"
WAIT_S = 120.0
ARGS = {
    "adapter": "embeddings",
    "model_name": MODEL,
    "max_batch_size": 8,
    "warm_workers": 2,
    "warm_workers_delay_s": 0.0,  # at once: the pool is what this test looks at
}
OPTIONS: dict[str, dict[str, Any]] = {"ray_actor_options": {"num_cpus": 0.25}}


def mine(base: str) -> list[dict[str, Any]]:
    reports = httpx.get(f"{base}/v1/memory", timeout=30.0).json()["replicas"]
    return [r for r in reports if r["app"] == MODEL]


def settled(pids: set[int]) -> bool:
    """Whether these workers have connected to Ray (torch mapped: the preload runs after the
    worker registered) and finished importing (no CPU time spent over a second)."""

    def cpu_s(proc: psutil.Process) -> float:
        times = proc.cpu_times()
        return float(times.user + times.system)

    try:
        procs = [psutil.Process(pid) for pid in pids]
        if not all(any("libtorch" in m.path for m in p.memory_maps()) for p in procs):
            return False
        before = [cpu_s(p) for p in procs]
        time.sleep(1.0)
        return all(cpu_s(p) - b < 0.05 for p, b in zip(procs, before, strict=True))
    except psutil.Error:
        return False


@pytest.mark.parametrize(
    "runtime_env",
    [None, {"env_vars": {"SERVE_APP_WARM_TEST": "1"}}],
    ids=["default-env", "own-env-vars"],
)
def test_scale_up_starts_in_a_warm_worker(cluster, runtime_env: dict[str, Any] | None) -> None:
    """Also for an app with its own runtime environment, whose replicas Ray places only in
    workers of that environment (the keeper asks for those)."""
    options: dict[str, Any] = {"ray_actor_options": {**OPTIONS["ray_actor_options"]}}
    if runtime_env:
        options["ray_actor_options"]["runtime_env"] = runtime_env
    base = cluster.deploy("warm", "/warm", ARGS, num_replicas=1, **options)
    try:
        first = wait_for(
            "the keeper's pool",
            lambda: [
                r
                for r in mine(base)
                if (r["warm_workers"] or {}).get("idle", 0) >= 2
                and r["warm_workers"]["error"] is None
                # a report outlives its replica by up to REPORT_MAX_AGE_S: the previous
                # variant's replica of the same app can still be listed, its process gone
                and psutil.pid_exists(r["pid"])
            ],
            bool,
            WAIT_S,
        )[0]
        raylet_pid = psutil.Process(first["pid"]).ppid()
        if not runtime_env:
            # Earlier tests in this session ran Ray tasks, and a task can take a warm worker of
            # the default environment; Ray then keeps that worker for the task's job and gives
            # it no replica, while it still looks idle (README, Known limits). Start the default
            # pool afresh, as on a cluster that runs no tasks beside serve_app: the keeper asks
            # for new workers at its next check.
            lock = Path(first["warm_workers"]["lock_path"])
            pool = first["warm_workers"]["pool"]
            with lock.open("r+") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                pools = json.loads(f.read() or "{}")
                pools.pop(pool, None)
                f.seek(0)
                f.truncate()
                f.write(json.dumps(pools))
            wait_for(
                "a fresh default pool",
                lambda: len(json.loads(lock.read_text() or "{}").get(pool, [])),
                lambda n: n >= 2,
                WAIT_S,
            )
        idle_before = set(warmpool.idle_workers(raylet_pid))
        assert len(idle_before) >= 2, idle_before
        # Ray hands an actor only a worker that has registered; on a busy machine a new one
        # takes seconds to start, then imports the preload list.
        wait_for("the warm workers settled", lambda: settled(idle_before), bool, WAIT_S)

        asked_at = time.time()
        cluster.deploy("warm", "/warm", ARGS, num_replicas=2, **options)
        reps = wait_for(
            "the second replica's report", lambda: mine(base), lambda r: len(r) == 2, WAIT_S
        )
        new = next(r for r in reps if r["replica_id"] != first["replica_id"])
        # It took a worker that was idle before it was asked for, preloaded: no imports of its own.
        pools = Path(first["warm_workers"]["lock_path"]).read_text()
        assert new["pid"] in idle_before, (new["pid"], idle_before, pools)
        assert psutil.Process(new["pid"]).create_time() < asked_at
        assert new["preloaded_worker"] is True
        assert new["startup_phases_s"]["imports"] == 0.0
        assert new["worker_waited_s"] is not None and new["worker_waited_s"] >= 0.0
        # torch's threads as in a fresh worker: num_cpus 0.25 -> Ray's OMP_NUM_THREADS=1, which
        # the preload (before Ray set it) did not see.
        assert new["torch_threads"] == 1, new["torch_threads"]
        # ...and it serves.
        resp = httpx.post(
            f"{base}/v1/embeddings", json={"input": "warm", "model": MODEL}, timeout=60.0
        )
        assert resp.status_code == 200, resp.text
        # The pool is topped up again.
        wait_for(
            "the pool topped up",
            lambda: len(warmpool.idle_workers(raylet_pid)),
            lambda n: n >= 2,
            WAIT_S,
        )
    finally:
        cluster.delete("warm")
