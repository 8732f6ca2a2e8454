"""Pure scaling decisions: data in, decision out. No Ray, no NVML, time passed in.

``plan`` takes one deployment's load, its replicas' memory figures, the free bytes of each GPU
and the controller's settings, and returns the target replica count with the reason. The rules,
in the order they apply:

1. Bounds: a count outside ``[min_replicas, max_replicas]`` is brought back inside.
2. Bad data holds: a GPU reading that is stale, from the future, negative, or with free > total,
   a replica that has not reported, or a replica whose GPU has no reading -> hold.
3. Memory pressure sheds: a GPU whose free bytes fell below ``safety_margin_bytes`` (another
   process took memory) -> drop enough of this deployment's replicas on that GPU to cover the
   deficit, never below ``min_replicas``.
4. Replicas starting or stopping (running != target) -> hold: readings do not show them yet.
5. Load: up when ``load > target_ongoing_requests x current``; down only when the smaller count
   would still run below ``downscale_threshold`` of the target (the hysteresis band).
6. Headroom: a scale-up needs every GPU Ray might place the replica on to have free bytes of at
   least ``k x footprint + safety_margin_bytes`` (less bytes reserved for replicas still
   starting), and Ray to have ``k x gpu_fraction`` logical GPU free.

Cooldowns count from the last change of any kind: an up waits ``upscale_cooldown_s``, a
load-driven down ``downscale_cooldown_s``, a shed ``shed_cooldown_s`` after a down and
``min(upscale_cooldown_s, downscale_cooldown_s)`` after an up. So two direction changes are
always at least ``min(upscale_cooldown_s, downscale_cooldown_s)`` apart.

A replica's footprint is ``max(budget_bytes, ceil(peak_bytes x (1 + footprint_margin_fraction)))``.
The settings (``ControllerConfig``) and their checks are control.settings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from serve_app.control.settings import ControllerConfig

__all__ = [
    "Decision",
    "Direction",
    "GpuHeadroom",
    "PlannerInputs",
    "Reason",
    "ReplicaMemory",
    "Reservation",
    "footprint_bytes",
    "plan",
    "reading_problem",
]

_GIB = 1 << 30
_EPS = 1e-6


class Direction(StrEnum):
    UP = "up"
    DOWN = "down"
    HOLD = "hold"


class Reason(StrEnum):
    """Why the planner chose its target; a short, fixed set (used as a metric label)."""

    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    SHED = "shed_memory_pressure"
    BELOW_MIN = "below_min"
    ABOVE_MAX = "above_max"
    HOLD_IN_BAND = "hold_in_band"
    HOLD_COOLDOWN = "hold_cooldown"
    HOLD_BAD_READING = "hold_bad_reading"
    HOLD_MISSING_READING = "hold_missing_reading"
    HOLD_PENDING = "hold_pending"
    HOLD_NO_HEADROOM = "hold_no_headroom"
    HOLD_NO_RAY_GPU = "hold_no_ray_gpu"
    HOLD_AT_MAX = "hold_at_max"
    HOLD_AT_MIN = "hold_at_min"
    HOLD_NO_REPLICAS = "hold_no_replicas"


@dataclass(frozen=True)
class GpuHeadroom:
    """Device-level memory of one GPU (every process included), as read at ``timestamp_s``."""

    uuid: str
    total_bytes: int
    free_bytes: int
    timestamp_s: float


@dataclass(frozen=True)
class ReplicaMemory:
    """One running replica's memory figures. ``gpu_fraction`` is its ``num_gpus`` (0 on CPU);
    ``gpu_uuid`` is ``None`` for a CPU replica or when the replica could not name its GPU."""

    replica_id: str
    gpu_uuid: str | None
    gpu_fraction: float
    budget_bytes: int
    peak_bytes: int


@dataclass(frozen=True)
class Reservation:
    """Bytes promised to replicas that a scale-up started (this or another deployment).

    They count against every GPU in ``gpu_uuids`` (Ray picks the GPU) until a reading taken after
    ``settled_at_s`` (when the replicas were running) shows them; ``None``: still starting.
    """

    deployment: str
    bytes: int
    gpu_uuids: frozenset[str]
    settled_at_s: float | None


@dataclass(frozen=True)
class PlannerInputs:
    """Everything ``plan`` looks at for one deployment.

    ``target_replicas`` is the count Ray is converging to, ``running_replicas`` how many run now.
    ``ongoing_requests`` is running plus queued requests, summed over replicas. ``gpus`` holds
    the readings of every GPU that replicas of this deployment can see. ``ray_gpu_available``
    is Ray's free logical GPU (``None``: unknown). ``last_scale_*_s`` are when the target last
    went up or down (``None``: never).
    """

    running_replicas: int
    target_replicas: int
    min_replicas: int
    max_replicas: int
    ongoing_requests: float
    replicas: tuple[ReplicaMemory, ...]
    gpus: tuple[GpuHeadroom, ...]
    ray_gpu_available: float | None
    last_scale_up_s: float | None = None
    last_scale_down_s: float | None = None
    reservations: tuple[Reservation, ...] = ()


@dataclass(frozen=True)
class Decision:
    """The planner's answer: the target count, its direction, a reason code and a sentence."""

    target_replicas: int
    direction: Direction
    reason: Reason
    detail: str


def footprint_bytes(replica: ReplicaMemory, config: ControllerConfig) -> int:
    """What one replica needs: its budget, or its measured peak plus the margin if larger."""
    peak = math.ceil(replica.peak_bytes * (1.0 + config.footprint_margin_fraction))
    return max(replica.budget_bytes, peak)


def reading_problem(gpu: GpuHeadroom, config: ControllerConfig, now_s: float) -> str | None:
    """Why a GPU reading cannot be trusted, or ``None`` if it can."""
    if gpu.total_bytes <= 0:
        return f"{gpu.uuid}: total {gpu.total_bytes} bytes is not positive"
    if gpu.free_bytes < 0:
        return f"{gpu.uuid}: free {gpu.free_bytes} bytes is negative"
    if gpu.free_bytes > gpu.total_bytes:
        return f"{gpu.uuid}: free {gpu.free_bytes} > total {gpu.total_bytes} bytes"
    if not math.isfinite(gpu.timestamp_s):
        return f"{gpu.uuid}: reading has no timestamp"
    age_s = now_s - gpu.timestamp_s
    if age_s > config.max_reading_age_s:
        return f"{gpu.uuid}: reading is {age_s:.1f}s old (max {config.max_reading_age_s}s)"
    if -age_s > config.max_clock_skew_s:
        return f"{gpu.uuid}: reading is {-age_s:.1f}s in the future"
    return None


def _replica_problem(replica: ReplicaMemory) -> str | None:
    if replica.budget_bytes < 0 or replica.peak_bytes < 0:
        return f"replica {replica.replica_id}: negative memory figures"
    if not (0.0 <= replica.gpu_fraction <= 1.0):
        return f"replica {replica.replica_id}: gpu_fraction {replica.gpu_fraction} not in [0, 1]"
    return None


def _gib(n: int | float) -> str:
    return f"{n / _GIB:.2f} GiB"


def _reserved_on(gpu: GpuHeadroom, reservations: Iterable[Reservation], skew_s: float) -> int:
    return sum(
        r.bytes
        for r in reservations
        if gpu.uuid in r.gpu_uuids
        and (r.settled_at_s is None or gpu.timestamp_s <= r.settled_at_s + skew_s)
    )


def _cooldown_left_s(
    kind: Reason, inputs: PlannerInputs, config: ControllerConfig, now_s: float
) -> float:
    """Seconds before a change of this kind is allowed (0 when it is)."""

    def since(t: float | None) -> float:
        return math.inf if t is None else now_s - t

    up, down = since(inputs.last_scale_up_s), since(inputs.last_scale_down_s)
    last = min(up, down)
    if kind is Reason.SCALE_UP:
        return max(0.0, config.upscale_cooldown_s - last)
    if kind is Reason.SCALE_DOWN:
        return max(0.0, config.downscale_cooldown_s - last)
    # A shed: repeat sheds every shed_cooldown_s; turning down after an up waits the flip time.
    return max(0.0, config.shed_cooldown_s - down, config.flip_interval_s - up)


def _hold(current: int, reason: Reason, detail: str) -> Decision:
    return Decision(current, Direction.HOLD, reason, detail)


def plan(inputs: PlannerInputs, config: ControllerConfig, now_s: float) -> Decision:
    """Decide one deployment's target replica count; see the module docstring for the rules."""
    cur, lo, hi = inputs.target_replicas, inputs.min_replicas, inputs.max_replicas
    if cur < lo:
        return Decision(lo, Direction.UP, Reason.BELOW_MIN, f"{cur} replicas is below min {lo}")
    if cur > hi:
        return Decision(hi, Direction.DOWN, Reason.ABOVE_MAX, f"{cur} replicas is above max {hi}")
    if cur == 0 or inputs.running_replicas == 0:
        return _hold(cur, Reason.HOLD_NO_REPLICAS, "no running replica to measure yet")

    for problem in (_replica_problem(r) for r in inputs.replicas):
        if problem:
            return _hold(cur, Reason.HOLD_BAD_READING, problem)
    on_gpu = [r for r in inputs.replicas if r.gpu_fraction > 0 or r.gpu_uuid is not None]
    gpus = {g.uuid: g for g in inputs.gpus}
    footprint = max((footprint_bytes(r, config) for r in on_gpu), default=0)

    if on_gpu:
        for problem in (reading_problem(g, config, now_s) for g in inputs.gpus):
            if problem:
                return _hold(cur, Reason.HOLD_BAD_READING, problem)
        if footprint <= 0:
            return _hold(cur, Reason.HOLD_BAD_READING, "GPU replicas report no memory budget")
        for r in on_gpu:
            if r.gpu_uuid is None or r.gpu_uuid not in gpus:
                return _hold(
                    cur, Reason.HOLD_MISSING_READING, f"no GPU reading for replica {r.replica_id}"
                )
        shed = _shed_decision(inputs, on_gpu, footprint, config, now_s)
        if shed is not None:
            return shed

    if len(inputs.replicas) < inputs.running_replicas:
        return _hold(
            cur,
            Reason.HOLD_MISSING_READING,
            f"{len(inputs.replicas)} of {inputs.running_replicas} replicas reported memory",
        )
    if inputs.running_replicas != cur:
        return _hold(
            cur, Reason.HOLD_PENDING, f"{inputs.running_replicas} of {cur} replicas running"
        )

    target = config.target_ongoing_requests
    load = max(0.0, inputs.ongoing_requests)
    if load > target * cur:
        if cur >= hi:
            return _hold(cur, Reason.HOLD_AT_MAX, f"load {load:.1f} wants more than max {hi}")
        want = min(hi, math.ceil(load / target), cur + config.max_step_up) - cur
        wait_s = _cooldown_left_s(Reason.SCALE_UP, inputs, config, now_s)
        if wait_s > 0:
            return _hold(cur, Reason.HOLD_COOLDOWN, f"scale-up waits {wait_s:.1f}s of cooldown")
        if on_gpu:
            return _scale_up_on_gpu(inputs, on_gpu, footprint, want, config, load)
        return Decision(
            cur + want, Direction.UP, Reason.SCALE_UP, f"load {load:.1f} > {target} x {cur}"
        )

    if cur > lo and load < target * (cur - 1) * config.downscale_threshold:
        new = max(lo, math.ceil(load / (target * config.downscale_threshold)))
        wait_s = _cooldown_left_s(Reason.SCALE_DOWN, inputs, config, now_s)
        if wait_s > 0:
            return _hold(cur, Reason.HOLD_COOLDOWN, f"scale-down waits {wait_s:.1f}s of cooldown")
        return Decision(
            new,
            Direction.DOWN,
            Reason.SCALE_DOWN,
            f"load {load:.1f} < {config.downscale_threshold} x {target} x {cur - 1}",
        )
    return _hold(cur, Reason.HOLD_IN_BAND, f"load {load:.1f} for {cur} replicas is in band")


def _shed_decision(
    inputs: PlannerInputs,
    on_gpu: list[ReplicaMemory],
    footprint: int,
    config: ControllerConfig,
    now_s: float,
) -> Decision | None:
    """Replicas to drop because a GPU's free bytes fell below the margin, or ``None``."""
    cur, margin = inputs.target_replicas, config.safety_margin_bytes
    shed, notes = 0, []
    for gpu in inputs.gpus:
        if gpu.free_bytes >= margin:
            continue
        ours = sum(1 for r in on_gpu if r.gpu_uuid == gpu.uuid)
        need = math.ceil((margin - gpu.free_bytes) / footprint)
        shed += min(ours, need)
        notes.append(f"{gpu.uuid} free {_gib(gpu.free_bytes)} < margin {_gib(margin)}")
    if shed == 0:
        return None  # pressure on a GPU we have no replica on: nothing of ours to drop
    new = max(inputs.min_replicas, cur - shed)
    detail = "; ".join(notes)
    if new == cur:
        return _hold(cur, Reason.HOLD_AT_MIN, f"{detail}; already at min {inputs.min_replicas}")
    wait_s = _cooldown_left_s(Reason.SHED, inputs, config, now_s)
    if wait_s > 0:
        return _hold(cur, Reason.HOLD_COOLDOWN, f"{detail}; shed waits {wait_s:.1f}s of cooldown")
    return Decision(new, Direction.DOWN, Reason.SHED, detail)


def _scale_up_on_gpu(
    inputs: PlannerInputs,
    on_gpu: list[ReplicaMemory],
    footprint: int,
    want: int,
    config: ControllerConfig,
    load: float,
) -> Decision:
    """Add up to ``want`` replicas where every GPU Ray may pick has room for all of them."""
    cur, margin = inputs.target_replicas, config.safety_margin_bytes
    if inputs.ray_gpu_available is None or not math.isfinite(inputs.ray_gpu_available):
        return _hold(cur, Reason.HOLD_MISSING_READING, "Ray's free GPU is unknown")
    fraction = max(r.gpu_fraction for r in on_gpu)
    # A GPU this deployment alone already fills (in Ray's bookkeeping) cannot take the replica.
    candidates = [
        g
        for g in inputs.gpus
        if sum(r.gpu_fraction for r in on_gpu if r.gpu_uuid == g.uuid) + fraction <= 1.0 + _EPS
    ]
    fits_ray = math.floor((inputs.ray_gpu_available + _EPS) / fraction) if fraction > 0 else want
    if not candidates or fits_ray <= 0:
        return _hold(
            cur,
            Reason.HOLD_NO_RAY_GPU,
            f"Ray has {inputs.ray_gpu_available:.2f} GPU free, a replica needs {fraction:.2f}",
        )
    room = {
        g.uuid: g.free_bytes - _reserved_on(g, inputs.reservations, config.max_clock_skew_s)
        for g in candidates
    }
    tightest = min(candidates, key=lambda g: room[g.uuid])
    fits_memory = max(0, (room[tightest.uuid] - margin) // footprint)
    k = min(want, fits_ray, fits_memory)
    if k <= 0:
        return _hold(
            cur,
            Reason.HOLD_NO_HEADROOM,
            f"{tightest.uuid} has {_gib(room[tightest.uuid])} free, a replica needs "
            f"{_gib(footprint)} + margin {_gib(margin)}",
        )
    return Decision(
        cur + k,
        Direction.UP,
        Reason.SCALE_UP,
        f"load {load:.1f} > {config.target_ongoing_requests} x {cur}; {tightest.uuid} has "
        f"{_gib(room[tightest.uuid])} free for {k} x {_gib(footprint)} + margin {_gib(margin)}",
    )
