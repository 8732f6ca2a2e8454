"""The headroom controller on a real GPU with real NVML, end to end through Serve and HTTP.

One embeddings deployment, 1..4 replicas at ``num_gpus: 0.25``, the ``HeadroomPolicy`` on, and
closed-loop HTTP load the whole time:

1. load: the controller scales the deployment up to 4 replicas;
2. memory grab: a separate process (not Ray's) allocates the GPU's free memory with torch until
   less than the safety margin is left: the controller sheds replicas, and no request fails;
3. release: that process frees its memory: the controller scales back up to 4 under the load.

A timeline (replicas, GPU free bytes from NVML, offered load, errors per second, controller
decision) is recorded once per second to ``$SERVE_APP_RESULTS_DIR/controller_timeline.json``
(default ``benchmarks/results/gpu_tests``) and plotted to ``controller_timeline.png`` next to
it, *before* any assertion, so a failed run still leaves its evidence. Everything is logged to
stdout: it runs unattended (``python -m pytest -m gpu tests/gpu/test_controller_gpu.py -s``).
About 3 minutes.

The memory-grabbing process's pid is ours: it is told to release through a file, and killed by
pid only if it does not exit.
"""

from __future__ import annotations

import json
import os
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
DEPLOYMENT = f"{APP}/model"
GIB = 1 << 30
MAX_REPLICAS = 4
MARGIN_BYTES = 2 * GIB
HOG_LEAVES_BYTES = GIB  # the grabbing process leaves less than the margin free
# Closed-loop clients. The load the policy sees is the requests at the replicas, which fall as
# replicas get faster: with 16 clients, H200 replicas held about 6.4 (3 replicas "in band", never
# 4: benchmarks/results/gpu_tests/controller_pytest_16_clients.log). 32 keeps the load past what
# MAX_REPLICAS hold at the target, however fast the replicas are.
CONCURRENCY = 32
ARGS = {
    "adapter": "embeddings",
    "load_format": "dummy",  # the GPU host has no weights package and no internet
    "max_batch_size": 32,
    "batch_wait_timeout_s": 0.002,
}
POLICY_KWARGS = {
    "target_ongoing_requests": 2,
    "safety_margin_bytes": MARGIN_BYTES,
    "upscale_cooldown_s": 5,
    "downscale_cooldown_s": 120,  # no load-driven scale-down during the test
    "shed_cooldown_s": 2,
    "max_reading_age_s": 15,
    "max_step_up": 3,
}
AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": MAX_REPLICAS,
    "target_ongoing_requests": 2,
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
SCALE_UP_TIMEOUT_S = 180.0
SHED_TIMEOUT_S = 60.0
OBSERVE_SHED_S = 15.0
STEADY_S = 6.0
LOAD_MAX_S = 480.0

T = TypeVar("T")


def log(msg: str) -> None:
    print(f"[controller-gpu {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f} GiB"


# ---- Serve and HTTP helpers -----------------------------------------------------------------


def deploy(base_url: str) -> str:
    from ray import serve

    from serve_app.config.args import parse_args
    from serve_app.serving.replica import ModelServer

    app_args = parse_args(ARGS).model_dump()
    log(f"deploying {APP!r}: args={ARGS} actor={ACTOR_OPTIONS} autoscaling={AUTOSCALING}")
    started = time.monotonic()
    serve.run(
        ModelServer.options(  # type: ignore[attr-defined]
            ray_actor_options=ACTOR_OPTIONS, autoscaling_config=AUTOSCALING
        ).bind(app_args),
        name=APP,
        route_prefix=PREFIX,
    )
    base = f"{base_url}{PREFIX}"
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
    log(f"{APP!r} answers at {base} after {time.monotonic() - started:.1f} s")
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


class Load:
    """Closed-loop HTTP load: ``clients`` threads, each sending one request after another
    until stopped or ``max_s`` passes. Anything but HTTP 200 counts as a failure."""

    def __init__(self, url: str, clients: int, max_s: float) -> None:
        self.url = url
        self.clients = clients
        self.max_s = max_s
        self.sent = 0
        self.ok = 0
        self.failed = 0
        self.codes: Counter[str] = Counter()
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _run(self, worker: int) -> None:
        deadline = time.monotonic() + self.max_s
        n = 0
        with httpx.Client(timeout=30.0) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                n += 1
                body = {"input": [f"client {worker} request {n}: the quick brown fox"]}
                with self._lock:
                    self.sent += 1
                try:
                    resp = client.post(self.url, json=body)
                except httpx.HTTPError as exc:
                    self._fail("transport", f"{type(exc).__name__}: {exc}")
                    continue
                if resp.status_code == 200:
                    with self._lock:
                        self.ok += 1
                        self.codes["200"] += 1
                else:
                    self._fail(str(resp.status_code), resp.text[:300])

    def _fail(self, code: str, text: str) -> None:
        with self._lock:
            self.failed += 1
            self.codes[code] += 1
            if len(self.failures) < 50:
                self.failures.append(f"{time.strftime('%H:%M:%S')} {code}: {text}")
        if len(self.failures) <= 5:
            log(f"REQUEST FAILED: {code}: {text}")

    def counts(self) -> tuple[int, int, int]:
        with self._lock:
            return self.sent, self.ok, self.failed

    def start(self) -> Load:
        log(f"starting load: {self.clients} closed-loop clients on {self.url}")
        for i in range(self.clients):
            t = threading.Thread(target=self._run, args=(i,), name=f"load-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=35.0)
        log(
            f"load stopped: sent {self.sent}, ok {self.ok}, failed {self.failed} {dict(self.codes)}"
        )


# ---- timeline -------------------------------------------------------------------------------


class Timeline:
    """One sample a second: replicas, GPU free bytes (NVML), load, errors, controller decision."""

    def __init__(self, load: Load | None = None) -> None:
        self.t0 = time.monotonic()
        self.started_at_unix_s = time.time()
        self.load = load
        self.samples: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []
        self.replica_gpus: list[str] = []
        self.extra: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timeline", daemon=True)
        self._last_counts = (0, 0, 0)
        self._last_t = 0.0

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def phase(self, name: str) -> None:
        self.phases.append({"name": name, "t_s": self.now()})
        log(f"===== phase: {name} (t={self.now():.1f} s) =====")

    def start(self) -> Timeline:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
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
        sent, ok, failed = self.load.counts() if self.load else (0, 0, 0)
        dt = max(1e-3, t - self._last_t) if self.samples else 1.0
        last_sent, last_ok, last_failed = self._last_counts
        self._last_counts, self._last_t = (sent, ok, failed), t
        sample = {
            "t_s": t,
            "phase": self.phases[-1]["name"] if self.phases else None,
            "replicas_running": states.get("RUNNING", 0),
            "replicas_total": sum(states.values()),
            "replica_states": states,
            "controller_target": decision.get("target"),
            "controller_reason": decision.get("reason"),
            "controller_detail": decision.get("detail") or decision.get("error"),
            "gpu_free_bytes": free,
            "offered_rps": round((sent - last_sent) / dt, 1),
            "ok_rps": round((ok - last_ok) / dt, 1),
            "errors_per_s": round((failed - last_failed) / dt, 1),
            "concurrency": self.load.clients if self.load else 0,
        }
        shown = self.replica_gpus or list(free)[:2]
        log(
            f"t={t:6.1f}s {str(sample['phase']):12s} replicas {states} "
            f"free {', '.join(gib(free.get(u)) for u in shown)} "
            f"sent/s {sample['offered_rps']:.0f} err/s {sample['errors_per_s']:.0f} | "
            f"{decision.get('reason')} -> {decision.get('target')}: {sample['controller_detail']}"
        )
        return sample

    def document(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "title": "serve_app headroom controller: load, memory grab, release",
            "device": _device_name(),
            "started_at_unix_s": self.started_at_unix_s,
            "margin_bytes": MARGIN_BYTES,
            "hog_leaves_bytes": HOG_LEAVES_BYTES,
            "concurrency": CONCURRENCY,
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
    expect_gpu_mode: str = "cuda",
) -> tuple[Timeline, Load]:
    """Deploy, load, grab, release; returns the timeline and the load (assert on them)."""
    import ray
    from ray import serve

    log(f"Ray resources: total {ray.cluster_resources()}, available {ray.available_resources()}")
    log(f"Serve applications before: {list(serve.status().applications)}")
    base = deploy(base_url)
    url = f"{base}/v1/embeddings"
    first = httpx.post(url, json={"input": ["hello GPU"]}, timeout=60.0)
    assert first.status_code == 200, f"first request: {first.status_code} {first.text[:500]}"
    reps = memory_doc(base)["replicas"]
    log(f"first replica: {json.dumps(reps, default=str)[:1500]}")
    assert reps and reps[0]["gpu_mode"] == expect_gpu_mode, reps

    load = Load(url, CONCURRENCY, LOAD_MAX_S)
    timeline = Timeline(load).start()
    grab: MemoryGrab | None = None
    try:
        timeline.phase("load")
        load.start()
        wait_for(
            f"a scale-up to {MAX_REPLICAS} replicas",
            replica_states,
            only(MAX_REPLICAS),
            SCALE_UP_TIMEOUT_S,
        )
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
        _, _, failed = load.counts()
        assert failed == 0, f"{failed} requests failed while scaling up: {load.failures[:5]}"

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
        load.stop()
        timeline.stop()
        if grab is not None:
            timeline.extra.update(grab.cleanup())
        timeline.extra["load"] = {
            "sent": load.sent,
            "ok": load.ok,
            "failed": load.failed,
            "codes": dict(load.codes),
            "failures": load.failures,
        }
        timeline.extra["controller_log"] = controller_log_lines()
        write_timeline(timeline, results_dir)
        try:
            serve.delete(APP)
            log(f"deleted {APP!r}")
        except Exception as exc:  # noqa: BLE001
            log(f"serve.delete({APP!r}) failed: {exc}")
    return timeline, load


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
    timeline, load = run_scenario(
        gpu_base_url,
        results_dir,
        lambda uuids: Hog(uuids, HOG_LEAVES_BYTES, tmp_path, max_s=300.0),
        expect_gpu_mode="cuda",
    )
    grab = timeline.extra.get("grab") or {}
    under = timeline.extra.get("fewest_replicas_under_grab")
    reasons = Counter(str(s["controller_reason"]) for s in timeline.samples)
    log(
        f"summary: fewest replicas under the grab {under}; reasons seen {dict(reasons)}; "
        f"grab {grab}; load {timeline.extra['load']['codes']}"
    )
    assert load.failed == 0, (
        f"{load.failed} of {load.sent} requests failed (codes {dict(load.codes)}); first: "
        f"{load.failures[:5]}"
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
