"""The headroom controller on a real GPU with real NVML, end to end through Serve and HTTP.

One embeddings deployment, 1..4 replicas at ``num_gpus: 0.25``, the ``HeadroomPolicy`` on, and
an open-loop HTTP load whose rate is set from what one replica carries, so that the scenario
needs 4 replicas however fast a replica is (issue 29, item 4):

0. probe: a separate one-replica application, same arguments, gets a closed loop of
   ``PROBE_IN_FLIGHT`` outstanding requests for ``PROBE_S`` seconds after a warm-up: its
   throughput is what one replica carries (``r1``). Requests carry 1 text, or more where the
   client could not offer 3.25 x r1 of 1-text requests (``TEXTS_PER_REQUEST``); then the
   application is deleted;
1. load: an open loop (Poisson, ``RATE_FACTOR x r1``, load_tests.harness.demand) on the
   autoscaled deployment: the controller scales it up to 4 replicas;
2. memory grab: a separate process (not Ray's) allocates the GPU's free memory with torch until
   less than the safety margin is left: the controller sheds replicas, and no request fails;
3. release: that process frees its memory: the controller scales back up to 4 under the load.

A timeline (replicas, GPU free bytes from NVML, requests due/sent/not sent/answered per second,
requests in flight, errors per second, the policy's load and decision) is recorded once per
second to ``$SERVE_APP_RESULTS_DIR/controller_timeline.json`` (default
``benchmarks/results/gpu_tests``), with the probe, the load's design and reasoning, and the
requests by phase, and plotted to ``controller_timeline.png`` next to it, *before* any
assertion, so a failed run still leaves its evidence. Everything is logged to stdout: it runs
unattended (``python -m pytest -m gpu tests/gpu/test_controller_gpu.py -s``). About 2 minutes.

The open loop never has more than its in-flight cap outstanding (about half a second of one
replica's work): while fewer than 4 replicas run (the first seconds, the grab) it cannot send
everything due, and counts what it did not send (``dropped`` by phase, ``dropped_per_s`` per
second), rather than queue past what the replicas' queues hold. Asserted: no request sent
failed, the controller shed under the grab and went back to 4. Reported, not asserted: the
requests not sent while 4 replicas ran (``phases[].dropped`` of ``at max`` and ``back at max``;
0 when 4 replicas carry the rate).

The memory-grabbing process's pid is ours: it is told to release through a file, and killed by
pid only if it does not exit. So are the open-loop client's processes.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
import pytest

from load_tests.harness.demand import DemandError, DemandPlan, phase_counts, plan_demand
from load_tests.harness.openloop import OpenLoopPool, read_progress


def _cuda_available() -> bool:
    try:
        import torch
    except Exception:  # noqa: BLE001 - no torch means no GPU test
        return False
    return bool(torch.cuda.is_available())


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU"),
    # metrics_interval_s is deprecated in favour of variables that Ray 2.60 does not read yet.
    pytest.mark.filterwarnings("ignore:The `metrics_interval_s`:DeprecationWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
APP = "controller-gpu"
PREFIX = "/controller-gpu"
PROBE_APP = "controller-gpu-probe"
PROBE_PREFIX = "/controller-gpu-probe"
DEPLOYMENT = f"{APP}/model"
GIB = 1 << 30
MAX_REPLICAS = 4
MARGIN_BYTES = 2 * GIB
HOG_LEAVES_BYTES = GIB  # the grabbing process leaves less than the margin free
ARGS = {
    "adapter": "embeddings",
    "load_format": "dummy",  # the GPU host has no weights package and no internet
    "max_batch_size": 32,
    "batch_wait_timeout_s": 0.002,
}
HEADERS = {"content-type": "application/json"}
TEXT = "an open-loop request: the quick brown fox jumps over the lazy dog"
# Texts per request: a heavier request where one replica answers more light ones than the bound
# on the client's rate allows 3.25 x of (each is probed in turn; the first that fits is used).
TEXTS_PER_REQUEST = (1, 4, 16)
# In flight x texts stays <= half a replica's max_queued_items (4096): one replica can hold all.
QUEUED_ITEMS_IN_FLIGHT = 2048
# Open loop at 3.5 x r1 (what one replica carries): 3 replicas carry <= 3 x r1, so their backlog
# grows and the load passes 1 x 3; 4 are each busy >= 87.5% with >= 1 request, so L >= 3.5 > 2.4.
TARGET_ONGOING_REQUESTS = 1
RATE_FACTOR = 3.5
MIN_RATE_FACTOR = 3.25  # the least the rate's bound may leave: 8% over what 3 replicas carry
CLIENT_PROCS = 6  # aiohttp workers, one core each; a few thousand requests/s per core
MAX_RATE_PER_S = 12_000.0  # 2,000/s per client process: the 16-core host also runs 4 replicas
IN_FLIGHT_S = 0.5  # the in-flight cap: about this long of one replica's work
# >> the 4 the policy needs; at most 2 x a replica's max_ongoing_requests (512) on one replica
MIN_IN_FLIGHT, MAX_IN_FLIGHT = 128, 1024
PROBE_IN_FLIGHT = 128  # the probe's closed loop: enough to keep one replica's batches full
PROBE_OFFERED_PER_S = 20_000.0  # the probe offers far more, so its in-flight cap always binds
PROBE_WARMUP_S = 3.0
PROBE_S = 5.0
REQUEST_TIMEOUT_S = 30.0
DRAIN_S = 10.0  # answers still due when a loop stops may take this long (a replica's queue limit)
POLICY_KWARGS = {
    "target_ongoing_requests": TARGET_ONGOING_REQUESTS,
    "safety_margin_bytes": MARGIN_BYTES,
    "upscale_cooldown_s": 5,
    "downscale_cooldown_s": 120,  # and no load-driven scale-down during the test
    "shed_cooldown_s": 2,
    "max_reading_age_s": 15,
    "max_step_up": 3,
}
DOWNSCALE_THRESHOLD = 0.8  # the policy's default (control/settings.py)
AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": MAX_REPLICAS,
    "target_ongoing_requests": TARGET_ONGOING_REQUESTS,
    "upscale_delay_s": 0,
    "downscale_delay_s": 0,
    "metrics_interval_s": 0.25,  # Ray 2.60's replica metrics push period (default 10 s)
    "look_back_period_s": 2,
    "policy": {
        "policy_function": "serve_app.autoscale:HeadroomPolicy",
        "policy_kwargs": POLICY_KWARGS,
    },
}
ACTOR_OPTIONS = {"num_cpus": 1, "num_gpus": 0.25}
SCALE_UP_TIMEOUT_S = 90.0
SHED_TIMEOUT_S = 60.0
OBSERVE_SHED_S = 15.0
STEADY_S = 6.0
LOAD_MAX_S = 300.0  # the open loop's schedule; the scenario stops it long before
STEADY_PHASES = ("at max", "back at max")  # 4 replicas run: the loop should send all it has due
LOAD_IN_DETAIL = re.compile(r"\bload (\d+(?:\.\d+)?)")

T = TypeVar("T")


def log(msg: str) -> None:
    print(f"[controller-gpu {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f} GiB"


# ---- Serve and HTTP helpers -----------------------------------------------------------------


def deploy(base_url: str, app: str, prefix: str, **options: Any) -> str:
    """``serve.run`` of ModelServer(ARGS) with ACTOR_OPTIONS and ``options``; waits for
    /healthz and returns the app's base URL."""
    from ray import serve

    from serve_app.config.args import parse_args
    from serve_app.serving.replica import ModelServer

    app_args = parse_args(ARGS).model_dump()
    log(f"deploying {app!r}: args={ARGS} actor={ACTOR_OPTIONS} {options}")
    started = time.monotonic()
    serve.run(
        ModelServer.options(  # type: ignore[attr-defined]
            ray_actor_options=ACTOR_OPTIONS, **options
        ).bind(app_args),
        name=app,
        route_prefix=prefix,
    )
    base = f"{base_url}{prefix}"
    deadline = time.monotonic() + 120.0
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=5.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{base}/healthz did not answer 200 within 120 s of serve.run")
        time.sleep(0.5)
    log(f"{app!r} answers at {base} after {time.monotonic() - started:.1f} s")
    first = httpx.post(f"{base}/v1/embeddings", content=body_of(1), headers=HEADERS, timeout=60)
    assert first.status_code == 200, f"{app}: first request: {first.status_code} {first.text[:500]}"
    return base


def replica_states() -> dict[str, int]:
    from ray import serve

    app = serve.status().applications.get(APP)
    if app is None or "model" not in app.deployments:
        return {}
    states = app.deployments["model"].replica_states
    return {str(getattr(k, "value", k)): int(v) for k, v in states.items()}


def memory_doc(base: str) -> dict[str, Any]:
    resp = httpx.get(f"{base}/v1/memory", timeout=15.0)
    assert resp.status_code == 200, f"GET /v1/memory: {resp.status_code} {resp.text[:500]}"
    doc: dict[str, Any] = resp.json()
    return doc


def wait_for(what: str, probe: Callable[[], T], ok: Callable[[T], bool], timeout_s: float) -> T:
    """Poll ``probe`` until ``ok``, logging progress; on timeout fail with the last value."""
    log(f"waiting up to {timeout_s:.0f} s for {what}")
    started = time.monotonic()
    last_log = started
    last = probe()
    while not ok(last):
        now = time.monotonic()
        if now - started > timeout_s:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}; last: {last!r}")
        if now - last_log >= 10.0:
            log(f"  still waiting for {what} ({now - started:.0f} s): {last!r}")
            last_log = now
        time.sleep(0.5)
        last = probe()
    log(f"done after {time.monotonic() - started:.1f} s: {what}: {last!r}")
    return last


def only(n: int) -> Callable[[dict[str, int]], bool]:
    return lambda s: s.get("RUNNING", 0) == n and sum(s.values()) == n


# ---- load -----------------------------------------------------------------------------------


def client_cores() -> list[int]:
    """The last CLIENT_PROCS cores this process may run on: one per open-loop worker."""
    cores = sorted(os.sched_getaffinity(0))
    return cores[-CLIENT_PROCS:]


def body_of(texts: int) -> str:
    return json.dumps({"input": [f"{TEXT} ({i})" for i in range(texts)]})


def probe_and_plan(
    base_url: str, pool: OpenLoopPool, work: Path
) -> tuple[list[dict[str, Any]], DemandPlan | None, Path | None]:
    """What one replica carries at ARGS, and the open loop that needs MAX_REPLICAS.

    A one-replica application (no autoscaling) gets a closed loop of PROBE_IN_FLIGHT
    outstanding requests: the pool offers PROBE_OFFERED_PER_S, far more than a replica answers,
    and sends only while fewer than the cap are outstanding, so each answer lets the next
    request go. Requests of 1 text first; where the bound on the client's rate leaves too little
    over 3 replicas (DemandError), heavier ones (TEXTS_PER_REQUEST). Returns every probe, the
    plan and the body file (None, None where nothing fitted or a probe's request failed). The
    application is deleted after."""
    from ray import serve

    base = deploy(base_url, PROBE_APP, PROBE_PREFIX, num_replicas=1)
    per_proc = math.ceil(PROBE_IN_FLIGHT / len(pool.procs))
    probes: list[dict[str, Any]] = []
    try:
        for texts in TEXTS_PER_REQUEST:
            body = work / f"body-{texts}.json"
            body.write_text(body_of(texts))
            log(
                f"probe: {per_proc * len(pool.procs)} outstanding requests of {texts} text(s) "
                f"against one replica for {PROBE_WARMUP_S:.0f} + {PROBE_S:.0f} s"
            )
            summary = pool.point(
                f"{base}/v1/embeddings",
                HEADERS,
                body,
                rate_per_s=PROBE_OFFERED_PER_S,
                duration_s=PROBE_S,
                warmup_s=PROBE_WARMUP_S,
                connections=per_proc * len(pool.procs),
                timeout_s=REQUEST_TIMEOUT_S,
                drain_s=DRAIN_S,
                max_in_flight=per_proc,
            )
            errors = pool.last_results
            probe = {
                "app": PROBE_APP,
                "texts_per_request": texts,
                "in_flight": per_proc * len(pool.procs),
                "offered_per_s": PROBE_OFFERED_PER_S,
                "warmup_s": PROBE_WARMUP_S,
                "duration_s": PROBE_S,
                "one_replica_per_s": summary["requests_per_s"],
                "failed": {k: v for k, v in summary["error_counts"].items() if k != "dropped"},
                "error_samples": [e for r in errors for e in r.get("error_samples", [])][:5],
                "p50_ms": summary["p50_ms"],
                "p99_ms": summary["p99_ms"],
                "client_cpu_frac_max": summary["client_cpu_frac_max"],
            }
            probes.append(probe)
            log(f"probe: one replica carries {probe['one_replica_per_s']:.0f} requests/s: {probe}")
            if summary["client_cpu_frac_max"] >= 0.9:
                log("WARNING: a client process was >= 90% busy in the probe: it may be the limit")
            if probe["failed"]:
                return probes, None, None
            try:
                plan = plan_demand(
                    probe["one_replica_per_s"],
                    want_replicas=MAX_REPLICAS,
                    target_ongoing_requests=TARGET_ONGOING_REQUESTS,
                    downscale_threshold=DOWNSCALE_THRESHOLD,
                    factor=RATE_FACTOR,
                    min_factor=MIN_RATE_FACTOR,
                    max_rate_per_s=MAX_RATE_PER_S,
                    in_flight_s=IN_FLIGHT_S,
                    min_in_flight=MIN_IN_FLIGHT,
                    max_in_flight=min(MAX_IN_FLIGHT, QUEUED_ITEMS_IN_FLIGHT // texts),
                )
            except DemandError as exc:
                probe["plan_error"] = str(exc)
                log(f"probe: no open loop of {texts}-text requests fits: {exc}")
                continue
            return probes, plan, body
    finally:
        serve.delete(PROBE_APP)
        log(f"deleted {PROBE_APP!r}")
    return probes, None, None


class OpenLoad:
    """The open loop of the scenario: ``plan.rate_per_s`` (Poisson) split over the pool's
    workers, at most ``plan.in_flight_cap`` outstanding, until ``stop``."""

    def __init__(self, pool: OpenLoopPool, url: str, body: Path, plan: DemandPlan, work: Path):
        self.pool, self.url, self.body, self.plan = pool, url, body, plan
        self.per_proc = math.ceil(plan.in_flight_cap / len(pool.procs))
        self.stop_path = work / "openloop.stop"
        self.progress: list[Path] = []
        self.summary: dict[str, Any] | None = None

    def start(self) -> OpenLoad:
        self.stop_path.unlink(missing_ok=True)
        log(
            f"starting the open loop: {self.plan.rate_per_s:.0f} requests/s (Poisson) on "
            f"{self.url}, at most {self.per_proc} x {len(self.pool.procs)} outstanding"
        )
        self.progress = self.pool.submit(
            self.url,
            HEADERS,
            self.body,
            rate_per_s=self.plan.rate_per_s,
            duration_s=LOAD_MAX_S,
            warmup_s=0.0,
            connections=self.per_proc * len(self.pool.procs),
            timeout_s=REQUEST_TIMEOUT_S,
            drain_s=DRAIN_S,
            max_in_flight=self.per_proc,
            stop_path=self.stop_path,
        )
        return self

    def counts(self) -> dict[str, int]:
        return read_progress(self.progress)

    def stop(self) -> dict[str, Any]:
        """Stop sending, wait for the answers in flight (up to DRAIN_S) and the records."""
        if self.summary is None:
            self.stop_path.write_text("stop")
            self.summary = self.pool.collect()
            log(f"open loop stopped: {self.counts()}")
        return self.summary


# ---- timeline -------------------------------------------------------------------------------


class Timeline:
    """One sample a second: replicas, GPU free bytes (NVML), the open loop's counts, the
    policy's load and decision."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.started_at_unix_s = time.time()
        self.load: OpenLoad | None = None
        self.samples: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []
        self.replica_gpus: list[str] = []
        self.extra: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timeline", daemon=True)
        self._last_counts: dict[str, int] = {}
        self._last_t = 0.0

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def phase(self, name: str) -> None:
        self.phases.append({"name": name, "t_s": self.now()})
        log(f"===== phase: {name} (t={self.now():.1f} s) =====")

    def start(self, load: OpenLoad) -> Timeline:
        """Time 0 is now; samples begin."""
        self.load = load
        self.t0 = time.monotonic()
        self.started_at_unix_s = time.time()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10.0)

    def _run(self) -> None:
        while not self._stop.wait(1.0 - ((time.monotonic() - self.t0) % 1.0)):
            try:
                self.samples.append(self.sample())
            except Exception as exc:  # noqa: BLE001 - keep sampling; the log says why
                log(f"timeline sample failed: {type(exc).__name__}: {exc}")

    def sample(self) -> dict[str, Any]:
        from serve_app.control import monitor
        from serve_app.gpu import nvml

        t = self.now()
        states = replica_states()
        free: dict[str, int] = {}
        devices = nvml.all_devices()
        if isinstance(devices, nvml.NvmlError):
            log(f"NVML reading failed: {devices.kind}: {devices.message}")
        else:
            free = {d.uuid: d.free_bytes for d in devices}
        decision: dict[str, Any] = {}
        try:
            snap = monitor.status_snapshot(timeout_s=1.0)
            rec = snap.decisions.get(DEPLOYMENT)
            if rec is not None:
                decision = {
                    "target": rec.target_replicas,
                    "reason": rec.reason,
                    "detail": rec.detail,
                }
        except Exception as exc:  # noqa: BLE001 - the sample is still useful without it
            decision = {"error": f"{type(exc).__name__}: {exc}"}
        counts = self.load.counts() if self.load else {}
        dt = max(1e-3, t - self._last_t) if self.samples else 1.0
        rate = {k: round((v - self._last_counts.get(k, 0)) / dt, 1) for k, v in counts.items()}
        self._last_counts, self._last_t = counts, t
        detail = decision.get("detail") or decision.get("error")
        policy_load = LOAD_IN_DETAIL.search(str(decision.get("detail") or ""))
        sample = {
            "t_s": t,
            "phase": self.phases[-1]["name"] if self.phases else None,
            "replicas_running": states.get("RUNNING", 0),
            "replicas_total": sum(states.values()),
            "replica_states": states,
            "controller_target": decision.get("target"),
            "controller_reason": decision.get("reason"),
            "controller_detail": detail,
            # the policy's load (running + queued requests over its look-back window), when the
            # decision's sentence gives it
            "policy_load": float(policy_load.group(1)) if policy_load else None,
            "gpu_free_bytes": free,
            "scheduled_rps": rate.get("due", 0.0),  # due by the open loop's schedule
            "offered_rps": rate.get("sent", 0.0),  # sent
            "dropped_per_s": rate.get("dropped", 0.0),  # due but not sent: at the in-flight cap
            "ok_rps": rate.get("ok", 0.0),
            "errors_per_s": rate.get("failed", 0.0),
            "in_flight": counts.get("in_flight", 0),
        }
        shown = self.replica_gpus or list(free)[:2]
        log(
            f"t={t:6.1f}s {str(sample['phase']):12s} replicas {states} "
            f"free {', '.join(gib(free.get(u)) for u in shown)} "
            f"due/s {sample['scheduled_rps']:.0f} sent/s {sample['offered_rps']:.0f} "
            f"not sent/s {sample['dropped_per_s']:.0f} ok/s {sample['ok_rps']:.0f} "
            f"err/s {sample['errors_per_s']:.0f} in flight {sample['in_flight']} | "
            f"{decision.get('reason')} -> {decision.get('target')}: {detail}"
        )
        return sample

    def document(self) -> dict[str, Any]:
        return {
            "schema_version": 2,
            "title": "serve_app headroom controller: open-loop load, memory grab, release",
            "device": _device_name(),
            "started_at_unix_s": self.started_at_unix_s,
            "margin_bytes": MARGIN_BYTES,
            "hog_leaves_bytes": HOG_LEAVES_BYTES,
            "args": ARGS,
            "ray_actor_options": ACTOR_OPTIONS,
            "autoscaling_config": AUTOSCALING,
            "replica_gpus": self.replica_gpus,
            "phases": self.phases,
            "samples": self.samples,
            **self.extra,
        }


def _device_name() -> str:
    try:
        import torch

        return str(torch.cuda.get_device_name(0))
    except Exception:  # noqa: BLE001
        return "unknown"


def write_timeline(timeline: Timeline, results_dir: Path) -> None:
    """JSON first, then the PNG; a plotting problem is logged, never raised."""
    path = results_dir / "controller_timeline.json"
    path.write_text(json.dumps(timeline.document(), indent=2, default=str))
    log(f"wrote {path} ({len(timeline.samples)} samples)")
    try:
        from load_tests.harness.plots import plot_timeline

        png = plot_timeline(timeline.document(), results_dir / "controller_timeline.png")
        log(f"wrote {png}")
    except Exception as exc:  # noqa: BLE001 - the JSON is the record; the plot can be redone
        log(
            f"plotting failed ({type(exc).__name__}: {exc}); run: python -m "
            f"load_tests.harness.plots {path}"
        )


# ---- the memory-grabbing process ------------------------------------------------------------

HOG_SCRIPT = r'''
"""Allocate the free memory of the GPUs named by UUID until LEAVE bytes are left, report, hold
until the release file appears (or MAX_S passes), then exit (which frees everything)."""
import json, os, sys, time
import torch
from serve_app.gpu.devices import format_uuid

uuids = set(sys.argv[1].split(","))
leave, ready, release, max_s = int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
held, report = [], {}
for i in range(torch.cuda.device_count()):
    uuid = format_uuid(torch.cuda.get_device_properties(i).uuid)
    if uuid not in uuids:
        continue
    dev = torch.device("cuda", i)
    torch.zeros(1, device=dev)  # the CUDA context first: it takes memory too
    chunk, grabbed = 1 << 30, 0
    while chunk >= (32 << 20):
        free, total = torch.cuda.mem_get_info(dev)
        want = free - leave
        if want < (32 << 20):
            break
        n = min(chunk, want) // (2 << 20) * (2 << 20)
        try:
            held.append(torch.empty(n, dtype=torch.uint8, device=dev))
            grabbed += n
        except RuntimeError:  # torch.OutOfMemoryError: someone else took it first
            chunk //= 2
    free, total = torch.cuda.mem_get_info(dev)
    report[uuid] = {"torch_index": i, "grabbed_bytes": grabbed, "free_bytes": free,
                    "total_bytes": total}
    print(f"hog: {uuid} (cuda:{i}) grabbed {grabbed / 2**30:.2f} GiB, "
          f"free now {free / 2**30:.2f} GiB of {total / 2**30:.2f} GiB", flush=True)
if not report:
    report = {"error": f"no visible CUDA device has UUID in {sorted(uuids)} "
              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"}
tmp = ready + ".tmp"
with open(tmp, "w") as f:
    json.dump(report, f)
os.replace(tmp, ready)
deadline = time.time() + max_s
while not os.path.exists(release) and time.time() < deadline:
    time.sleep(0.1)
print("hog: releasing", "(told to)" if os.path.exists(release) else "(timed out)", flush=True)
del held
torch.cuda.empty_cache()
'''


class MemoryGrab(Protocol):
    def start(self) -> dict[str, Any]: ...

    def release(self) -> None: ...

    def cleanup(self) -> dict[str, Any]: ...


class Hog:
    """The memory-grabbing subprocess (not a Ray worker: an 'other process' on the GPU)."""

    def __init__(self, uuids: list[str], leave_bytes: int, workdir: Path, max_s: float) -> None:
        self.uuids = uuids
        self.leave_bytes = leave_bytes
        self.workdir = workdir
        self.max_s = max_s
        self.script = workdir / "hog.py"
        self.ready = workdir / "hog.ready.json"
        self.release_file = workdir / "hog.release"
        self.log_path = workdir / "hog.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> dict[str, Any]:
        self.script.write_text(HOG_SCRIPT)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        args = [
            sys.executable,
            str(self.script),
            ",".join(self.uuids),
            str(self.leave_bytes),
            str(self.ready),
            str(self.release_file),
            str(self.max_s),
        ]
        log(f"starting the memory grab on {self.uuids}, leaving {gib(self.leave_bytes)} free")
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env
            )
        deadline = time.monotonic() + 120.0
        while not self.ready.exists():
            if self.proc.poll() is not None:
                pytest.fail(f"the memory grab exited with {self.proc.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"the memory grab was not ready in 120 s:\n{self.output()}")
            time.sleep(0.2)
        report: dict[str, Any] = json.loads(self.ready.read_text())
        log(f"memory grab holding (pid {self.proc.pid}): {report}")
        if "error" in report:
            pytest.fail(f"the memory grab found no GPU to fill: {report['error']}")
        return report

    def release(self) -> None:
        log("telling the memory grab to release")
        self.release_file.write_text("release")
        if self.proc is not None:
            try:
                self.proc.wait(timeout=60.0)
            except subprocess.TimeoutExpired:
                log(f"memory grab (pid {self.proc.pid}) did not exit in 60 s: killing it")
                self.proc.kill()
                self.proc.wait(timeout=10.0)
            log(f"memory grab exited with {self.proc.returncode}")

    def cleanup(self) -> dict[str, Any]:
        if self.proc is not None and self.proc.poll() is None:
            self.release_file.write_text("release")
            try:
                self.proc.wait(timeout=30.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10.0)
        return {"hog_output": self.output(), "hog_returncode": self.proc and self.proc.returncode}

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


# ---- the scenario ---------------------------------------------------------------------------


def run_scenario(
    base_url: str,
    results_dir: Path,
    make_grab: Callable[[list[str]], MemoryGrab],
    work: Path,
    expect_gpu_mode: str = "cuda",
) -> Timeline:
    """Probe, deploy, load, grab, release; returns the timeline (assert on it). Its JSON is
    written whatever happens."""
    import ray
    from ray import serve

    log(f"Ray resources: total {ray.cluster_resources()}, available {ray.available_resources()}")
    log(f"Serve applications before: {list(serve.status().applications)}")
    timeline = Timeline()
    grab: MemoryGrab | None = None
    load: OpenLoad | None = None
    pool: OpenLoopPool | None = None
    deployed = False
    try:
        cores = client_cores()
        log(f"open-loop client: {len(cores)} aiohttp processes on cores {cores}")
        pool = OpenLoopPool(cores, None, work)
        probes, plan, body = probe_and_plan(base_url, pool, work)
        timeline.extra["probes"] = probes
        assert not probes[-1]["failed"], f"the probe's requests failed: {probes[-1]}"
        if plan is None or body is None:
            pytest.fail(f"no open loop that needs {MAX_REPLICAS} replicas fits: {probes}")
        timeline.extra["probe"] = probes[-1]
        timeline.extra["load_design"] = {
            **plan.as_dict(),
            "texts_per_request": probes[-1]["texts_per_request"],
        }
        log(f"load design: {plan.reasoning}")

        deployed = True
        base = deploy(base_url, APP, PREFIX, autoscaling_config=AUTOSCALING)
        reps = memory_doc(base)["replicas"]
        log(f"first replica: {json.dumps(reps, default=str)[:1500]}")
        assert reps and reps[0]["gpu_mode"] == expect_gpu_mode, reps

        load = OpenLoad(pool, f"{base}/v1/embeddings", body, plan, work)
        timeline.start(load)
        timeline.phase("load")
        load.start()
        wait_for(
            f"a scale-up to {MAX_REPLICAS} replicas",
            replica_states,
            only(MAX_REPLICAS),
            SCALE_UP_TIMEOUT_S,
        )
        timeline.phase("at max")
        reports = wait_for(
            f"{MAX_REPLICAS} replica memory reports",
            lambda: memory_doc(base)["replicas"],
            lambda r: len(r) == MAX_REPLICAS,
            30.0,
        )
        timeline.replica_gpus = sorted({r["gpu_uuid"] for r in reports if r.get("gpu_uuid")})
        timeline.extra["reports_at_max"] = reports
        log(
            f"replicas run on {timeline.replica_gpus}; budgets "
            f"{[gib(r['budget_bytes']) for r in reports]}"
        )
        time.sleep(STEADY_S)  # steady state at max (and past the policy's flip interval)
        failed = load.counts()["failed"]
        assert failed == 0, f"{failed} requests failed while scaling up; see the timeline JSON"

        timeline.phase("memory grab")
        grab = make_grab(timeline.replica_gpus)
        timeline.extra["grab"] = grab.start()
        timeline.phase("grab holds")
        wait_for(
            "the controller to shed at least one replica",
            replica_states,
            lambda s: s.get("RUNNING", 0) < MAX_REPLICAS,
            SHED_TIMEOUT_S,
        )
        log(f"observing the shed for {OBSERVE_SHED_S:.0f} s")
        time.sleep(OBSERVE_SHED_S)
        grab_samples = [s for s in timeline.samples if s["phase"] in ("memory grab", "grab holds")]
        timeline.extra["fewest_replicas_under_grab"] = min(
            (s["replicas_running"] for s in grab_samples), default=None
        )

        timeline.phase("release")
        grab.release()
        wait_for(
            f"a scale back up to {MAX_REPLICAS} replicas",
            replica_states,
            only(MAX_REPLICAS),
            SCALE_UP_TIMEOUT_S,
        )
        timeline.phase("back at max")
        time.sleep(STEADY_S)
        timeline.phase("end")
        try:
            cli = subprocess.run(
                [sys.executable, "-m", "serve_app", "status", "--url", base],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
            log(f"serve-app status:\n{cli.stdout}{cli.stderr}")
            timeline.extra["serve_app_status"] = cli.stdout
        except Exception as exc:  # noqa: BLE001 - evidence only
            log(f"serve-app status failed: {exc}")
    finally:
        end_s = timeline.now()
        if load is not None:
            try:
                summary = load.stop()
                timeline.extra["load"] = load_record(load, summary, timeline, end_s)
            except Exception as exc:  # noqa: BLE001 - the timeline is still written
                log(f"stopping the open loop failed: {type(exc).__name__}: {exc}")
                timeline.extra["load"] = {"error": f"{type(exc).__name__}: {exc}"}
        timeline.stop()
        if grab is not None:
            timeline.extra.update(grab.cleanup())
        timeline.extra["controller_log"] = controller_log_lines()
        write_timeline(timeline, results_dir)
        if deployed:
            try:
                serve.delete(APP)
                log(f"deleted {APP!r}")
            except Exception as exc:  # noqa: BLE001
                log(f"serve.delete({APP!r}) failed: {exc}")
        if pool is not None:
            pool.close()
    return timeline


def load_record(
    load: OpenLoad, summary: dict[str, Any], timeline: Timeline, end_s: float
) -> dict[str, Any]:
    """The open loop's totals, its requests by phase, and what the client did while 4
    replicas ran (``sent``, ``ok`` and ``failed`` are what the assertions and the docs read)."""
    offset_s = float(summary["start_at_unix"]) - timeline.started_at_unix_s
    # each worker's clock starts when it is ready, start_late_s after the common start
    arrays = []
    for rows, result in zip(load.pool.last_arrays, load.pool.last_results, strict=True):
        shifted = rows.copy()
        shifted[0] += float(result.get("start_late_s", 0.0))
        arrays.append(shifted)
    # the last phase lasts until the last request scheduled before the stop
    last_s = max((float(a[0].max()) + offset_s for a in arrays if a.shape[1]), default=end_s)
    phases = phase_counts(arrays, offset_s, timeline.phases, max(end_s, last_s + 1e-3))
    samples = [s for s in timeline.samples if s["phase"] in STEADY_PHASES]
    loads = [s["policy_load"] for s in samples if s.get("policy_load") is not None]
    steady = [p for p in phases if p["name"] in STEADY_PHASES]
    record = {
        "kind": "open loop, Poisson",
        "rate_per_s": load.plan.rate_per_s,
        "in_flight_cap": load.per_proc * len(load.pool.procs),
        "client_procs": len(load.pool.procs),
        "scheduled": sum(p["scheduled"] for p in phases),
        "sent": sum(p["sent"] for p in phases),
        "dropped": sum(p["dropped"] for p in phases),
        "ok": sum(p["ok"] for p in phases),
        "failed": sum(p["failed"] for p in phases),
        "codes": summary["error_counts"],
        "failures": [e for r in load.pool.last_results for e in r.get("error_samples", [])],
        "send_lag_p99_ms": summary["send_lag_p99_ms"],
        "client_cpu_frac_max": summary["client_cpu_frac_max"],
        "phases": phases,
        "at_max": {
            "dropped": sum(p["dropped"] for p in steady),
            "in_flight_mean": round(sum(s["in_flight"] for s in samples) / len(samples), 1)
            if samples
            else None,
            "policy_load_min": min(loads, default=None),
            "policy_load_max": max(loads, default=None),
            "note": "while 4 replicas ran: due requests the client did not send (0 when they "
            "carry the rate), the requests in flight at the client, and the load the policy "
            f"read (Little's law says >= {load.plan.min_load_at_want:.2f})",
        },
    }
    for p in phases:
        log(
            f"  {p['name']:12s} {p['span_s']:6.1f} s: due {p['scheduled']:7d} sent {p['sent']:7d} "
            f"not sent {p['dropped']:7d} ok {p['ok']:7d} failed {p['failed']} "
            f"p50 {p['p50_ms']} ms p99 {p['p99_ms']} ms"
        )
    if record["at_max"]["dropped"]:
        log(
            f"NOTE: {record['at_max']['dropped']} requests due while 4 replicas ran were not sent "
            "(the in-flight cap): 4 replicas did not carry the whole rate there"
        )
    return record


def controller_log_lines(limit: int = 400) -> list[str]:
    """The policy's decision lines from the Serve controller's log (evidence for the docs)."""
    from serve_app.startup import ray_compat

    session = Path(ray_compat.session_dir() or "/tmp/ray/session_latest")
    lines: list[str] = []
    for path in sorted((session / "logs" / "serve").glob("controller_*.log")):
        try:
            for line in path.read_text(errors="replace").splitlines():
                if f"serve_app autoscale {DEPLOYMENT}" in line:
                    lines.append(line.strip())
        except OSError:
            continue
    return lines[-limit:]


# ---- the test -------------------------------------------------------------------------------


def test_controller_sheds_on_memory_grab_and_scales_back(
    gpu_base_url: str, results_dir: Path, tmp_path: Path
) -> None:
    timeline = run_scenario(
        gpu_base_url,
        results_dir,
        lambda uuids: Hog(uuids, HOG_LEAVES_BYTES, tmp_path, max_s=300.0),
        tmp_path,
        expect_gpu_mode="cuda",
    )
    grab = timeline.extra.get("grab") or {}
    load = timeline.extra["load"]
    assert "error" not in load, f"the open loop's records are missing: {load}"
    under = timeline.extra.get("fewest_replicas_under_grab")
    reasons = Counter(str(s["controller_reason"]) for s in timeline.samples)
    log(
        f"summary: fewest replicas under the grab {under}; reasons seen {dict(reasons)}; "
        f"grab {grab}; load sent {load['sent']}, ok {load['ok']}, failed {load['failed']}, "
        f"not sent {load['dropped']} (at max: {load['at_max']})"
    )
    assert load["sent"] > 0 and load["failed"] == 0, (
        f"{load['failed']} of {load['sent']} requests failed (codes {load['codes']}); first: "
        f"{load['failures'][:5]}"
    )
    assert under is not None and under < MAX_REPLICAS, (
        f"the controller did not shed under the memory grab (fewest replicas {under})"
    )
    shed_seen = any(
        s["controller_reason"] == "shed_memory_pressure"
        or "< margin" in str(s.get("controller_detail"))
        for s in timeline.samples
    )
    assert shed_seen or any(
        "shed_memory_pressure" in line for line in timeline.extra["controller_log"]
    ), f"no shed decision in the timeline or the controller log; reasons seen {dict(reasons)}"
