"""A running server's reports turned into the measurements file's schema (format 1,
serve_app.plan.measurements), for ``serve-app plan --from-running URL``. Pure: the reports,
the metrics and the process readings come in as data (serve_app.plan.fromrunning reads them).

Two reads of ``GET URL/v1/memory``, ``--window-s`` apart. Per application, over the replicas
that reported at both ends (each replica's own ``reported_at_s`` times its counters):

- memory, from the replicas' own readings (the largest over them): ``context_bytes`` is
  ``non_torch_overhead_bytes``; ``graph_pool_bytes`` is ``cuda_graph_pool_bytes``;
  ``weights_bytes`` is torch's allocated bytes between batches, at most its reserved bytes
  less the pool; the activation peak at the batch cap in force is the rest of the peak
  reserved bytes (torch resets it after warm-up, so it is what serving needed), raised to
  calibration's peak where calibration measured at that cap, and to NVML's bytes of the
  process. One candidate: the cap in force (live traffic measures no other);
- throughput at saturation: the requests answered in the window over the model thread's busy
  seconds (the rate over the busy fraction), or over the busiest thread's CPU seconds where the
  replica processes run on this host and one of their threads was busier than the model
  thread (one thread runs on one core at most: an event loop that reads and answers every
  request saturates the replica before the model does); where batches were smaller than the
  cap, a low estimate (a fuller batch carries more per busy second); refused on too little
  traffic;
- requests: the ``request_seconds`` histogram's count of Ray's metrics where given, else the
  batched items over the targets' items per request;
- p99: that histogram's p99 over the window (the replica's own time, not HAProxy's),
  interpolated within its bucket; it was seen at the load seen, so the idle p99 written is it
  less the tail the solver adds at that rate (``idle_p99``), at least one mean batch time; else
  an ASSUMPTION: two mean batch times;
- CPU per request: the replica processes' CPU seconds where they run on this host (psutil),
  else an ASSUMPTION that the CPU binds no lower than what was seen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from serve_app.plan.measurements import MAX_UTILIZATION
from serve_app.plan.readings import MemoryFigures, cpu_memory, entry_doc, measurements_doc
from serve_app.plan.solver import TAIL
from serve_app.plan.targets import ModelTarget

MIN_BATCHES = 20  # batches in the window below which no rate is estimated
MIN_REQUESTS = 20
MIN_BUSY_FRACTION = 0.01  # below it, rate / busy fraction extrapolates a hundredfold or more
IDLE_BATCHES = 2.0  # the ASSUMPTION for a missing p99: the batch in progress, then its own


class NotEnoughTraffic(ValueError):
    """The window saw too little traffic to estimate a saturation rate from."""


@dataclass(frozen=True)
class AppWindow:
    """One application over the window: its replicas at the end and their counters' deltas."""

    name: str
    replicas: list[dict[str, Any]]  # the reports at the window's end
    paired: int  # replicas that reported at both ends
    seconds: float  # the sum over paired replicas of their reports' time apart
    batches: int
    items: int
    busy_s: float
    refused: int  # 503s: rejected (queue full) and expired (queue deadline)
    largest_batch: int
    cap: int  # the largest batch cap in force
    items_by_replica: dict[tuple[Any, Any], int] = field(default_factory=dict)  # paired only
    p99_seen_s: float | None = None  # the requests' p99 the metrics gave for the window


@dataclass(frozen=True)
class Traffic:
    """What the window says of an application's requests (from the metrics, or estimated)."""

    requests: float
    how: str  # how ``requests`` was counted
    p99_s: float | None = None  # the replica's request time, its p99 over the window
    p99_how: str = ""
    cpu_s: float | None = None  # CPU seconds of its replicas' processes on this host
    cpu_requests: float = 0.0  # the requests those processes answered
    # The busiest thread of each replica process on this host, its CPU fraction of the window,
    # the mean over those replicas, and that thread's name (the busiest one's over them).
    busiest_thread_fraction: float | None = None
    busiest_thread_name: str = ""


def by_application(doc: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """``GET /v1/memory``'s replicas grouped by their Serve application."""
    out: dict[str, list[dict[str, Any]]] = {}
    for rep in doc.get("replicas") or []:
        out.setdefault(str(rep.get("application")), []).append(rep)
    return out


def app_window(
    name: str, first: Sequence[Mapping[str, Any]], last: Sequence[Mapping[str, Any]]
) -> AppWindow:
    """The deltas of application ``name``'s counters between two reads (by replica and pid;
    a replica that started or stopped in between counts for memory, not for rates)."""
    before = {(r.get("replica_id"), r.get("pid")): r for r in first}
    seconds = busy = 0.0
    batches = items = refused = paired = 0
    by_replica: dict[tuple[Any, Any], int] = {}
    for rep in last:
        old = before.get((rep.get("replica_id"), rep.get("pid")))
        if old is None:
            continue
        dt = float(rep["reported_at_s"]) - float(old["reported_at_s"])
        if dt <= 0:
            continue
        paired += 1
        seconds += dt
        batches += int(rep["batches"]) - int(old["batches"])
        got = int(rep["batched_items"]) - int(old["batched_items"])
        items += got
        by_replica[(rep.get("replica_id"), rep.get("pid"))] = got
        busy += float(rep["batch_busy_s"]) - float(old["batch_busy_s"])
        for key in ("rejected_requests", "expired_requests"):
            refused += int(rep.get(key) or 0) - int(old.get(key) or 0)
    return AppWindow(
        name=name,
        replicas=[dict(r) for r in last],
        paired=paired,
        seconds=seconds,
        batches=batches,
        items=items,
        busy_s=busy,
        refused=refused,
        largest_batch=max((int(r.get("largest_batch") or 0) for r in last), default=0),
        cap=max((int(r["max_batch_size"]) for r in last), default=0),
        items_by_replica=by_replica,
    )


def busy_fraction(w: AppWindow) -> float:
    """The model threads' busy fraction over the window, their mean."""
    return w.busy_s / w.seconds if w.seconds > 0 else 0.0


def bound_busy_s(w: AppWindow, t: Traffic) -> tuple[float, bool]:
    """The busy seconds the saturation rate divides by: the model threads', or, when a single
    thread of the replica processes (the event loop that reads and answers requests, say) was
    busier, that thread's CPU fraction times the window's replica-seconds; and whether that
    thread bound it. One thread cannot run more than one core, so a replica saturates when
    its busiest thread does, whichever thread that is."""
    thread = t.busiest_thread_fraction
    if thread is not None and thread * w.seconds > w.busy_s:
        return thread * w.seconds, True
    return w.busy_s, False


def saturation_rps(w: AppWindow, t: Traffic) -> float:
    """One replica's requests/s at saturation: the window's requests over its busy seconds
    (``bound_busy_s``). Raises NotEnoughTraffic, naming what was seen, when that is too little
    to go on."""
    seen = (
        f"{w.batches} batches, {t.requests:.0f} requests, model threads busy "
        f"{100 * busy_fraction(w):.1f}% of {w.seconds:.1f} replica-seconds"
    )
    if (
        w.paired == 0
        or w.batches < MIN_BATCHES
        or t.requests < MIN_REQUESTS
        or busy_fraction(w) < MIN_BUSY_FRACTION
    ):
        raise NotEnoughTraffic(
            f"application {w.name}: too little traffic in the window to estimate a rate at "
            f"saturation ({seen}; needed at least {MIN_BATCHES} batches, {MIN_REQUESTS} "
            f"requests and {100 * MIN_BUSY_FRACTION:g}% busy): lengthen --window-s or run it "
            "while the server carries its usual load"
        )
    return t.requests / bound_busy_s(w, t)[0]


def gpu_memory_live(replicas: Sequence[Mapping[str, Any]]) -> MemoryFigures:
    """The memory figures of an application's GPU replicas (see the module docstring), each
    the largest over them, so that a budget from them holds what any of them was seen to
    need."""
    context = weights = pool = act = 0
    raised: set[str] = set()
    for r in replicas:
        r_pool = int(r.get("cuda_graph_pool_bytes") or 0)
        r_ctx = int(r["non_torch_overhead_bytes"])
        r_w = max(0, min(int(r["allocated_bytes"]), int(r["reserved_bytes"]) - r_pool))
        r_act = max(0, int(r["peak_reserved_bytes"]) - r_pool - r_w)
        fixed = r_ctx + r_pool + r_w
        calib = r.get("calibration_peak_bytes")
        if calib is None or r.get("calibrated_batch_size") != r.get("max_batch_size"):
            calib = None  # calibration measured at another cap than the one in force
        for key, seen in (("calibration", calib), ("NVML", r.get("nvml_process_bytes"))):
            if seen is not None and int(seen) - fixed > r_act:
                r_act = int(seen) - fixed
                raised.add(key)
        context, weights = max(context, r_ctx), max(weights, r_w)
        pool, act = max(pool, r_pool), max(act, r_act)
    cap = max(int(r["max_batch_size"]) for r in replicas)
    largest = max(int(r.get("largest_batch") or 0) for r in replicas)
    act_how = (
        "peak_reserved_bytes (torch's peak since warm-up) less the pool and weights, at the "
        f"batch cap in force ({cap}; the largest batch seen: {largest})"
    )
    names = {"calibration": "calibration's peak at that cap", "NVML": "NVML's process bytes"}
    if raised:
        act_how += "; raised to " + " and ".join(names[k] for k in sorted(raised))
    return MemoryFigures(
        context_bytes=context,
        weights_bytes=weights,
        graph_pool_bytes=pool,
        activation_peak_bytes={cap: act},
        how={
            "context_bytes": "non_torch_overhead_bytes",
            "weights_bytes": "allocated_bytes (torch's, between batches), at most "
            "reserved_bytes less the graph pool",
            "graph_pool_bytes": "cuda_graph_pool_bytes",
            "activation_peak_bytes": act_how,
        },
    )


def cpu_memory_live(replicas: Sequence[Mapping[str, Any]], rss_bytes: int | None) -> MemoryFigures:
    """CPU replicas have no GPU figures: their processes' resident bytes stand in for the
    weights, as ``plan --measure`` does on the CPU (ValueError without them)."""
    if rss_bytes is None:
        raise ValueError(
            "CPU replicas report no GPU bytes, and their processes are not on this host to read "
            "their resident memory from: run the command on the replicas' host"
        )
    cap = max(int(r["max_batch_size"]) for r in replicas)
    base = cpu_memory(rss_bytes)
    # The cap in force is the one candidate live traffic measures; its peak is 0 like the rest.
    return replace(
        base,
        activation_peak_bytes={cap: 0},
        how=base.how
        | {
            "weights_bytes": "no GPU: the replica processes' resident host memory (RSS, the "
            "largest), a stand-in, not GPU bytes"
        },
    )


def idle_p99(
    seen_s: float, rate_rps: float, saturation_rps: float, floor_s: float
) -> tuple[float, str]:
    """The idle p99 under which the solver's tail (``p99 = idle + TAIL / (saturation - rate)``)
    predicts the p99 ``seen_s`` at the per-replica rate seen, at least ``floor_s``; with how."""
    if rate_rps >= saturation_rps:
        return seen_s, "the p99 seen, as it is (the rate seen reached the saturation estimate)"
    tail_s = TAIL / (saturation_rps - rate_rps)
    at = f"the p99 seen ({seen_s:.4f} s at {rate_rps:.1f} req/s a replica)"
    if seen_s - tail_s < floor_s:
        return floor_s, (
            f"{at} less the solver's tail there ({tail_s:.4f} s) is below one mean batch "
            f"time, so that ({floor_s:.5f} s)"
        )
    return seen_s - tail_s, (
        f"{at} less the solver's tail there (ln 100 / ({saturation_rps:.1f} - "
        f"{rate_rps:.1f}) = {tail_s:.4f} s), so that the plan predicts the p99 seen at the "
        "rate seen"
    )


def live_model_entry(
    w: AppWindow,
    t: Traffic,
    memory: MemoryFigures,
    target: ModelTarget,
    num_cpus: float,
    provenance: str,
) -> dict[str, Any]:
    """One ``models.<application>`` entry from the window. ``provenance`` ("read from the
    running server at URL ...") starts every source. Raises NotEnoughTraffic."""
    sat = saturation_rps(w, t)
    on_gpu = any(r.get("gpu_mode") == "cuda" for r in w.replicas)
    mean_batch_s = w.busy_s / w.batches
    gpu_s = w.busy_s / t.requests if on_gpu else 0.0
    if t.cpu_s is not None and t.cpu_requests > 0 and t.cpu_s > 0:
        cpu_s = t.cpu_s / t.cpu_requests
        cpu_how = (
            "the replica processes' CPU seconds (psutil cpu_times, user + system, read on "
            "this host at the window's ends) per request answered"
        )
    else:
        cpu_s = num_cpus / sat
        cpu_how = (
            "ASSUMPTION: the replica processes are not on this host, so their CPU was not "
            "read; taken as num_cpus over the estimated saturation rate (the CPU binds no "
            "lower than the model thread)"
        )
    if t.p99_s is not None and t.p99_s > 0:
        # The solver caps a replica at its CPU bound too (measurements.to_problem).
        rate = t.requests / w.seconds if w.seconds > 0 else 0.0
        p99, turned = idle_p99(t.p99_s, rate, min(sat, num_cpus / cpu_s), mean_batch_s)
        p99_how = f"{t.p99_how}; {turned}"
    else:
        p99 = IDLE_BATCHES * mean_batch_s
        p99_how = (
            f"ASSUMPTION: no p99 read ({t.p99_how or 'no metrics given'}); two mean batch "
            f"times ({mean_batch_s:.5f} s each over the window): the batch in progress, then "
            "its own"
        )
    mean_batch = w.items / w.batches
    busy_s, by_thread = bound_busy_s(w, t)
    if by_thread:
        over = (
            f"{busy_s:.3f} busy seconds of the replica processes' busiest thread "
            f"({t.busiest_thread_name or 'unnamed'}: {t.busiest_thread_fraction:.3f} of the "
            f"window, above the model threads' busy fraction {busy_fraction(w):.3f}, so that "
            "thread, not the model, saturates first)"
        )
    else:
        thread = (
            f"; busiest other thread {t.busiest_thread_fraction:.3f}"
            if t.busiest_thread_fraction is not None
            else "; threads not read (the replicas are not on this host)"
        )
        over = (
            f"the model threads' {w.busy_s:.3f} busy seconds (the rate over the busy "
            f"fraction {busy_fraction(w):.3f}{thread})"
        )
    sources = {k: f"{provenance}: {v}" for k, v in memory.how.items()}
    sources |= {
        "throughput_rps": f"{provenance}: an estimate from live traffic: {t.requests:.0f} "
        f"requests over {over}; mean batch {mean_batch:.1f} of cap {w.cap}, so low where "
        "batches were not full. Requests: " + t.how,
        "p99_idle_s": f"{provenance}: {p99_how}",
        "gpu_s_per_request": f"{provenance}: "
        + (
            "the model thread's busy seconds per request (an upper bound: NVML's utilisation "
            "is not in the reports)"
            if on_gpu
            else "no GPU: 0"
        ),
        "cpu_s_per_request": f"{provenance}: {cpu_how}",
        "ingress_cpu_s_per_request": "ASSUMPTION: 0, not read from a running server (only "
        "plan --measure reads the ingress's CPU); the reserve's cores must hold the ingress",
        "p99_target_s": "the targets file",
    }
    candidate = {
        "batch_size": w.cap,
        "throughput_rps": sat,
        "p99_idle_s": p99,
        "gpu_s_per_request": gpu_s,
    }
    return entry_doc(
        memory, memory.activation_peak_bytes, [candidate], cpu_s, num_cpus, target, sources
    )


def gpu_entry(
    doc: Mapping[str, Any], replicas: Sequence[Mapping[str, Any]], cores_per_gpu: float | None
) -> tuple[dict[str, Any], str]:
    """``gpus[0]`` from the running GPU replicas: the smallest total a replica's share was
    taken of (its budget over its share: CUDA's total, as shares are derived), the GPUs the
    node monitors see (else those the replicas sit on); and how it was read."""
    on = [r for r in replicas if r.get("gpu_mode") == "cuda" and float(r.get("num_gpus") or 0)]
    if not on:
        raise ValueError("no GPU replica reports a share")
    total = min(math.ceil(int(r["budget_bytes"]) / float(r["num_gpus"])) for r in on)
    uuids = {str(g.get("uuid")) for g in doc.get("gpus") or []}
    count = len(uuids) or len({str(r.get("gpu_uuid")) for r in on})
    if cores_per_gpu is None:
        raise ValueError(
            "the replicas are not on this host, so its cores say nothing of theirs: give "
            "--cores-per-gpu"
        )
    how = (
        f"total_bytes: the smallest budget_bytes / num_gpus of the replicas (CUDA's total); "
        f"count: {'the GPUs the node monitors read' if uuids else 'the GPUs replicas sit on'}; "
        f"cores: {cores_per_gpu:g} per GPU"
    )
    gpu = {"name": "GPU of the running replicas", "total_bytes": total}
    return gpu | {"cores": cores_per_gpu, "count": count}, how


def measurements_live(
    *,
    models: Mapping[str, dict[str, Any]],
    gpu: Mapping[str, Any],
    mps: bool,
    margin_fraction: float,
    max_utilization: float = MAX_UTILIZATION,
    reserve: Mapping[str, Any],
    notes: Sequence[str],
) -> dict[str, Any]:
    """The measurements file (format 1) from live figures, validated as ``plan`` reads it."""
    return measurements_doc(
        models=models,
        gpu=gpu,
        margin_fraction=margin_fraction,
        max_utilization=max_utilization,
        reserve=reserve,
        notes=notes,
        mode="mps" if mps else "time-sliced",
    )
