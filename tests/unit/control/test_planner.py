"""The planner on scripted readings: table tests, then properties over random sequences."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.control.planner import (
    Direction,
    GpuHeadroom,
    PlannerInputs,
    Reason,
    ReplicaMemory,
    Reservation,
    footprint_bytes,
    plan,
    reading_problem,
)
from serve_app.control.settings import ControllerConfig

GIB = 1 << 30
NOW = 10_000.0
CFG = ControllerConfig(
    target_ongoing_requests=2.0,
    safety_margin_bytes=2 * GIB,
    footprint_margin_fraction=0.10,
    upscale_cooldown_s=30.0,
    downscale_cooldown_s=60.0,
    shed_cooldown_s=10.0,
    max_reading_age_s=10.0,
    max_clock_skew_s=2.0,
    downscale_threshold=0.8,
)


def reps(
    n: int,
    gpus: tuple[str, ...] = ("g0",),
    budget: int = 8 * GIB,
    peak: int = 0,
    fraction: float = 0.25,
) -> tuple[ReplicaMemory, ...]:
    return tuple(
        ReplicaMemory(f"r{i}", gpus[i % len(gpus)], fraction, budget, peak) for i in range(n)
    )


def inputs(
    cur: int = 2,
    *,
    load: float = 3.0,
    free: int = 40 * GIB,
    total: int = 80 * GIB,
    ts: float = NOW,
    ray: float | None = 0.5,
    lo: int = 1,
    hi: int = 4,
    running: int | None = None,
    **kw: object,
) -> PlannerInputs:
    base = PlannerInputs(
        running_replicas=cur if running is None else running,
        target_replicas=cur,
        min_replicas=lo,
        max_replicas=hi,
        ongoing_requests=load,
        replicas=reps(cur),
        gpus=(GpuHeadroom("g0", total, free, ts),),
        ray_gpu_available=ray,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("case", "expected_target", "expected_reason"),
    [
        (inputs(), 2, Reason.HOLD_IN_BAND),
        (inputs(load=5.0), 3, Reason.SCALE_UP),
        (inputs(load=5.0, free=9 * GIB), 2, Reason.HOLD_NO_HEADROOM),  # 8 + 2 GiB needed
        (inputs(load=5.0, free=10 * GIB), 3, Reason.SCALE_UP),  # exactly footprint + margin
        (inputs(load=5.0, ray=0.1), 2, Reason.HOLD_NO_RAY_GPU),
        (inputs(load=5.0, ray=None), 2, Reason.HOLD_MISSING_READING),
        (inputs(4, load=50.0), 4, Reason.HOLD_AT_MAX),
        (inputs(load=5.0, last_scale_up_s=NOW - 5), 2, Reason.HOLD_COOLDOWN),
        (inputs(load=5.0, last_scale_down_s=NOW - 29), 2, Reason.HOLD_COOLDOWN),
        (inputs(load=5.0, last_scale_down_s=NOW - 30), 3, Reason.SCALE_UP),
        (inputs(3, load=1.0), 1, Reason.SCALE_DOWN),  # ceil(1 / (2 x 0.8)) = 1
        (inputs(3, load=3.3), 3, Reason.HOLD_IN_BAND),  # 3.3 >= 2 x 2 x 0.8: the band holds
        (inputs(3, load=3.1), 2, Reason.SCALE_DOWN),
        (inputs(3, load=1.0, last_scale_up_s=NOW - 59), 3, Reason.HOLD_COOLDOWN),
        (inputs(1, load=0.0), 1, Reason.HOLD_IN_BAND),  # at min: no scale-down
        (inputs(3, free=1 * GIB), 2, Reason.SHED),  # 1 GiB short, one 8 GiB replica covers it
        (inputs(3, free=0, lo=2), 2, Reason.SHED),  # never below min
        (inputs(1, free=1 * GIB), 1, Reason.HOLD_AT_MIN),
        (inputs(3, free=1 * GIB, last_scale_up_s=NOW - 5), 3, Reason.HOLD_COOLDOWN),
        (inputs(3, free=1 * GIB, last_scale_down_s=NOW - 5), 3, Reason.HOLD_COOLDOWN),
        (inputs(3, free=1 * GIB, last_scale_down_s=NOW - 10), 2, Reason.SHED),
        (inputs(load=9.0, ts=NOW - 11), 2, Reason.HOLD_BAD_READING),  # stale
        (inputs(load=9.0, ts=NOW + 3), 2, Reason.HOLD_BAD_READING),  # from the future
        (inputs(load=9.0, free=81 * GIB), 2, Reason.HOLD_BAD_READING),  # free > total
        (inputs(load=9.0, free=-1), 2, Reason.HOLD_BAD_READING),
        (inputs(3, free=-1), 3, Reason.HOLD_BAD_READING),  # a bad reading never sheds either
        (inputs(load=9.0, total=0, free=0), 2, Reason.HOLD_BAD_READING),
        (inputs(load=9.0, gpus=()), 2, Reason.HOLD_MISSING_READING),
        (inputs(load=9.0, replicas=reps(1)), 2, Reason.HOLD_MISSING_READING),
        (inputs(load=9.0, running=1), 2, Reason.HOLD_PENDING),
        (inputs(0, lo=1), 1, Reason.BELOW_MIN),
        (inputs(5, hi=4), 4, Reason.ABOVE_MAX),
        (inputs(0, lo=0, load=0.0, replicas=()), 0, Reason.HOLD_NO_REPLICAS),
    ],
)
def test_plan_table(case: PlannerInputs, expected_target: int, expected_reason: Reason) -> None:
    decision = plan(case, CFG, NOW)
    assert (decision.target_replicas, decision.reason) == (expected_target, expected_reason)
    assert decision.detail


def test_direction_matches_target() -> None:
    assert plan(inputs(load=5.0), CFG, NOW).direction is Direction.UP
    assert plan(inputs(3, load=1.0), CFG, NOW).direction is Direction.DOWN
    assert plan(inputs(), CFG, NOW).direction is Direction.HOLD


def test_footprint_is_budget_or_peak_plus_margin() -> None:
    small_peak = ReplicaMemory("r", "g0", 0.25, 8 * GIB, 4 * GIB)
    big_peak = ReplicaMemory("r", "g0", 0.25, 8 * GIB, 10 * GIB)
    assert footprint_bytes(small_peak, CFG) == 8 * GIB
    assert footprint_bytes(big_peak, CFG) == math.ceil(10 * GIB * 1.1)


def test_scale_up_uses_the_largest_footprint() -> None:
    big = (ReplicaMemory("r0", "g0", 0.25, 8 * GIB, 10 * GIB), *reps(1))
    # needs 11 GiB + 2 GiB margin
    assert plan(inputs(load=5.0, free=12 * GIB, replicas=big), CFG, NOW).reason == (
        Reason.HOLD_NO_HEADROOM
    )
    assert plan(inputs(load=5.0, free=13 * GIB, replicas=big), CFG, NOW).target_replicas == 3


def test_step_up_limited_by_memory_and_ray() -> None:
    cfg = CFG.model_copy(update={"max_step_up": 3})
    # load 10 wants 5 replicas: 3 more, at most max_step_up
    assert plan(inputs(load=10.0, free=28 * GIB, ray=1.0, hi=6), cfg, NOW).target_replicas == 5
    # (20 - 2) // 8 = 2 fit in memory
    assert plan(inputs(load=10.0, free=20 * GIB, ray=1.0, hi=6), cfg, NOW).target_replicas == 4
    # Ray has room for two 0.25 replicas
    assert plan(inputs(load=10.0, free=28 * GIB, ray=0.5, hi=6), cfg, NOW).target_replicas == 4
    assert plan(inputs(load=10.0, free=28 * GIB, ray=1.0, hi=4), cfg, NOW).target_replicas == 4


def test_every_gpu_ray_may_pick_must_have_room() -> None:
    two = (GpuHeadroom("g0", 80 * GIB, 40 * GIB, NOW), GpuHeadroom("g1", 80 * GIB, 5 * GIB, NOW))
    case = inputs(load=5.0, gpus=two, replicas=reps(2, ("g0", "g1")))
    decision = plan(case, CFG, NOW)
    assert decision.reason is Reason.HOLD_NO_HEADROOM
    assert "g1" in decision.detail


def test_a_gpu_this_deployment_fills_is_not_a_candidate() -> None:
    # four 0.25 replicas fill g0 in Ray's bookkeeping: only g1 can take the fifth
    two = (GpuHeadroom("g0", 80 * GIB, 1 * GIB, NOW), GpuHeadroom("g1", 80 * GIB, 40 * GIB, NOW))
    full = reps(4, ("g0",), budget=1)
    case = inputs(4, load=9.0, hi=6, gpus=two, replicas=full, ray=1.0)
    # g0 is below the margin but holds our replicas: the shed rule fires first
    assert plan(case, CFG, NOW).reason is Reason.SHED
    roomy = (GpuHeadroom("g0", 80 * GIB, 3 * GIB, NOW), two[1])
    case = inputs(4, load=9.0, hi=6, gpus=roomy, replicas=full, ray=1.0)
    assert plan(case, CFG, NOW).reason is Reason.SCALE_UP


def test_pressure_on_a_gpu_without_our_replicas_blocks_scale_up_only() -> None:
    two = (GpuHeadroom("g0", 80 * GIB, 40 * GIB, NOW), GpuHeadroom("g1", 80 * GIB, 1 * GIB, NOW))
    assert plan(inputs(gpus=two), CFG, NOW).reason is Reason.HOLD_IN_BAND
    assert plan(inputs(load=5.0, gpus=two), CFG, NOW).reason is Reason.HOLD_NO_HEADROOM


def test_reservations_count_until_a_newer_reading() -> None:
    pending = Reservation("other", 8 * GIB, frozenset({"g0"}), None)
    case = inputs(load=5.0, free=17 * GIB, reservations=(pending,))
    assert plan(case, CFG, NOW).reason is Reason.HOLD_NO_HEADROOM  # 17 - 8 < 8 + 2
    settled_before = replace(pending, settled_at_s=NOW - 5)  # the reading (at NOW) is newer
    case = inputs(load=5.0, free=17 * GIB, reservations=(settled_before,))
    assert plan(case, CFG, NOW).reason is Reason.SCALE_UP
    elsewhere = replace(pending, gpu_uuids=frozenset({"g9"}))
    assert plan(inputs(load=5.0, free=17 * GIB, reservations=(elsewhere,)), CFG, NOW).reason is (
        Reason.SCALE_UP
    )


def test_cpu_deployment_scales_on_load_alone() -> None:
    cpu = tuple(ReplicaMemory(f"r{i}", None, 0.0, 0, 0) for i in range(2))
    assert plan(inputs(load=5.0, replicas=cpu, gpus=(), ray=None), CFG, NOW).target_replicas == 3


def test_reading_problem_messages() -> None:
    assert reading_problem(GpuHeadroom("g0", 10, 5, NOW), CFG, NOW) is None
    assert "old" in (reading_problem(GpuHeadroom("g0", 10, 5, NOW - 11), CFG, NOW) or "")
    assert "free 11 > total 10" in (reading_problem(GpuHeadroom("g0", 10, 11, NOW), CFG, NOW) or "")


# ---------------------------------------------------------------------------------------------
# Two GPUs: the planner sheds only where memory was taken.
# ---------------------------------------------------------------------------------------------

CFG2 = ControllerConfig(safety_margin_bytes=2 * GIB, shed_cooldown_s=1.0, upscale_cooldown_s=1.0)
A, B = "gpu-a", "gpu-b"


def two_gpus(free_a: int, free_b: int) -> tuple[GpuHeadroom, ...]:
    return (GpuHeadroom(A, 80 * GIB, free_a, NOW), GpuHeadroom(B, 80 * GIB, free_b, NOW))


def deployment(on: dict[str, int], free: tuple[GpuHeadroom, ...], load: float) -> PlannerInputs:
    """A deployment with ``on[gpu]`` replicas of 0.25 (20 GiB budgets) on each GPU."""
    replicas = tuple(
        ReplicaMemory(f"{gpu}-{i}", gpu, 0.25, 20 * GIB, 0)
        for gpu, n in on.items()
        for i in range(n)
    )
    n = len(replicas)
    return PlannerInputs(n, n, 1, 8, load, replicas, free, ray_gpu_available=1.0)


def test_a_grab_on_gpu_b_sheds_the_deployment_on_b_only() -> None:
    grabbed = two_gpus(40 * GIB, 1 * GIB)  # something outside Ray took GPU B's memory
    on_a = plan(deployment({A: 2}, grabbed, load=4.0), CFG2, NOW)
    on_b = plan(deployment({B: 2}, grabbed, load=4.0), CFG2, NOW)
    assert on_b.reason is Reason.SHED and on_b.target_replicas == 1, on_b
    assert B in on_b.detail and A not in on_b.detail
    assert on_a.reason is Reason.HOLD_IN_BAND and on_a.target_replicas == 2, on_a


def test_a_deployment_on_both_gpus_sheds_as_many_as_gpu_b_needs() -> None:
    # 1 GiB short on B: one 20 GiB replica covers it, although two of ours sit there.
    one = plan(deployment({A: 2, B: 2}, two_gpus(40 * GIB, 1 * GIB), load=8.0), CFG2, NOW)
    assert (one.reason, one.target_replicas) == (Reason.SHED, 3)
    # 30 GiB short on B: both replicas there go, and never more than the two on B.
    wide = CFG2.model_copy(update={"safety_margin_bytes": 30 * GIB})
    two = plan(deployment({A: 2, B: 2}, two_gpus(40 * GIB, 0), load=8.0), wide, NOW)
    assert (two.reason, two.target_replicas) == (Reason.SHED, 2)

    # Serve, not the planner, picks which replicas stop (by node, newest first): on one node
    # with two GPUs it may stop replicas on A. docs/cluster.md says why and what pins them.


def test_a_grab_on_a_gpu_the_deployment_may_use_blocks_its_scale_up() -> None:
    # Ray may place the next replica on either GPU its node has, so both need room.
    held = plan(deployment({A: 1}, two_gpus(40 * GIB, 1 * GIB), load=4.0), CFG2, NOW)
    assert held.reason is Reason.HOLD_NO_HEADROOM and B in held.detail
    # A Ray node per GPU: the node monitor reports only its GPU, so B is not a candidate.
    up = plan(deployment({A: 1}, two_gpus(40 * GIB, 1 * GIB)[:1], load=4.0), CFG2, NOW)
    assert up.reason is Reason.SCALE_UP and up.target_replicas == 2


# ---------------------------------------------------------------------------------------------
# Properties: for any sequence of readings and loads.
# ---------------------------------------------------------------------------------------------

_step = st.fixed_dictionaries(
    {
        "dt_s": st.floats(0.0, 45.0),
        "load": st.floats(0.0, 40.0),
        # mostly sound readings, with bad ones mixed in: negative, free > total, stale, future
        "free_gib": st.lists(
            st.one_of(st.floats(0.0, 80.0), st.floats(-2.0, 90.0)), min_size=2, max_size=2
        ),
        "age_s": st.one_of(st.floats(0.0, 9.0), st.floats(-5.0, 20.0)),
        "ray": st.one_of(st.floats(0.0, 2.0), st.none(), st.floats(-0.5, 2.0)),
        "peak_gib": st.floats(0.0, 12.0),
    }
)


@st.composite
def _scenario(draw: st.DrawFn) -> tuple[int, int, int, int, list[dict[str, object]]]:
    lo = draw(st.integers(0, 3))
    hi = draw(st.integers(max(lo, 1), 6))
    start = draw(st.integers(max(lo, 1), hi))
    n_gpus = draw(st.integers(1, 2))
    return lo, hi, start, n_gpus, draw(st.lists(_step, min_size=1, max_size=40))


def _simulate(scenario: tuple[int, int, int, int, list[dict[str, object]]], cfg: ControllerConfig):
    """Apply each decision at once, as Ray does with zero delays; yield what each step saw."""
    lo, hi, cur, n_gpus, steps = scenario
    now, last_up, last_down = 1_000.0, None, None
    names = tuple(f"g{i}" for i in range(n_gpus))
    for step in steps:
        now += float(step["dt_s"])  # type: ignore[arg-type]
        gpus = tuple(
            GpuHeadroom(n, 80 * GIB, int(float(f) * GIB), now - float(step["age_s"]))  # type: ignore[arg-type]
            for n, f in zip(names, step["free_gib"], strict=False)  # type: ignore[call-overload]
        )
        replicas = reps(cur, names, peak=int(float(step["peak_gib"]) * GIB))  # type: ignore[arg-type]
        case = PlannerInputs(
            running_replicas=cur,
            target_replicas=cur,
            min_replicas=lo,
            max_replicas=hi,
            ongoing_requests=float(step["load"]),  # type: ignore[arg-type]
            replicas=replicas,
            gpus=gpus,
            ray_gpu_available=step["ray"],  # type: ignore[arg-type]
            last_scale_up_s=last_up,
            last_scale_down_s=last_down,
        )
        decision = plan(case, cfg, now)
        yield now, case, decision
        if decision.target_replicas > cur:
            last_up = now
        elif decision.target_replicas < cur:
            last_down = now
        cur = decision.target_replicas


_SETTINGS = settings(max_examples=200, deadline=None)
_CONFIGS = st.sampled_from([CFG, CFG.model_copy(update={"max_step_up": 3})])


@_SETTINGS
@given(_scenario(), _CONFIGS)
def test_target_stays_within_bounds(scenario, cfg) -> None:  # type: ignore[no-untyped-def]
    lo, hi = scenario[0], scenario[1]
    for _, _, decision in _simulate(scenario, cfg):
        assert lo <= decision.target_replicas <= hi


@_SETTINGS
@given(_scenario(), _CONFIGS)
def test_planned_footprint_fits_free_plus_held(scenario, cfg) -> None:  # type: ignore[no-untyped-def]
    for _, case, decision in _simulate(scenario, cfg):
        added = decision.target_replicas - case.target_replicas
        if added > 0:
            fp = max(footprint_bytes(r, cfg) for r in case.replicas)
            # every GPU Ray might use keeps the margin after the new replicas
            for gpu in case.gpus:
                ours = sum(r.gpu_fraction for r in case.replicas if r.gpu_uuid == gpu.uuid)
                if ours + 0.25 <= 1.0:
                    assert added * fp + cfg.safety_margin_bytes <= gpu.free_bytes
            # hence the deployment never plans more than free memory plus what it holds
            assert decision.target_replicas * fp <= max(g.free_bytes for g in case.gpus) + (
                case.target_replicas * fp
            )


@_SETTINGS
@given(_scenario(), _CONFIGS)
def test_bad_reading_never_scales_up(scenario, cfg) -> None:  # type: ignore[no-untyped-def]
    for now, case, decision in _simulate(scenario, cfg):
        bad = any(reading_problem(g, cfg, now) for g in case.gpus) or case.ray_gpu_available is None
        if bad:
            assert decision.target_replicas <= case.target_replicas
        if any(reading_problem(g, cfg, now) for g in case.gpus):
            assert decision.target_replicas == case.target_replicas


@_SETTINGS
@given(_scenario(), _CONFIGS)
def test_at_most_one_direction_change_per_cooldown(scenario, cfg) -> None:  # type: ignore[no-untyped-def]
    last_direction, last_flip = None, -math.inf
    for now, case, decision in _simulate(scenario, cfg):
        if decision.target_replicas == case.target_replicas:
            continue
        direction = decision.target_replicas > case.target_replicas
        if last_direction is not None and direction != last_direction:
            assert now - last_flip >= cfg.flip_interval_s
            last_flip = now
        elif last_direction is None:
            last_flip = now
        last_direction = direction
