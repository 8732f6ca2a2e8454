"""What ``serve-app plan --measure`` read, turned into the measurements file's schema (format 1,
serve_app.plan.measurements). Pure but for ``calibration_probes``, which reads a directory.

Memory, from one replica's start-up (``GET /v1/memory`` and its calibration entry):

- ``context_bytes``: the replica's ``non_torch_overhead_bytes`` once it has served (the CUDA
  context, kernels loaded at first launch, what graph capture added outside torch): the
  overhead its budget is charged with;
- ``graph_pool_bytes``: ``cuda_graph_pool_bytes`` once it has served (graphs left pending at
  start-up are captured between batches);
- calibration's probes: at each batch size ``n`` it ran, ``peak(n)`` = torch's peak reserved
  bytes plus the overhead then, so ``peak(n) - overhead then - pool then`` = weights +
  activations at ``n``;
- ``weights_bytes``: torch's reserved bytes right after start-up less the pool then (start-up
  gives its cache back after calibration), and never above that sum at the smallest probe, so
  that no activation peak is negative;
- ``activation_peak_bytes[n]``: the rest of ``peak(n)``.

So context + weights + pool + activation peak at ``n`` is calibration's measured peak at ``n``
plus whatever the overhead and the pool grew by after it: a budget from them holds what the
replica was seen to need.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serve_app.plan.measurements import MAX_UTILIZATION, Measurements
from serve_app.plan.targets import ModelTarget


@dataclass(frozen=True)
class MemoryFigures:
    context_bytes: int
    weights_bytes: int
    graph_pool_bytes: int
    activation_peak_bytes: dict[int, int]
    how: dict[str, str] = field(default_factory=dict)  # field -> how it was read


@dataclass(frozen=True)
class LoopReading:
    """One closed-loop window on one replica."""

    concurrency: int
    requests: int  # answered 2xx within the window
    errors: int  # anything else (status >= 300, timeouts, refused connections)
    window_s: float
    p50_s: float | None
    p99_s: float | None
    replica_cpu_s: float  # the replica process's user + system CPU seconds in the window
    batch_busy_s: float  # the replica's model thread busy running batches (its report)
    gpu_busy_s: float | None  # NVML's GPU utilisation integrated over the window; None: none
    client_cpu_fraction: float  # the busiest client process's CPU use (1.0: one core, its limit)
    client_processes: int = 1
    replica_nvml_peak_bytes: int | None = None  # NVML's bytes of the replica, its peak; None: none
    # The ingress's processes (HAProxy, Ray's proxy: serve_app.plan.ingress), user + system CPU
    # seconds over the window, in all and by kind; how many of each were read, and how many
    # exited inside the window (their last seconds lost).
    ingress_cpu_s: float = 0.0
    ingress_cpu_s_by_kind: dict[str, float] = field(default_factory=dict)
    ingress_processes_by_kind: dict[str, int] = field(default_factory=dict)
    ingress_processes_lost: int = 0

    @property
    def throughput_rps(self) -> float:
        return self.requests / self.window_s


@dataclass(frozen=True)
class CandidateReading:
    batch_size: int
    saturation: LoopReading
    idle: LoopReading


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (0 < q <= 100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def calibration_probes(
    directory: Path, match: Mapping[str, Any]
) -> tuple[dict[int, int], int, Path] | None:
    """The newest calibration entry in ``directory`` whose key holds every field of ``match``
    (the model's name, the replica's cap in bytes, ...): its probes that fitted (batch -> peak
    bytes), the overhead they were measured with, and its path; None when there is none."""
    found: list[tuple[float, dict[str, Any], Path]] = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        key = doc.get("key") if isinstance(doc, dict) else None
        if not isinstance(key, dict) or not isinstance(doc.get("result"), dict):
            continue
        if all(key.get(k) == v for k, v in match.items()):
            found.append((float(doc.get("written_at_s") or 0.0), doc["result"], path))
    if not found:
        return None
    _, result, path = max(found, key=lambda f: f[0])
    probes = {int(n): int(peak) for n, peak in result.get("probes", []) if peak is not None}
    return probes, int(result["overhead_bytes"]), path


def gpu_memory(
    first: Mapping[str, Any],
    last: Mapping[str, Any],
    probes: Mapping[int, int],
    overhead_then_bytes: int,
) -> MemoryFigures:
    """The memory figures of a GPU replica (see the module docstring): ``first`` its report
    right after start-up, ``last`` after it served; ``probes`` calibration's peaks (batch ->
    bytes) measured with an overhead of ``overhead_then_bytes``."""
    if not probes:
        raise ValueError("no calibration probe fitted: nothing to measure activations with")
    pool_then = int(first.get("cuda_graph_pool_bytes") or 0)
    pool = max(pool_then, int(last.get("cuda_graph_pool_bytes") or 0))
    context = max(int(first["non_torch_overhead_bytes"]), int(last["non_torch_overhead_bytes"]))
    beside = {n: peak - overhead_then_bytes - pool_then for n, peak in probes.items()}
    weights = max(0, min(int(first["reserved_bytes"]) - pool_then, min(beside.values())))
    return MemoryFigures(
        context_bytes=context,
        weights_bytes=weights,
        graph_pool_bytes=pool,
        activation_peak_bytes={n: max(0, b - weights) for n, b in sorted(beside.items())},
        how={
            "context_bytes": "non_torch_overhead_bytes of GET /v1/memory after the loads",
            "weights_bytes": "reserved_bytes of GET /v1/memory after start-up, less the graph "
            "pool then",
            "graph_pool_bytes": "cuda_graph_pool_bytes of GET /v1/memory after the loads",
            "activation_peak_bytes": "calibration's peak at each batch (its cache entry), "
            "less the overhead and pool then and the weights",
        },
    )


def with_serving_peaks(
    memory: MemoryFigures, readings: Sequence[CandidateReading]
) -> MemoryFigures:
    """``memory`` with each candidate's activation peak raised to what NVML saw the replica hold
    while it served at that cap, less its context, weights and pool: under load the allocator
    keeps blocks of several shapes at once, which calibration's one worst-case batch does not
    show. So a budget from the figures holds every byte the measured replica was seen to hold."""
    fixed = memory.context_bytes + memory.weights_bytes + memory.graph_pool_bytes
    peaks = dict(memory.activation_peak_bytes)
    raised = []
    for c in readings:
        seen = [r.replica_nvml_peak_bytes for r in (c.saturation, c.idle)]
        served = max((b for b in seen if b is not None), default=None)
        if served is None:
            continue
        if served - fixed > peaks.get(c.batch_size, 0):
            peaks[c.batch_size] = served - fixed
            raised.append(c.batch_size)
    if not raised:
        return memory
    how = dict(memory.how)
    how["activation_peak_bytes"] = (
        f"{memory.how.get('activation_peak_bytes', '')}; at batch caps {sorted(raised)} raised "
        "to NVML's peak bytes of the replica while it served at that cap, less the context, "
        "weights and pool"
    )
    return MemoryFigures(
        context_bytes=memory.context_bytes,
        weights_bytes=memory.weights_bytes,
        graph_pool_bytes=memory.graph_pool_bytes,
        activation_peak_bytes=dict(sorted(peaks.items())),
        how=how,
    )


def cpu_memory(rss_bytes: int) -> MemoryFigures:
    """A CPU replica has no GPU figures. Its process's resident bytes stand in for the weights
    (so that the plan's budgets are not zero); nothing else is counted."""
    note = "no GPU: not measured (0)"
    return MemoryFigures(
        context_bytes=0,
        weights_bytes=rss_bytes,
        graph_pool_bytes=0,
        activation_peak_bytes={},
        how={
            "context_bytes": note,
            "weights_bytes": "no GPU: the replica process's resident host memory (RSS) after "
            "the loads, a stand-in, not GPU bytes",
            "graph_pool_bytes": note,
            "activation_peak_bytes": note,
        },
    )


def gpu_s_per_request(c: CandidateReading, on_gpu: bool) -> tuple[float, str]:
    """GPU seconds a request costs at saturation, and how it was read."""
    s = c.saturation
    if not on_gpu:
        return 0.0, "no GPU: 0"
    if s.gpu_busy_s is not None:
        return s.gpu_busy_s / s.requests, "NVML's GPU utilisation over the window, per request"
    return s.batch_busy_s / s.requests, (
        "no NVML utilisation: the model thread's busy seconds per request (an upper bound)"
    )


def model_entry(
    memory: MemoryFigures,
    readings: Sequence[CandidateReading],
    target: ModelTarget,
    num_cpus: float,
    on_gpu: bool,
    provenance: str,
) -> dict[str, Any]:
    """One ``models.<application>`` entry of the measurements file. ``provenance``: "measured
    by serve-app plan --measure at <commit> on <host/gpu>", which each source starts with."""
    if not readings:
        raise ValueError("no candidate was measured")
    bad = [c.batch_size for c in readings if not (c.saturation.requests and c.idle.requests)]
    if bad:
        raise ValueError(f"no request was answered in a window at batch sizes {bad}")
    blind = [c.batch_size for c in readings if not c.saturation.ingress_processes_by_kind]
    if blind:
        raise ValueError(
            f"no ingress process (HAProxy, Ray's proxy) was read over the windows at batch sizes "
            f"{blind}: the ingress's CPU cannot be charged"
        )
    peaks = dict(memory.activation_peak_bytes) or {c.batch_size: 0 for c in readings}
    cands, how_gpu = [], ""
    for c in readings:
        gpu_s, how_gpu = gpu_s_per_request(c, on_gpu)
        cands.append(
            {
                "batch_size": c.batch_size,
                "throughput_rps": c.saturation.throughput_rps,
                "p99_idle_s": c.idle.p99_s,
                "gpu_s_per_request": gpu_s,
            }
        )
    cpu_s = min(c.saturation.replica_cpu_s / c.saturation.requests for c in readings)
    ingress_s = min(c.saturation.ingress_cpu_s / c.saturation.requests for c in readings)
    kinds = sorted({k for c in readings for k in c.saturation.ingress_processes_by_kind})
    sat = ", ".join(f"{c.saturation.concurrency} at {c.batch_size}" for c in readings)
    sources = {k: f"{provenance}: {v}" for k, v in memory.how.items()}
    sources |= {
        "throughput_rps": f"{provenance}: one replica, closed loop through the HTTP ingress "
        f"(requests in flight: {sat}), 2xx answers over the window",
        "p99_idle_s": f"{provenance}: one request at a time, its p99",
        "gpu_s_per_request": f"{provenance}: {how_gpu}",
        "cpu_s_per_request": f"{provenance}: the replica process's CPU seconds (psutil "
        "cpu_times, user + system) over the saturated window per request, the least of the "
        "batch sizes",
        "ingress_cpu_s_per_request": f"{provenance}: the CPU seconds (psutil cpu_times, user + "
        "system) of the Ray session's ingress processes (HAProxy's and Ray's ProxyActor, by name "
        f"below the session's raylet; read: {', '.join(kinds)}) over the saturated window per "
        "request, the least of the batch sizes",
        "p99_target_s": "the targets file",
    }
    return entry_doc(
        memory, peaks, cands, cpu_s, num_cpus, target, sources, ingress_cpu_s_per_request=ingress_s
    )


def entry_doc(
    memory: MemoryFigures,
    peaks: Mapping[int, int],
    candidates: Sequence[Mapping[str, Any]],
    cpu_s_per_request: float,
    num_cpus: float,
    target: ModelTarget,
    sources: Mapping[str, str],
    ingress_cpu_s_per_request: float = 0.0,
) -> dict[str, Any]:
    """One ``models.<application>`` entry of the measurements file from its parts (plan
    --measure's and plan --from-running's alike)."""
    entry = {
        "context_bytes": memory.context_bytes,
        "weights_bytes": memory.weights_bytes,
        "graph_pool_bytes": memory.graph_pool_bytes,
        "activation_peak_bytes": {str(n): b for n, b in sorted(peaks.items())},
        "candidates": [dict(c) for c in candidates],
        "cpu_s_per_request": cpu_s_per_request,
        "ingress_cpu_s_per_request": ingress_cpu_s_per_request,
        "num_cpus": num_cpus,
        "p99_target_s": target.p99_target_s,
        "weight": target.weight,
        "min_replicas": target.min_replicas,
        "max_replicas": target.max_replicas,
        "sources": dict(sources),
    }
    if target.load_rps is not None:
        entry["load_rps"] = target.load_rps
    return entry


def measurements_doc(
    *,
    models: Mapping[str, dict[str, Any]],
    gpu: Mapping[str, Any],
    margin_fraction: float,
    max_utilization: float = MAX_UTILIZATION,
    reserve: Mapping[str, Any],
    notes: Sequence[str],
    mode: str = "time-sliced",
) -> dict[str, Any]:
    """The measurements file (format 1), validated as ``serve-app plan`` reads it; ``mode``:
    plan --measure's is time-sliced (one replica had the GPU to itself)."""
    doc = {
        "format": 1,
        "mode": mode,
        "margin_fraction": margin_fraction,
        "max_utilization": max_utilization,
        "gpus": [dict(gpu)],
        "reserve": dict(reserve),
        "models": dict(models),
        "notes": list(notes),
    }
    Measurements.model_validate(doc)
    return doc


def startup_left(replicas: Iterable[Mapping[str, Any]]) -> list[str]:
    """The replica reports (GET /v1/memory's ``replicas``) that still have start-up work left
    for between batches (CUDA graphs to capture, warm-up batches), as "application/replica (N
    graphs, M warm-up batches)". Under load a replica captures the shapes its batches want and
    stalls its queue meanwhile: a window measured before this is done measures start-up."""
    left = []
    for r in replicas:
        graphs, warmup = int(r.get("cuda_graphs_pending") or 0), int(r.get("warmup_pending") or 0)
        if graphs or warmup:
            name = f"{r.get('application', '?')}/{r.get('replica_id', '?')}"
            left.append(f"{name} ({graphs} graphs, {warmup} warm-up batches)")
    return left
