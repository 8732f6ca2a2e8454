"""Warm Ray workers: a new replica starts in a worker that already runs, with torch, Ray
Serve's replica code and serve_app imported.

Without one, Ray starts a Python process for each new actor and the replica then imports torch,
Ray Serve and serve_app: seconds each on the path of every scale-up and replacement
(benchmarks/results/startup/startup_h200_before_warm_workers_6dfe053.json). Two of Ray's own
mechanisms take them off it:

- ``preload_python_modules``, a Ray system setting: every Python worker imports these modules
  as it starts, before it waits in the pool (a worker a replica asked for ahead of need, in a
  thread at the lowest priority, so that its imports yield the cores to the replicas serving:
  serve_app/preloading.py). ``serve-app run`` sets it
  (``system_config``); a cluster started with ``ray start`` takes it in ``--system-config``
  (``main`` prints it).
- The raylet's PrestartWorkers call (``ray_compat.prestart_workers``), the one Ray's own
  prestart uses: idle workers started ahead of time and kept ``KEEP_ALIVE_S`` against Ray's
  idle-worker reaping.

Every replica keeps its node's pool at ``warm_workers`` idle workers (``Keeper``: a check every
``CHECK_PERIOD_S``), so that the next replica on the node, a scale-up or a replacement, finds
one. A warm worker costs host memory (its imports, ``warm_worker_rss_bytes`` in the report),
no GPU memory: nothing in it touches CUDA until Ray gives it a replica and a GPU share.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypedDict

from serve_app.startup import ray_compat
from serve_app.startup.warmtokens import leave_tokens

logger = logging.getLogger("serve_app")

CHECK_PERIOD_S = 2.0
KEEP_ALIVE_S = 3600
PRESTART_TIMEOUT_S = 5.0
NEW_WORKER_WAIT_S = 3.0  # for the raylet's new workers to show among its children
# Between looks for them: each is a scan of every process on the host, in the replica's own
# process. The raylet may start fewer than asked (it caps how many start at once), and then
# the whole wait passes in these scans.
NEW_WORKER_POLL_S = 0.1
# First the module that imports the rest at the lowest priority in a warm worker, then what
# every replica imports, then what each adapter adds; serve_app.preloaded last (its import time
# marks the end of the preload).
LOW_PRIORITY_MODULE = "serve_app.preloading"
BASE_MODULES = ("torch", ray_compat.SERVE_REPLICA_MODULE, "serve_app.serving.replica")
ADAPTER_MODULES = {
    "embeddings": ("serve_app.adapters.embeddings",),
    "image-classification": ("serve_app.adapters.image",),
    "rerank": ("serve_app.adapters.rerank",),
    "text-classification": ("serve_app.adapters.textclass",),
}
MARKER_MODULE = "serve_app.preloaded"


def preload_modules(adapters: Iterable[str]) -> list[str]:
    """The modules a Ray worker should import as it starts, for replicas of ``adapters``."""
    modules = [LOW_PRIORITY_MODULE, *BASE_MODULES]
    for kind in sorted(set(adapters)):
        modules.extend(m for m in ADAPTER_MODULES.get(kind, ()) if m not in modules)
    modules.append(MARKER_MODULE)
    return modules


def app_settings(doc: dict[str, Any]) -> tuple[list[str], int]:
    """A deploy config's adapters (those of its serve_app applications) and the largest
    ``warm_workers`` among them."""
    from serve_app.config.args import parse_args

    adapters: list[str] = []
    most = 0
    for app in doc.get("applications") or []:
        if not str(app.get("import_path", "")).startswith("serve_app."):
            continue
        args = parse_args(app.get("args") or {})
        adapters.append(args.adapter)
        most = max(most, args.warm_workers)
    return adapters, most


def system_config(adapters: Iterable[str], warm_workers: int) -> dict[str, list[str]]:
    """Ray's ``_system_config`` for a cluster serving ``adapters``: the preload list, when
    warm workers are on (``warm_workers`` > 0) and there is an adapter to preload for."""
    kinds = list(adapters)
    if warm_workers <= 0 or not kinds:
        return {}
    return {"preload_python_modules": preload_modules(kinds)}


def preloaded_at_s() -> float | None:
    """When this worker finished its preload (epoch seconds), or None if it did not preload."""
    import sys

    marker = sys.modules.get(MARKER_MODULE)
    return getattr(marker, "AT_S", None)


def match_a_fresh_worker() -> int | None:
    """In a warm worker, torch's thread count as a fresh worker's would be; the count set, or
    None when this worker did not preload.

    Ray sets ``OMP_NUM_THREADS`` to the actor's ``num_cpus`` when it gives the worker the
    actor; a fresh worker imports torch after that, but a warm one imported it before, when
    OpenMP read no such variable and sized its pool to every core of the host. Left so, each
    replica's CPU work would spread over all cores and crowd its neighbours."""
    if preloaded_at_s() is None:
        return None
    threads = os.environ.get("OMP_NUM_THREADS")
    if not threads or not threads.isdigit() or int(threads) < 1:
        return None
    import torch

    torch.set_num_threads(int(threads))
    return int(threads)


def _is_idle_worker(cmdline: list[str]) -> bool:
    """Whether a command line is a Ray Python worker that is idle (its title ``ray::IDLE``) or
    still starting (default_worker.py, until it names itself)."""
    if not cmdline:
        return False
    if cmdline[0].startswith("ray::"):
        return cmdline[0].startswith("ray::IDLE")
    return any(part.endswith("default_worker.py") for part in cmdline[:3])


def _children(raylet_pid: int) -> list[tuple[int, list[str]]]:
    """The raylet's child processes: (pid, command line)."""
    import psutil

    try:
        children = psutil.Process(raylet_pid).children()
    except psutil.Error:
        return []
    out = []
    for child in children:
        try:
            out.append((child.pid, child.cmdline()))
        except psutil.Error:
            continue
    return out


def _idle_child(pid: int, raylet_pid: int) -> bool:
    """Whether ``pid`` is still one of the raylet's Python workers, idle or starting."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.ppid() == raylet_pid and _is_idle_worker(proc.cmdline())
    except psutil.Error:
        return False


def idle_workers(raylet_pid: int) -> list[int]:
    """Pids of the raylet's Python workers that are idle or still starting."""
    return [pid for pid, cmd in _children(raylet_pid) if _is_idle_worker(cmd)]


def workers_rss_bytes(pids: Iterable[int]) -> int:
    """Resident bytes of these processes together (those still there)."""
    import psutil

    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total


def prestart(
    count: int, runtime_env: str, job_id: str = "", keep_alive_s: int = KEEP_ALIVE_S
) -> None:
    """Ask this node's raylet for ``count`` idle Python workers with ``runtime_env`` (a
    serialized runtime environment: a replica takes a worker of its own environment only),
    for the job ``job_id`` (hex; the replicas' job: a task of another job cannot take them),
    kept ``keep_alive_s``.

    Raises:
        RuntimeError: not connected to Ray.
        grpc.RpcError: the raylet refused or did not answer.
    """
    ray_compat.prestart_workers(count, runtime_env, job_id, keep_alive_s, PRESTART_TIMEOUT_S)


def _read_pools(text: str) -> dict[str, list[int]]:
    """The warm workers' pids by runtime environment, from the lock file (an empty or
    unreadable file: none)."""
    try:
        pools = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    if not isinstance(pools, dict):
        return {}
    return {
        str(env): [int(p) for p in pids if isinstance(p, int)]
        for env, pids in pools.items()
        if isinstance(pids, list)
    }


def runtime_env_key(runtime_env: str, job_id: str = "") -> str:
    """A short name for a pool: a serialized runtime environment and a job (the lock file's
    key)."""
    import hashlib

    env = "default" if runtime_env in ("", "{}") else hashlib.sha256(runtime_env.encode())
    name = env if isinstance(env, str) else env.hexdigest()[:16]
    return f"{name}@{job_id}" if job_id else name


class PoolReport(TypedDict):
    """What a replica reports of its node's warm workers (``warm_workers`` in /v1/memory)."""

    target: int
    idle: int
    requested: int
    idle_rss_bytes: int
    error: str | None
    pool: str
    lock_path: str


class Keeper:
    """Keeps this node's pool at ``target`` warm workers: every ``period_s``, under a lock that
    the node's replicas share (a file in Ray's session directory, which also lists the warm
    workers' pids), counts the warm workers still idle and asks the raylet for the difference.

    Only workers asked for this way count, and only those of this replica's runtime
    environment and job: Ray gives an actor a worker of its own environment only, and an idle
    worker that once ran a task belongs to that task's job, so the raylet's idle workers in
    general are not all warm ones for this replica. Warm workers are asked for in the
    replicas' job, so that a task of another job cannot take one; a task of the replicas' own
    job still can (README, Known limits)."""

    def __init__(
        self,
        target: int,
        raylet_pid: int,
        lock_path: Path,
        period_s: float,
        runtime_env: str = "{}",
        job_id: str = "",
        first: Callable[[], object] | None = None,
        delay_s: float = 0.0,
    ):
        self.target = target
        self.first = first  # waited for before the first top-up (start_keeper)
        self.delay_s = delay_s  # then this long (args.warm_workers_delay_s)
        self.runtime_env = runtime_env
        self.job_id = job_id
        self.pool_key = runtime_env_key(runtime_env, job_id)
        self.raylet_pid = raylet_pid
        self.lock_path = lock_path
        self.period_s = period_s
        self.requested = 0  # workers this keeper asked for
        self.idle = 0  # warm workers idle or starting at the last check
        self.idle_rss_bytes = 0
        self.last_error: str | None = None
        self._stop = threading.Event()

    def check(self) -> int:
        """One top-up; how many workers it asked for."""
        with open(self.lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                lock.seek(0)
                # Only the listed pids are looked at (a few /proc reads): a scan of every
                # process, for the raylet's children, happens only when workers are asked for.
                pools = {
                    key: [p for p in pids if _idle_child(p, self.raylet_pid)]
                    for key, pids in _read_pools(lock.read()).items()
                }
                warm = pools.get(self.pool_key, [])
                missing = max(0, self.target - len(warm))
                if missing:
                    before = {pid for pid, _ in _children(self.raylet_pid)}
                    # so that they import at the lowest priority (serve_app/preloading.py)
                    leave_tokens(self.lock_path.parent, missing)
                    prestart(missing, self.runtime_env, self.job_id)
                    self.requested += missing
                    warm += self._new_workers(before, missing)
                pools[self.pool_key] = warm
                lock.seek(0)
                lock.truncate()
                lock.write(json.dumps({k: v for k, v in pools.items() if v}))
                lock.flush()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        self.idle = len(warm)
        self.idle_rss_bytes = workers_rss_bytes(warm)
        return missing

    def _new_workers(self, before: set[int], count: int) -> list[int]:
        """The pids of Python workers the raylet started since ``before`` (up to ``count``),
        waiting up to NEW_WORKER_WAIT_S for them to appear."""
        deadline = time.monotonic() + NEW_WORKER_WAIT_S
        while True:
            new = [p for p in idle_workers(self.raylet_pid) if p not in before][:count]
            if len(new) >= count or time.monotonic() >= deadline:
                return new
            time.sleep(NEW_WORKER_POLL_S)

    def run(self) -> None:
        if self.first is not None:
            try:
                self.first()
            except Exception as exc:  # noqa: BLE001 - warm workers are asked for anyway
                logger.warning("warm workers: %r before the first top-up; going on", exc)
        if self.delay_s > 0 and self._stop.wait(self.delay_s):
            return
        while not self._stop.is_set():
            try:
                if self.check():
                    logger.info("warm workers: asked for more; %d idle", self.idle)
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - keep serving; the report says why
                if self.last_error is None:
                    logger.warning("warm workers: top-up failed: %r", exc)
                self.last_error = repr(exc)[:300]
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()

    def describe(self) -> PoolReport:
        return {
            "target": self.target,
            "idle": self.idle,
            "requested": self.requested,
            "idle_rss_bytes": self.idle_rss_bytes,
            "error": self.last_error,
            "pool": self.pool_key,
            "lock_path": str(self.lock_path),
        }


def start_keeper(
    target: int, first: Callable[[], object] | None = None, delay_s: float = 0.0
) -> Keeper | None:
    """A Keeper for this node (on a daemon thread), or None when ``target`` is 0 or this is
    not a Ray worker. ``first`` runs on that thread before the first top-up: the replica waits
    there for the registry actor, whose worker would otherwise start beside the warm workers
    and could take one of their tokens, importing at the lowest priority. Then ``delay_s``
    passes: a fresh server's first seconds of serving are not shared with the warm workers'
    start-up (docs/benchmarks.md, "The first seconds after /readyz")."""
    if target <= 0:
        return None
    raylet_pid = os.environ.get("RAY_RAYLET_PID")
    if not raylet_pid:
        return None
    import ray

    session = ray_compat.session_dir()
    if session is None:
        raise RuntimeError("not connected to Ray")
    lock_path = Path(session) / "serve_app_warm_workers.lock"
    context = ray.get_runtime_context()
    runtime_env = context.get_runtime_env_string()
    job_id = context.get_job_id() or ""
    keeper = Keeper(
        target, int(raylet_pid), lock_path, CHECK_PERIOD_S, runtime_env, job_id, first, delay_s
    )
    threading.Thread(target=keeper.run, name="warm-workers", daemon=True).start()
    return keeper


def main(argv: list[str] | None = None) -> int:
    """``python -m serve_app.startup.warmpool CONFIG``: the ``--system-config`` JSON for ``ray start
    --head`` on a cluster that will serve CONFIG (what ``serve-app run`` sets itself)."""
    import sys

    from serve_app.config.deploy import load_deploy_config
    from serve_app.errors import ConfigError

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m serve_app.startup.warmpool CONFIG.yaml", file=sys.stderr)
        return 2
    try:
        config = system_config(*app_settings(load_deploy_config(args[0])))
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    print(json.dumps(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
