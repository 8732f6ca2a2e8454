"""The start-up pipeline (startup.pipeline.start_replica) on the CPU: every phase runs, in order,
timed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from serve_app.adapters import embeddings
from serve_app.config.args import parse_args
from serve_app.errors import StartupError
from serve_app.gpu.capping import start_partition
from serve_app.startup import capture
from serve_app.startup import pipeline as startup
from serve_app.startup.calibration import CPU_DEFAULT_BATCH, BatchCap, initial_batch_cap


def test_start_replica_on_the_cpu_runs_every_phase_in_order(monkeypatch) -> None:
    calls: list[str] = []

    def partition_start(args: Any, num_gpus: float, hook: Any) -> Any:
        calls.append("partition")
        return start_partition(args, num_gpus, hook)

    def load_weights(model: Any, partition: Any) -> None:
        calls.append("weights")

    monkeypatch.setattr(startup, "start_partition", partition_start)
    monkeypatch.setattr(startup, "load_weights", load_weights)
    started = startup.start_replica(parse_args({"device": "cpu", "max_batch_size": 8}), 0.0)
    assert calls == ["partition", "weights"]
    assert list(started.phases_s) == ["process", "imports", *startup.PHASES, "total"]
    assert all(v >= 0.0 for v in started.phases_s.values())
    assert started.partition.device.type == "cpu"
    assert started.cap == BatchCap(8)
    assert started.model.backend.graphs is None and started.warmup is None
    assert started.model.spec.route == "/v1/embeddings"
    assert started.process_started_s > 0


def test_cpu_batch_cap_defaults_to_32() -> None:
    part = start_partition(parse_args({"device": "cpu"}), 0.0)
    backend = SimpleNamespace()  # never asked: a CPU is not calibrated
    cap = initial_batch_cap(parse_args({}), backend, part)  # type: ignore[arg-type]
    assert cap == BatchCap(CPU_DEFAULT_BATCH) and CPU_DEFAULT_BATCH == 32


def test_weights_that_do_not_fit_name_the_setting() -> None:
    import torch

    class _Budget:
        cap_bytes = 1 << 30
        overhead_bytes = 1 << 28

    class _Part:
        device = "cuda:0"
        budget = _Budget()

    class _Backend:
        def setup(self, device: Any) -> None:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    model = SimpleNamespace(name="m", backend=_Backend())
    with pytest.raises(StartupError, match="memory_fraction or ray_actor_options"):
        startup.load_weights(model, _Part())  # type: ignore[arg-type]


def test_graphs_are_off_when_the_cap_leaves_little_room(caplog) -> None:
    """Under GRAPH_MIN_ROOM_BYTES of room beside the weights no capture is tried (each
    capture's eager warm-up loads kernels outside torch), and the log names the fix."""
    from serve_app.gpu.budget import GRAPH_MIN_ROOM_BYTES

    captured: list[int] = []
    backend = SimpleNamespace(capture_graphs=lambda *a: captured.append(1))
    model = SimpleNamespace(name="tight", backend=backend)
    partition = SimpleNamespace(room_beside_allocated_bytes=lambda: GRAPH_MIN_ROOM_BYTES // 2)
    with caplog.at_level("WARNING", logger="serve_app"):
        assert capture.capture_graphs(model, partition, 64, 1.0) == {}  # type: ignore[arg-type]
    assert captured == []
    assert "CUDA graphs: off for 'tight'" in caplog.text and "memory.memory_fraction" in caplog.text


def test_the_first_launch_counts_against_the_capture_budget(monkeypatch) -> None:
    """On a GPU, the first launch (which loads the kernels the first capture used to) comes
    out of cuda_graph_startup_budget_s; a launch longer than the budget leaves capture none.
    Fakes for the partition and the GPU work: the wiring of the pipeline, not CUDA."""
    budgets: list[float | None] = []
    launch_s = [0.4]
    part = SimpleNamespace(on_gpu=True, refit=lambda why: 0)
    monkeypatch.setattr(startup, "start_partition", lambda args, num_gpus, hook: part)
    monkeypatch.setattr(startup, "load_weights", lambda model, partition: None)
    monkeypatch.setattr(startup, "first_launch", lambda model, partition: launch_s[0])
    monkeypatch.setattr(
        startup,
        "capture_graphs",
        lambda model, partition, max_batch_size, budget_s: budgets.append(budget_s),
    )
    monkeypatch.setattr(startup, "initial_batch_cap", lambda args, backend, partition: BatchCap(8))
    monkeypatch.setattr(startup, "warm_up", lambda *a: None)
    args = parse_args({"cuda_graph_startup_budget_s": 1.0})
    startup.start_replica(args, 0.25)
    launch_s[0] = 1.5
    startup.start_replica(args, 0.25)
    assert budgets == [pytest.approx(0.6), 0.0]


def test_the_family_is_built_in_the_weights_phase_and_its_hook_reaches_the_partition(
    monkeypatch,
) -> None:
    hooks: list[Any] = []
    real = start_partition

    def partition_start(args: Any, num_gpus: float, hook: Any) -> Any:
        hooks.append(hook)
        return real(args, num_gpus, hook)

    monkeypatch.setattr(startup, "start_partition", partition_start)
    monkeypatch.setattr(startup, "load_weights", lambda model, partition: None)
    startup.start_replica(parse_args({"device": "cpu"}), 0.0)
    image = parse_args({"device": "cpu", "adapter": "image-classification", "load_format": "dummy"})
    startup.start_replica(image, 0.0)
    assert hooks[0] is None and callable(hooks[1])
    assert embeddings.outside_torch_hook(parse_args({})) is None
