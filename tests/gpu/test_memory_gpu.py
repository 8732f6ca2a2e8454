"""GPU memory partitioning on the GPU host, end to end through Ray Serve and HTTP.

1. Four embedding replicas at ``num_gpus: 0.25`` under a minute of concurrent load: NVML's bytes
   for each replica's process never exceed its budget.
2. One replica with a small ``memory_fraction`` gets batches too big for it (OOM under its cap,
   split and retried) while three others serve steady load. Isolation is asserted through
   errors and memory: the oversized replica stays up, answers only 200 or 507 (200 at least
   once) and recovers from at least one OOM, and NVML's bytes for its process never pass its
   cap; the steady replicas answer every request 200, recover from no OOM, and NVML's bytes for
   each of their processes never pass its budget (all four sampled every 0.1 s). The steady
   replicas' latency beside it (p50, p99, and the p99 against a baseline) is reported in the
   JSON, not asserted: see the test's docstring.
3. A budget that cannot hold the CUDA context, and one that cannot hold the model, fail at
   start-up with a message that names the setting to change; other apps keep serving and the GPU
   memory comes back.
4. Cache policies: after one large batch, ``always`` and ``threshold`` give the cache back,
   ``never`` keeps it.
5. Calibration picks a batch whose measured peak fits the cap, and the next doubling step does not.

Every model uses ``load_format: dummy`` (random weights: the host has no weights package and no
internet). Each test deploys its own applications at its own route prefix, deletes them at the
end, writes ``memory_gpu_<n>_<name>.json`` under ``$SERVE_APP_RESULTS_DIR`` (default
``benchmarks/results/gpu_tests``) *before* asserting, and prints generously: it runs unattended.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import wait_http

pytestmark = pytest.mark.gpu

MIB = 1 << 20
EMBED: dict[str, Any] = {"adapter": "embeddings", "load_format": "dummy"}
WORDS = (
    "the model server memory budget replica request response latency throughput queue batch "
    "token vector embedding image label score network cluster node device process kernel cache "
    "buffer tensor weight layer attention encoder sentence paragraph document search query "
    "result index record system service client user data value signal pattern river mountain "
    "forest ocean city village garden window kitchen library market harbor bridge station"
).split()

# Test 1
BUDGET_LOAD_S = 60.0
BUDGET_CLIENTS = 32
# Test 2
STEADY_CLIENTS = 8
STEADY_PHASE_S = 20.0
OVERSIZED_ITEMS = 512  # max-length inputs per oversized request
OVERSIZED_ROOM_BYTES = 128 * MIB  # torch room for activations beside the weights
OVERSIZED_PAUSE_S = 1.5
# Test 4
CACHE_BATCH_ITEMS = 512


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / (1 << 30):.3f} GiB"


def write_result(results_dir: Path, name: str, doc: dict[str, Any]) -> Path:
    path = results_dir / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
    log(f"wrote {path}")
    return path


# ---- Serve helpers --------------------------------------------------------------------------


def _application(args: dict[str, Any], replicas: int, num_gpus: float, retries: int | None) -> Any:
    from serve_app.config.args import parse_args
    from serve_app.serving.replica import ModelServer

    options: dict[str, Any] = {
        "num_replicas": replicas,
        "ray_actor_options": {"num_gpus": num_gpus, "num_cpus": 1},
    }
    if retries is not None:
        options["max_constructor_retry_count"] = retries
    return ModelServer.options(**options).bind(parse_args(args).model_dump())  # type: ignore[attr-defined]


def start_app(
    name: str,
    args: dict[str, Any],
    *,
    replicas: int = 1,
    num_gpus: float = 0.25,
    retries: int | None = None,
) -> None:
    """Submit an application without waiting; its route prefix is ``/<name>``."""
    from ray.serve.api import _run

    log(f"deploying {name}: {replicas} x num_gpus={num_gpus}, args={args}")
    _run(
        _application(args, replicas, num_gpus, retries),
        _blocking=False,
        name=name,
        route_prefix=f"/{name}",
    )


def app_status(name: str) -> tuple[str, str]:
    """(status, every message Serve has for the app and its deployments)."""
    from ray import serve

    app = serve.status().applications.get(name)
    if app is None:
        return "MISSING", ""
    messages = [str(app.message or "")]
    for dep_name, dep in app.deployments.items():
        messages.append(f"[{dep_name} {_value(dep.status)}] {dep.message or ''}")
    return _value(app.status), "\n".join(m for m in messages if m.strip())


def _value(status: Any) -> str:
    """``ApplicationStatus.RUNNING`` -> ``"RUNNING"`` (str() of these enums has the class name)."""
    return str(getattr(status, "value", status))


def wait_status(name: str, wanted: set[str], timeout_s: float) -> tuple[str, str]:
    deadline = time.monotonic() + timeout_s
    status, message = "MISSING", ""
    last_print = 0.0
    while time.monotonic() < deadline:
        status, message = app_status(name)
        if status in wanted:
            return status, message
        if status == "DEPLOY_FAILED" and "DEPLOY_FAILED" not in wanted:
            raise AssertionError(f"application {name} failed to deploy:\n{message}")
        if time.monotonic() - last_print > 10:
            log(f"  {name}: {status} {message[:300]!r}")
            last_print = time.monotonic()
        time.sleep(0.5)
    raise AssertionError(
        f"application {name} not {wanted} after {timeout_s:.0f} s: {status}\n{message}"
    )


def deploy_and_wait(
    base_url: str, apps: dict[str, dict[str, Any]], timeout_s: float = 240.0
) -> None:
    """Submit every app (in parallel), then wait for each to run and answer /healthz."""
    t0 = time.monotonic()
    for name, spec in apps.items():
        start_app(name, **spec)
    for name in apps:
        wait_status(name, {"RUNNING"}, timeout_s - (time.monotonic() - t0))
        wait_http(f"{base_url}/{name}/healthz")
    log(f"deployed {sorted(apps)} in {time.monotonic() - t0:.1f} s")


def delete_apps(*names: str) -> None:
    from ray import serve

    for name in names:
        try:
            serve.delete(name)
            log(f"deleted {name}")
        except Exception as exc:  # noqa: BLE001 - cleanup must go on
            log(f"delete {name} failed: {exc!r}")


def log_other_apps() -> None:
    from ray import serve

    apps = {n: _value(a.status) for n, a in serve.status().applications.items()}
    log(f"applications running before this test: {apps or 'none'}")


def memory_report(base_url: str, app: str) -> dict[str, Any]:
    resp = httpx.get(f"{base_url}/{app}/v1/memory", timeout=30.0)
    assert resp.status_code == 200, f"GET /{app}/v1/memory: {resp.status_code} {resp.text[:500]}"
    return dict(resp.json())


def replica_reports(
    base_url: str, app: str, model_name: str, expect: int, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """The reports of ``model_name``'s replicas (``report["app"]`` is the model name), once all
    ``expect`` replicas have published one."""
    deadline = time.monotonic() + timeout_s
    reports: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        doc = memory_report(base_url, app)
        reports = [r for r in doc["replicas"] if r.get("app") == model_name]
        if len(reports) >= expect:
            return reports
        time.sleep(0.5)
    raise AssertionError(f"only {len(reports)} of {expect} reports for {model_name}: {reports}")


def models_info(base_url: str, app: str) -> dict[str, Any]:
    resp = httpx.get(f"{base_url}/{app}/v1/models", timeout=10.0)
    assert resp.status_code == 200, resp.text[:300]
    return dict(resp.json()["data"][0])


# ---- payloads -------------------------------------------------------------------------------


class Texts:
    """Texts of a given token count, measured with the same tokenizer the replicas use."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer

        from serve_app.adapters.embeddings.modeldir import SKELETON_DIR, default_model_dir

        model_dir = default_model_dir() or SKELETON_DIR
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    def n_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def make(self, tokens: int, seed: int) -> str:
        """A text of at most ``tokens`` tokens (special tokens included), as close as words go."""
        rng = random.Random(seed)
        words = [rng.choice(WORDS) for _ in range(tokens)]
        while words and self.n_tokens(" ".join(words)) > tokens:
            words.pop()
        return " ".join(words)


def embeddings_body(texts: list[str], fmt: str = "base64") -> bytes:
    return json.dumps({"input": texts, "encoding_format": fmt}).encode()


# ---- NVML -----------------------------------------------------------------------------------


def nvml_process_bytes() -> dict[int, int]:
    """Used bytes per PID over every GPU, from NVML (``nvmlDeviceGetComputeRunningProcesses``)."""
    import pynvml

    pynvml.nvmlInit()
    used: dict[int, int] = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            mem = proc.usedGpuMemory
            if mem is not None:
                used[int(proc.pid)] = used.get(int(proc.pid), 0) + int(mem)
    return used


def nvml_free_bytes() -> dict[str, int]:
    import pynvml

    pynvml.nvmlInit()
    free: dict[str, int] = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        free[uuid.decode() if isinstance(uuid, bytes) else str(uuid)] = int(
            pynvml.nvmlDeviceGetMemoryInfo(handle).free
        )
    return free


class NvmlSampler:
    """Samples NVML per-process bytes for some PIDs every ``period_s`` in a thread; with
    ``limits`` (bytes per PID), counts the samples over each PID's limit."""

    def __init__(
        self, pids: list[int], period_s: float = 0.25, limits: dict[int, int] | None = None
    ) -> None:
        self.pids = pids
        self.period_s = period_s
        self.limits = limits or {}
        self.samples = 0
        self.seen: Counter[int] = Counter()
        self.over: Counter[int] = Counter()
        self.max_bytes: dict[int, int] = {}
        self.max_at_s: dict[int, float] = {}  # when each max was read, since start
        self.other_pids: set[int] = set()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)

    def start(self) -> NvmlSampler:
        self._thread.start()
        return self

    def stop(self) -> NvmlSampler:
        self._stop.set()
        self._thread.join(timeout=10)
        return self

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                used = nvml_process_bytes()
            except Exception as exc:  # noqa: BLE001 - recorded and asserted on
                self.errors.append(repr(exc))
            else:
                self.samples += 1
                for pid, n in used.items():
                    if pid in self.pids:
                        self.seen[pid] += 1
                        if pid in self.limits and n > self.limits[pid]:
                            self.over[pid] += 1
                        if n > self.max_bytes.get(pid, -1):
                            self.max_bytes[pid] = n
                            self.max_at_s[pid] = round(time.monotonic() - started, 2)
                    else:
                        self.other_pids.add(pid)
            self._stop.wait(max(0.0, self.period_s - (time.monotonic() - t0)))


# ---- load -----------------------------------------------------------------------------------


@dataclass
class LoadResult:
    """Latencies (s) of completed requests, and statuses including transport errors."""

    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    def non_ok(self) -> int:
        return self.requests - self.statuses.get("200", 0)

    def percentile_ms(self, q: float) -> float | None:
        if not self.latencies_s:
            return None
        ordered = sorted(self.latencies_s)
        rank = max(0, math.ceil(q / 100 * len(ordered)) - 1)  # nearest rank
        return ordered[rank] * 1000

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "statuses": dict(self.statuses),
            "duration_s": round(self.duration_s, 2),
            "requests_per_s": round(self.requests / self.duration_s, 1) if self.duration_s else 0,
            "p50_ms": self.percentile_ms(50),
            "p90_ms": self.percentile_ms(90),
            "p99_ms": self.percentile_ms(99),
            "max_ms": self.percentile_ms(100),
            "first_errors": self.errors[:10],
        }


def run_load(
    url: str,
    bodies: list[bytes],
    *,
    clients: int,
    duration_s: float,
    pause_s: float = 0.0,
    timeout_s: float = 120.0,
    ok_statuses: tuple[int, ...] = (200,),
) -> LoadResult:
    """``clients`` closed-loop clients POST ``bodies`` (cycled) to ``url`` for ``duration_s``.

    Runs its own event loop, so call it from a thread to run loads side by side.
    """
    result = LoadResult()

    async def client(index: int, http: httpx.AsyncClient, deadline: float) -> None:
        i = index
        while time.monotonic() < deadline:
            body = bodies[i % len(bodies)]
            i += clients
            t0 = time.perf_counter()
            try:
                resp = await http.post(
                    url, content=body, headers={"content-type": "application/json"}
                )
            except httpx.HTTPError as exc:
                result.statuses["transport_error"] += 1
                result.errors.append(repr(exc)[:300])
            else:
                result.statuses[str(resp.status_code)] += 1
                if resp.status_code in ok_statuses:
                    result.latencies_s.append(time.perf_counter() - t0)
                if resp.status_code != 200:
                    result.errors.append(f"{resp.status_code} {resp.text[:300]}")
            if pause_s:
                await asyncio.sleep(pause_s)

    async def main() -> None:
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as http:
            t0 = time.monotonic()
            deadline = t0 + duration_s
            await asyncio.gather(*(client(i, http, deadline) for i in range(clients)))
            result.duration_s = time.monotonic() - t0

    asyncio.run(main())
    return result


def run_side_by_side(*jobs: Callable[[], LoadResult]) -> list[LoadResult]:
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(job) for job in jobs]
        return [f.result() for f in futures]


# ---- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def texts() -> Texts:
    return Texts()


@pytest.fixture(scope="module")
def base(gpu_base_url: str) -> str:
    log_other_apps()
    return gpu_base_url


# ---- 1. budgets hold under load -------------------------------------------------------------


def test_1_four_replicas_stay_within_budget_under_load(
    base: str, texts: Texts, results_dir: Path
) -> None:
    app = "mem-budget"
    deploy_and_wait(base, {app: {"args": {**EMBED, "model_name": app}, "replicas": 4}})
    try:
        max_tokens = int(models_info(base, app)["max_input_tokens"])
        reports = replica_reports(base, app, app, expect=4)
        budgets = {int(r["pid"]): r for r in reports}
        log(
            "replicas: "
            + ", ".join(
                f"pid {p}: budget {gib(r['budget_bytes'])} cap {gib(r['cap_bytes'])}"
                for p, r in budgets.items()
            )
        )
        # mostly one long-ish text, every 10th body a batch of 32 max-length texts
        bodies = []
        for i in range(200):
            if i % 10 == 9:
                bodies.append(
                    embeddings_body([texts.make(max_tokens, 1000 * i + j) for j in range(32)])
                )
            else:
                bodies.append(
                    embeddings_body([texts.make(random.Random(i).randint(96, max_tokens), i)])
                )
        sampler = NvmlSampler(list(budgets), period_s=0.25).start()
        log(f"load: {BUDGET_CLIENTS} clients for {BUDGET_LOAD_S:.0f} s")
        load = run_load(
            f"{base}/{app}/v1/embeddings", bodies, clients=BUDGET_CLIENTS, duration_s=BUDGET_LOAD_S
        )
        sampler.stop()
        after = {int(r["pid"]): r for r in replica_reports(base, app, app, expect=4)}
        per_replica = []
        for pid, rep in budgets.items():
            peak = sampler.max_bytes.get(pid)
            per_replica.append(
                {
                    "pid": pid,
                    "replica_id": rep["replica_id"],
                    "gpu_uuid": rep["gpu_uuid"],
                    "samples_seen": sampler.seen[pid],
                    "max_nvml_bytes": peak,
                    "budget_bytes": rep["budget_bytes"],
                    "cap_bytes": rep["cap_bytes"],
                    "max_over_budget_bytes": None
                    if peak is None
                    else peak - int(rep["budget_bytes"]),
                    "max_over_cap_bytes": None if peak is None else peak - int(rep["cap_bytes"]),
                    "peak_reserved_bytes_after": after.get(pid, {}).get("peak_reserved_bytes"),
                    "non_torch_overhead_bytes": rep["non_torch_overhead_bytes"],
                    "batches_after": after.get(pid, {}).get("batches"),
                    "largest_batch_after": after.get(pid, {}).get("largest_batch"),
                    "oom_recoveries_after": after.get(pid, {}).get("oom_recoveries"),
                }
            )
        doc = {
            "test": "four replicas at num_gpus 0.25 under concurrent load",
            "clients": BUDGET_CLIENTS,
            "duration_s": BUDGET_LOAD_S,
            "samples": sampler.samples,
            "sample_period_s": sampler.period_s,
            "sampler_errors": sampler.errors[:5],
            "other_nvml_pids": sorted(sampler.other_pids),
            "load": load.summary(),
            "replicas": per_replica,
        }
        write_result(results_dir, "memory_gpu_1_budget_under_load", doc)
        for r in per_replica:
            log(
                f"pid {r['pid']}: max NVML {gib(r['max_nvml_bytes'])} "
                f"of budget {gib(r['budget_bytes'])} "
                f"(over by {r['max_over_budget_bytes']}) in {r['samples_seen']} samples"
            )
        log(f"load: {load.summary()}")
    finally:
        delete_apps(app)
    assert not sampler.errors, f"NVML sampling failed: {sampler.errors[:3]}"
    assert sampler.samples >= BUDGET_LOAD_S, (
        f"{sampler.samples} NVML samples in {BUDGET_LOAD_S} s (need >= 1/s)"
    )
    for r in per_replica:
        assert r["samples_seen"] >= sampler.samples * 0.9, (
            f"replica pid {r['pid']} appeared in {r['samples_seen']} of {sampler.samples} "
            "NVML samples; "
            f"NVML listed pids {sorted(sampler.other_pids)} (PID namespace mismatch?)"
        )
        assert r["max_over_budget_bytes"] <= 0, f"replica over its budget: {r}"
        assert r["max_over_cap_bytes"] <= 0, f"replica over its cap: {r}"
    assert load.requests > 0 and load.non_ok() == 0, f"errors under load: {load.summary()}"


# ---- 2. an oversized replica does not hurt its neighbours -----------------------------------


def test_2_oversized_batches_stay_in_their_replica(
    base: str, texts: Texts, results_dir: Path
) -> None:
    """Memory isolation, asserted through errors and memory; latency reported, not asserted.

    The oversized replica must answer only 200 or 507 (200 at least once), recover from at
    least one OOM (its batches split as designed), answer /healthz after, and never hold more
    than its cap in NVML; its three neighbours must answer every request 200 (baseline and
    beside it), recover from no OOM, and never hold more than their budgets in NVML. All four
    processes are sampled every 0.1 s through both phases.

    Why the neighbours' p99 is not asserted: the test used to require p99 beside the oversized
    replica <= 1.5 x a baseline p99. In the 12 committed runs (docs/memory.md links them) that
    ratio ranged from x0.77 to x2.17, four times over 1.5, with no error and no neighbour OOM
    in any of them, and the baseline p99 alone ranged from 31 to 107 ms between runs. The
    oversized replica sends 7 to 13 batches of 512 x 256 tokens per phase: each takes the
    shared GPU (time-sliced) and host cores (tokenizing) for a while, so the neighbours' 1%
    tail is a handful of those events plus host noise, compute contention that memory
    partitioning does not claim to remove. A tolerance wide enough to pass 3 runs of 3 (over
    x2.2) would not catch a memory leak between replicas either; that shows as errors, OOMs
    and NVML bytes, which are asserted. The latencies (p50, p99, the ratio) stay in the JSON.
    """
    steady, big = "mem-steady", "mem-oversized"
    deploy_and_wait(
        base,
        {
            steady: {
                "args": {**EMBED, "model_name": steady, "max_inputs_per_request": 8},
                "replicas": 3,
            }
        },
    )
    try:
        reports = replica_reports(base, steady, steady, expect=3)
        # Size the oversized replica's cap from what a replica measures: its CUDA context (outside
        # the torch cap) plus the weights plus a small room for activations.
        rep = max(reports, key=lambda r: int(r["non_torch_overhead_bytes"]))
        total = int(round(int(rep["budget_bytes"]) / float(rep["num_gpus"])))
        overhead = int(rep["non_torch_overhead_bytes"])
        weights = max(int(r["allocated_bytes"]) for r in reports)
        fraction = math.ceil((overhead + weights + OVERSIZED_ROOM_BYTES) / total * 1e4) / 1e4
        log(
            f"device total {gib(total)}, context overhead {gib(overhead)}, fp32 weights+workspace "
            f"{gib(weights)} -> oversized memory_fraction {fraction} ({gib(fraction * total)})"
        )
        big_args = {
            **EMBED,
            "model_name": big,
            "dtype": "float16",
            "max_batch_size": 4096,
            "max_inputs_per_request": 2048,
            "batch_wait_timeout_s": 0.05,
            "memory": {"memory_fraction": fraction, "calibrate": False, "cache_policy": "always"},
        }
        deploy_and_wait(base, {big: {"args": big_args, "replicas": 1}})
        max_tokens = int(models_info(base, steady)["max_input_tokens"])
        steady_bodies = [
            embeddings_body([texts.make(random.Random(i).randint(32, 128), i)]) for i in range(100)
        ]
        big_bodies = [
            embeddings_body([texts.make(max_tokens, 7 * i + j) for j in range(OVERSIZED_ITEMS)])
            for i in range(2)
        ]
        steady_url, big_url = f"{base}/{steady}/v1/embeddings", f"{base}/{big}/v1/embeddings"
        big_before = replica_reports(base, big, big, expect=1)[0]
        big_pid = int(big_before["pid"])
        steady_budgets = {int(r["pid"]): int(r["budget_bytes"]) for r in reports}
        limits = {**steady_budgets, big_pid: int(big_before["cap_bytes"])}
        sampler = NvmlSampler(list(limits), period_s=0.1, limits=limits).start()
        log("warm-up 3 s")
        run_load(steady_url, steady_bodies, clients=STEADY_CLIENTS, duration_s=3.0)
        log(f"baseline: {STEADY_CLIENTS} steady clients for {STEADY_PHASE_S:.0f} s")
        baseline = run_load(
            steady_url, steady_bodies, clients=STEADY_CLIENTS, duration_s=STEADY_PHASE_S
        )
        log(f"baseline: {baseline.summary()}")
        log(
            f"contended: the same plus 1 client sending {OVERSIZED_ITEMS} max-length inputs "
            f"every {OVERSIZED_PAUSE_S} s"
        )
        contended, oversized = run_side_by_side(
            lambda: run_load(
                steady_url, steady_bodies, clients=STEADY_CLIENTS, duration_s=STEADY_PHASE_S
            ),
            lambda: run_load(
                big_url,
                big_bodies,
                clients=1,
                duration_s=STEADY_PHASE_S,
                pause_s=OVERSIZED_PAUSE_S,
                ok_statuses=(200, 507),
            ),
        )
        sampler.stop()
        log(f"contended steady: {contended.summary()}")
        log(f"oversized: {oversized.summary()}")
        health = httpx.get(f"{base}/{big}/healthz", timeout=10.0).status_code
        big_report = replica_reports(base, big, big, expect=1)[0]
        steady_after = replica_reports(base, steady, steady, expect=3)
        p99_base, p99_cont = baseline.percentile_ms(99), contended.percentile_ms(99)
        ratio = None if not p99_base or p99_cont is None else p99_cont / p99_base
        steady_nvml: list[dict[str, Any]] = [
            {
                "pid": pid,
                "budget_bytes": budget,
                "nvml_samples": sampler.seen[pid],
                "nvml_max_bytes": sampler.max_bytes.get(pid),
                "nvml_over_budget_samples": sampler.over[pid],
            }
            for pid, budget in steady_budgets.items()
        ]
        doc = {
            "test": "oversized batches in one replica beside three steady replicas",
            "asserted": [
                "oversized: answers only 200 or 507, at least one 200, >= 1 OOM recovery, "
                "/healthz 200 after, NVML bytes never over its cap",
                "steady: every request 200 (baseline and contended), no OOM recovery, NVML "
                "bytes of each process never over its budget",
            ],
            "nvml_sample_period_s": sampler.period_s,
            "nvml_samples": sampler.samples,
            "nvml_errors": sampler.errors[:5],
            "oversized": {
                "memory_fraction": fraction,
                "cap_bytes": big_report["cap_bytes"],
                "torch_fraction": big_report["torch_fraction"],
                "items_per_request": OVERSIZED_ITEMS,
                "tokens_per_item": max_tokens,
                "pause_s": OVERSIZED_PAUSE_S,
                "load": oversized.summary(),
                "healthz_after": health,
                "oom_recoveries": big_report["oom_recoveries"],
                "max_batch_size_after": big_report["max_batch_size"],
                "peak_reserved_bytes": big_report["peak_reserved_bytes"],
                "nvml_process_bytes": big_report["nvml_process_bytes"],
                "non_torch_overhead_bytes": big_report["non_torch_overhead_bytes"],
                "non_torch_growth_bytes": big_report["non_torch_growth_bytes"],
                "non_torch_reserve_bytes": big_report["non_torch_reserve_bytes"],
                "cuda_graphs": big_report["cuda_graphs"],
                "cuda_graphs_over_limit": big_report["cuda_graphs_over_limit"],
                "cuda_graph_limit_bytes": big_report["cuda_graph_limit_bytes"],
                "cuda_graph_pool_bytes": big_report["cuda_graph_pool_bytes"],
                "nvml_samples": sampler.seen[big_pid],
                "nvml_max_bytes": sampler.max_bytes.get(big_pid),
                "nvml_max_at_s": sampler.max_at_s.get(big_pid),
                "nvml_over_cap_samples": sampler.over[big_pid],
            },
            "steady": {
                "clients": STEADY_CLIENTS,
                "phase_s": STEADY_PHASE_S,
                "baseline": baseline.summary(),
                "contended": contended.summary(),
                "p99_baseline_ms": p99_base,
                "p99_contended_ms": p99_cont,
                "p99_ratio": ratio,
                "p99_asserted": False,
                "oom_recoveries": [r["oom_recoveries"] for r in steady_after],
                "nvml": steady_nvml,
                "note": "latency is reported, not asserted: the steady and oversized replicas "
                "share one GPU's compute and the host's cores, so the p99 ratio measures that "
                "contention (x0.77 to x2.17 over the committed runs), not memory isolation",
            },
        }
        write_result(results_dir, "memory_gpu_2_oversized_isolation", doc)
        log(
            f"steady p99 {p99_cont} ms beside the oversized replica vs {p99_base} ms baseline "
            f"(x{ratio if ratio is None else round(ratio, 2)}, reported); NVML: {steady_nvml}"
        )
    finally:
        delete_apps(big, steady)
    assert oversized.requests > 0, f"no oversized request completed: {oversized.summary()}"
    bad = {k: v for k, v in oversized.statuses.items() if k not in ("200", "507")}
    assert not bad, f"oversized replica answered other than 200/507: {oversized.summary()}"
    assert health == 200, f"oversized replica /healthz answered {health} after the OOMs"
    assert not sampler.errors and sampler.seen[big_pid] > 0, sampler.errors[:3]
    assert sampler.over[big_pid] == 0, (
        f"the oversized replica went past its cap in {sampler.over[big_pid]} NVML samples: max "
        f"{sampler.max_bytes[big_pid]} bytes, cap {big_report['cap_bytes']}; see "
        "memory_gpu_2_oversized_isolation.json"
    )
    assert sampler.max_bytes[big_pid] <= int(big_report["cap_bytes"]), (
        f"the oversized replica went past its cap: NVML {sampler.max_bytes[big_pid]} bytes, "
        f"cap {big_report['cap_bytes']}; see memory_gpu_2_oversized_isolation.json"
    )
    assert oversized.statuses.get("200", 0) > 0, (
        f"the oversized replica answered no request: {oversized.summary()}"
    )
    assert int(big_report["oom_recoveries"]) > 0, (
        f"no OOM happened in the oversized replica (cap {gib(big_report['cap_bytes'])}); make "
        f"OVERSIZED_ITEMS larger or OVERSIZED_ROOM_BYTES smaller: {big_report}"
    )
    assert baseline.non_ok() == 0, f"steady errors in the baseline: {baseline.summary()}"
    assert contended.non_ok() == 0, (
        f"steady errors beside the oversized replica: {contended.summary()}"
    )
    assert all(int(r["oom_recoveries"]) == 0 for r in steady_after), (
        f"steady replicas hit OOM: {steady_after}"
    )
    for row in steady_nvml:
        assert row["nvml_samples"] >= sampler.samples * 0.9, (
            f"steady replica pid {row['pid']} appeared in {row['nvml_samples']} of "
            f"{sampler.samples} NVML samples; NVML listed pids {sorted(sampler.other_pids)}"
        )
        assert row["nvml_over_budget_samples"] == 0, f"a steady replica over its budget: {row}"


# ---- 3. over-budget start-up fails clearly --------------------------------------------------


@pytest.fixture(scope="module")
def failed_startups(base: str, results_dir: Path) -> Iterator[dict[str, Any]]:
    """An app that keeps serving, plus two that cannot start: one whose cap is below the CUDA
    context, one whose cap holds the context but not the weights (ResNet-152, fp32, 241 MB)."""
    alive, ctx_app, model_app = "mem-alive", "mem-cap-below-context", "mem-model-over-budget"
    deploy_and_wait(base, {alive: {"args": {**EMBED, "model_name": alive}}})
    out: dict[str, Any] = {"alive": alive, "ctx_app": ctx_app, "model_app": model_app}
    try:
        rep = replica_reports(base, alive, alive, expect=1)[0]
        total = int(round(int(rep["budget_bytes"]) / float(rep["num_gpus"])))
        overhead = int(rep["non_torch_overhead_bytes"])
        model_fraction = math.ceil((overhead + 64 * MIB) / total * 1e4) / 1e4
        out["model_fraction"] = model_fraction
        free_before = nvml_free_bytes()
        log(f"free before the failing apps: { {k: gib(v) for k, v in free_before.items()} }")
        start_app(
            ctx_app,
            {**EMBED, "model_name": ctx_app, "memory": {"memory_fraction": 0.001}},
            retries=1,
        )
        start_app(
            model_app,
            {
                "adapter": "image-classification",
                "arch": "resnet152",
                "load_format": "dummy",
                # the budget is sized from an embeddings replica's overhead, without nvJPEG's
                "image_decode": "cpu",
                "model_name": model_app,
                "memory": {"memory_fraction": model_fraction},
            },
            retries=1,
        )
        for name in (ctx_app, model_app):
            status, message = wait_status(name, {"DEPLOY_FAILED", "RUNNING"}, 240.0)
            out[name] = {"status": status, "message": message}
            log(f"{name}: {status}\n{message}")
        alive_resp = httpx.post(
            f"{base}/{alive}/v1/embeddings", json={"input": ["still here?"]}, timeout=30.0
        )
        out["alive_status"] = alive_resp.status_code
        delete_apps(ctx_app, model_app)
        for name in (ctx_app, model_app):
            wait_status(name, {"MISSING"}, 120.0)
        # Replica processes exit after the delete; their CUDA contexts go with them.
        deadline = time.monotonic() + 60.0
        free_after = nvml_free_bytes()
        while time.monotonic() < deadline:
            free_after = nvml_free_bytes()
            if all(free_after[u] >= free_before[u] - 256 * MIB for u in free_before):
                break
            time.sleep(1.0)
        out["free_before"], out["free_after"] = free_before, free_after
        out["alive_after_delete"] = httpx.post(
            f"{base}/{alive}/v1/embeddings", json={"input": ["and now?"]}, timeout=30.0
        ).status_code
        write_result(results_dir, "memory_gpu_3_startup_over_budget", out)
        yield out
    finally:
        delete_apps(ctx_app, model_app, alive)


def _names_the_fix(message: str) -> bool:
    """Our message, not torch's: it speaks of the cap or budget (torch says "capacity") and
    names the setting to change."""
    return bool(
        re.search(r"\b(memory_fraction|num_gpus)\b", message)
        and re.search(r"\b(cap|budget)\b", message)
    )


def test_3a_cap_below_cuda_context_fails_at_startup(failed_startups: dict[str, Any]) -> None:
    got = failed_startups[failed_startups["ctx_app"]]
    assert got["status"] == "DEPLOY_FAILED", got
    # memory.plan_budget: "the process already holds N outside PyTorch ... not below its cap of
    # M (memory_fraction=0.001); raise memory_fraction in the deploy config"
    assert "outside PyTorch" in got["message"] and "memory_fraction" in got["message"], got[
        "message"
    ]
    assert _names_the_fix(got["message"]), got["message"]
    assert failed_startups["alive_status"] == 200
    assert failed_startups["alive_after_delete"] == 200
    before, after = failed_startups["free_before"], failed_startups["free_after"]
    for uuid in before:
        assert after[uuid] >= before[uuid] - 256 * MIB, (
            f"GPU {uuid}: {gib(after[uuid])} free after the delete vs {gib(before[uuid])} before"
        )


def test_3b_model_larger_than_budget_fails_at_startup(failed_startups: dict[str, Any]) -> None:
    got = failed_startups[failed_startups["model_app"]]
    assert got["status"] == "DEPLOY_FAILED", got
    # The weights (ResNet-152, 241 MB fp32) do not fit in a cap of context + 64 MiB: the
    # replica must say so in our words (budget, and which setting to raise), not torch's.
    assert _names_the_fix(got["message"]), (
        "start-up failed without the clear message (cap/budget and memory_fraction or "
        f"num_gpus): {got['message'][-1500:]}"
    )


# ---- 4. cache policies ----------------------------------------------------------------------


def test_4_cache_policy_gives_memory_back(base: str, texts: Texts, results_dir: Path) -> None:
    policies: dict[str, dict[str, Any]] = {
        "always": {"cache_policy": "always"},
        "threshold": {"cache_policy": "threshold", "cache_threshold_fraction": 0.001},
        "never": {"cache_policy": "never"},
    }
    apps = {
        f"mem-cache-{p}": {
            "args": {
                **EMBED,
                "model_name": f"mem-cache-{p}",
                "max_batch_size": CACHE_BATCH_ITEMS,
                "max_inputs_per_request": CACHE_BATCH_ITEMS,
                "batch_wait_timeout_s": 0.05,
                "memory": {"calibrate": False, **mem},
            }
        }
        for p, mem in policies.items()
    }
    deploy_and_wait(base, apps)
    rows: dict[str, dict[str, Any]] = {}
    try:
        max_tokens = int(models_info(base, "mem-cache-always")["max_input_tokens"])
        warm = embeddings_body([texts.make(max_tokens, i) for i in range(8)])
        large = embeddings_body([texts.make(max_tokens, 100 + i) for i in range(CACHE_BATCH_ITEMS)])
        for policy in policies:
            app = f"mem-cache-{policy}"
            url = f"{base}/{app}/v1/embeddings"
            resp = httpx.post(
                url, content=warm, headers={"content-type": "application/json"}, timeout=120
            )
            assert resp.status_code == 200, resp.text[:500]
        time.sleep(2.5)  # reports publish every second
        for policy in policies:
            app = f"mem-cache-{policy}"
            rep = replica_reports(base, app, app, expect=1)[0]
            pid = int(rep["pid"])
            row: dict[str, Any] = {"pid": pid, "baseline_nvml_bytes": nvml_process_bytes().get(pid)}
            row["baseline_reserved_bytes"] = rep["reserved_bytes"]
            row["baseline_allocated_bytes"] = rep["allocated_bytes"]
            t0 = time.perf_counter()
            resp = httpx.post(
                f"{base}/{app}/v1/embeddings",
                content=large,
                headers={"content-type": "application/json"},
                timeout=300,
            )
            row["large_batch_s"] = round(time.perf_counter() - t0, 3)
            assert resp.status_code == 200, f"{app}: {resp.status_code} {resp.text[:500]}"
            rows[policy] = row
        time.sleep(2.5)
        used = nvml_process_bytes()
        for policy, row in rows.items():
            app = f"mem-cache-{policy}"
            rep = replica_reports(base, app, app, expect=1)[0]
            row.update(
                {
                    "after_nvml_bytes": used.get(row["pid"]),
                    "after_reserved_bytes": rep["reserved_bytes"],
                    "after_allocated_bytes": rep["allocated_bytes"],
                    "peak_reserved_bytes": rep["peak_reserved_bytes"],
                    "largest_batch": rep["largest_batch"],
                    "cache_frees": rep["cache_frees"],
                    "budget_bytes": rep["budget_bytes"],
                }
            )
            b, a = row["baseline_nvml_bytes"], row["after_nvml_bytes"]
            row["nvml_delta_bytes"] = None if a is None or b is None else a - b
            row["reserved_delta_bytes"] = int(row["after_reserved_bytes"]) - int(
                row["baseline_reserved_bytes"]
            )
            log(
                f"{policy:9s}: NVML {gib(b)} -> {gib(a)}, "
                f"reserved {gib(row['baseline_reserved_bytes'])} -> "
                f"{gib(row['after_reserved_bytes'])} (peak {gib(row['peak_reserved_bytes'])}), "
                f"largest batch {row['largest_batch']}, frees {row['cache_frees']}, "
                f"{row['large_batch_s']} s"
            )
        write_result(
            results_dir,
            "memory_gpu_4_cache_policy",
            {
                "test": "NVML and reserved bytes after one large batch, per cache policy",
                "items": CACHE_BATCH_ITEMS,
                "tokens_per_item": max_tokens,
                "policies": rows,
            },
        )
    finally:
        delete_apps(*apps)
    never = rows["never"]
    assert int(never["largest_batch"]) >= CACHE_BATCH_ITEMS // 2, never
    assert never["reserved_delta_bytes"] >= 256 * MIB, f"never: the cache did not stay: {never}"
    assert never["nvml_delta_bytes"] is not None and never["nvml_delta_bytes"] >= 256 * MIB, never
    for policy in ("always", "threshold"):
        row = rows[policy]
        assert row["reserved_delta_bytes"] <= 64 * MIB, f"{policy}: reserved stayed up: {row}"
        assert row["nvml_delta_bytes"] is not None, row
        # NVML may grow a little for kernels loaded lazily by the first large batch
        assert row["nvml_delta_bytes"] <= min(256 * MIB, never["nvml_delta_bytes"] // 4), (
            f"{policy}: NVML bytes stayed up after the batch: {row} (never: {never})"
        )
        assert int(row["cache_frees"]) >= 1, row


# ---- 5. calibration -------------------------------------------------------------------------


def test_5_calibration_fits_and_next_step_does_not(base: str, results_dir: Path) -> None:
    app = "mem-calib"
    fraction = 0.02
    calib_max = 8192
    args = {
        **EMBED,
        "model_name": app,
        "memory": {
            "memory_fraction": fraction,
            "calibrate": True,
            "calibration_max_batch_size": calib_max,
        },
    }
    deploy_and_wait(base, {app: {"args": args}})
    doc: dict[str, Any] = {
        "test": "calibration under a small memory_fraction",
        "memory_fraction": fraction,
    }
    try:
        rep = replica_reports(base, app, app, expect=1)[0]
        doc["replica"] = {
            k: rep.get(k)
            for k in (
                "calibrated_batch_size",
                "calibration_peak_bytes",
                "calibration_next_size",
                "calibration_next_outcome",
                "cap_bytes",
                "budget_bytes",
                "torch_fraction",
                "non_torch_overhead_bytes",
                "max_batch_size",
                "nvml_process_bytes",
            )
        }
        log(f"replica calibration: {doc['replica']}")
    finally:
        delete_apps(app)
    write_result(results_dir, "memory_gpu_5_calibration", doc)  # again below, with more
    assert rep["calibrated_batch_size"] is not None, f"no calibration in the report: {rep}"
    in_process = calibrate_in_process(
        args, float(rep["num_gpus"]), int(rep["calibrated_batch_size"])
    )
    doc["in_process"] = in_process
    write_result(results_dir, "memory_gpu_5_calibration", doc)

    size, peak, cap = (
        rep["calibrated_batch_size"],
        rep["calibration_peak_bytes"],
        int(rep["cap_bytes"]),
    )
    assert size is not None and peak is not None, f"no calibration in the report: {rep}"
    assert int(peak) <= cap, f"calibrated peak {peak} over the cap {cap}"
    assert int(size) < calib_max, (
        f"calibration reached calibration_max_batch_size={calib_max}: memory did not limit it"
    )
    if "calibration_next_size" in rep:
        assert (
            rep["calibration_next_size"] == 2 * int(size)
            or rep["calibration_next_size"] == calib_max
        ), rep
        outcome = rep["calibration_next_outcome"]
        assert outcome == "oom" or int(outcome) > cap, f"the next step fitted: {rep}"
    # In this process, with the same args, the same cap and the same code: the replica's size fits
    # and the next doubling step does not.
    fit, nxt = in_process["probe_chosen"], in_process["probe_next"]
    assert fit["outcome"] != "oom" and int(fit["outcome"]) <= in_process["cap_bytes"], in_process
    assert nxt["outcome"] == "oom" or int(nxt["outcome"]) > in_process["cap_bytes"], in_process


def calibrate_in_process(
    args: dict[str, Any], num_gpus: float, replica_size: int
) -> dict[str, Any]:
    """Run serve_app's start-up (cap) and calibration in this process, then probe the replica's
    chosen size and the next doubling step; restores an uncapped allocator after."""
    import gc

    import torch

    from serve_app import adapters
    from serve_app.config.args import parse_args
    from serve_app.gpu import nvml
    from serve_app.gpu.calibrate import candidate_sizes
    from serve_app.gpu.capping import start_partition
    from serve_app.gpu.graphs import graph_batch_limit
    from serve_app.gpu.snapshot import is_torch_oom
    from serve_app.startup.calibration import calibrate_batch_size
    from serve_app.startup.capture import capture_graphs

    if nvml.is_scripted():
        nvml.set_source(nvml.NvmlSource())
    app_args = parse_args(args)
    family = adapters.family(app_args)
    partition = start_partition(app_args, num_gpus, family.outside_torch_hook(app_args))
    assert partition.budget is not None
    budget = partition.budget
    device = partition.device
    model = family.build(app_args)
    adapter = model.backend
    out: dict[str, Any] = {"cap_bytes": budget.cap_bytes, "overhead_bytes": budget.overhead_bytes}
    try:
        adapter.setup(device)
        if app_args.cuda_graphs:  # as the replica does: graphs first, calibration beside them
            capture_graphs(model, partition, graph_batch_limit(app_args))
        result = calibrate_batch_size(
            adapter, partition, app_args.memory.calibration_max_batch_size
        )
        out["calibration"] = {
            "batch_size": result.batch_size,
            "peak_bytes": result.peak_bytes,
            "first_failure_size": result.first_failure_size,
            "first_failure": result.first_failure,
            "probes": result.probes,
        }
        sizes = candidate_sizes(1, app_args.memory.calibration_max_batch_size)
        later = [s for s in sizes if s > replica_size]
        next_size = later[0] if later else None

        def probe(n: int) -> dict[str, Any]:
            partition.free_cache()
            torch.cuda.reset_peak_memory_stats(device)
            try:
                adapter.predict(adapter.worst_case_items(n))
                torch.cuda.synchronize(device)
            except Exception as exc:  # noqa: BLE001 - only OOM is expected
                if not is_torch_oom(exc):
                    raise
                del exc
                partition.free_cache()
                return {"size": n, "outcome": "oom"}
            return {
                "size": n,
                "outcome": int(torch.cuda.max_memory_reserved(device)) + budget.overhead_bytes,
            }

        out["probe_chosen"] = probe(replica_size)
        out["probe_next"] = probe(next_size) if next_size else {"size": None, "outcome": "oom"}
        log(f"in-process calibration: {out}")
        return out
    finally:
        adapter_any: Any = adapter
        adapter_any.model = None  # drop the weights before uncapping
        gc.collect()
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()
