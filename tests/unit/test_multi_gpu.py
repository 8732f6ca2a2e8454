"""Two GPUs: the planner sheds only where memory was taken, and a node monitor reports only the
GPUs its Ray node was given (a Ray node per GPU)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.control import monitor
from serve_app.control.planner import (
    ControllerConfig,
    GpuHeadroom,
    PlannerInputs,
    Reason,
    ReplicaMemory,
    plan,
)
from serve_app.gpu import nvml
from serve_app.testing.nvml import ScriptedSource

GIB = 1 << 30
NOW = 1_000.0
CFG = ControllerConfig(safety_margin_bytes=2 * GIB, shed_cooldown_s=1.0, upscale_cooldown_s=1.0)
A, B = "gpu-a", "gpu-b"


def gpus(free_a: int, free_b: int) -> tuple[GpuHeadroom, ...]:
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
    grabbed = gpus(40 * GIB, 1 * GIB)  # something outside Ray took GPU B's memory
    on_a = plan(deployment({A: 2}, grabbed, load=4.0), CFG, NOW)
    on_b = plan(deployment({B: 2}, grabbed, load=4.0), CFG, NOW)
    assert on_b.reason is Reason.SHED and on_b.target_replicas == 1, on_b
    assert B in on_b.detail and A not in on_b.detail
    assert on_a.reason is Reason.HOLD_IN_BAND and on_a.target_replicas == 2, on_a


def test_a_deployment_on_both_gpus_sheds_as_many_as_gpu_b_needs() -> None:
    # 1 GiB short on B: one 20 GiB replica covers it, although two of ours sit there.
    one = plan(deployment({A: 2, B: 2}, gpus(40 * GIB, 1 * GIB), load=8.0), CFG, NOW)
    assert (one.reason, one.target_replicas) == (Reason.SHED, 3)
    # 30 GiB short on B: both replicas there go, and never more than the two on B.
    wide = CFG.model_copy(update={"safety_margin_bytes": 30 * GIB})
    two = plan(deployment({A: 2, B: 2}, gpus(40 * GIB, 0), load=8.0), wide, NOW)
    assert (two.reason, two.target_replicas) == (Reason.SHED, 2)

    # Serve, not the planner, picks which replicas stop (by node, newest first): on one node
    # with two GPUs it may stop replicas on A. docs/cluster.md says why and what pins them.


def test_a_grab_on_a_gpu_the_deployment_may_use_blocks_its_scale_up() -> None:
    # Ray may place the next replica on either GPU its node has, so both need room.
    held = plan(deployment({A: 1}, gpus(40 * GIB, 1 * GIB), load=4.0), CFG, NOW)
    assert held.reason is Reason.HOLD_NO_HEADROOM and B in held.detail
    # A Ray node per GPU: the node monitor reports only its GPU, so B is not a candidate.
    up = plan(deployment({A: 1}, gpus(40 * GIB, 1 * GIB)[:1], load=4.0), CFG, NOW)
    assert up.reason is Reason.SCALE_UP and up.target_replicas == 2


@pytest.fixture
def two_gpu_script(tmp_path: Path) -> Iterator[None]:
    script = tmp_path / "nvml.json"
    devices = {
        "GPU-00000000-0000-4000-8000-000000000001": {"total_bytes": 80 * GIB},
        "GPU-00000000-0000-4000-8000-000000000002": {"total_bytes": 80 * GIB},
    }
    script.write_text(json.dumps({"devices": devices}))
    nvml.set_source(ScriptedSource(script))
    try:
        yield
    finally:
        nvml.set_source(None)


@pytest.mark.usefixtures("two_gpu_script")
@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, ["...01", "...02"]),
        ("", ["...01", "...02"]),  # empty: not set (Ray's old override on zero GPUs)
        ("1", ["...02"]),
        ("1,0", ["...02", "...01"]),
        ("GPU-00000000-0000-4000-8000-000000000001", ["...01"]),
        ("GPU-00000000-0000-4000-8000-00000000000", "error"),  # a prefix of both
        ("2", "error"),
    ],
)
def test_node_devices_follow_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, expected: list[str] | str
) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    got = monitor.node_devices()
    if expected == "error":
        assert isinstance(got, nvml.NvmlError) and got.kind is nvml.NvmlErrorKind.NOT_FOUND
        assert "CUDA_VISIBLE_DEVICES" in got.message
        return
    assert not isinstance(got, nvml.NvmlError)
    assert ["..." + d.uuid[-2:] for d in got] == expected
