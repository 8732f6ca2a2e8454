"""The start-up pipeline (startup.start_replica) on the CPU: every phase runs, in order, timed."""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.config.args import parse_args
from serve_app.startup import pipeline as startup


def test_start_replica_on_the_cpu_runs_every_phase_in_order(monkeypatch) -> None:
    calls: list[str] = []
    real_partition = startup.Partition.start

    def partition_start(args: Any, num_gpus: float) -> Any:
        calls.append("partition")
        return real_partition(args, num_gpus)

    def load_weights(adapter: Any, partition: Any) -> None:
        calls.append("weights")

    monkeypatch.setattr(startup.Partition, "start", partition_start)
    monkeypatch.setattr(startup, "load_weights", load_weights)
    started = startup.start_replica(parse_args({"device": "cpu", "max_batch_size": 8}), 0.0)
    assert calls == ["partition", "weights"]
    assert list(started.phases_s) == ["process", "imports", *startup.PHASES, "total"]
    assert all(v >= 0.0 for v in started.phases_s.values())
    assert started.partition.device.type == "cpu"
    assert started.batch_cap == 8
    assert started.calibration is None and started.calibration_source is None
    assert started.adapter.graphs is None and started.warmup is None
    assert started.process_started_s > 0


def test_cpu_batch_cap_defaults_to_32() -> None:
    part = startup.Partition.start(parse_args({"device": "cpu"}), 0.0)
    cap, result, source, entry = startup.initial_batch_cap(parse_args({}), None, part)
    assert (cap, result, source, entry) == (startup.CPU_DEFAULT_BATCH, None, None, None)


def test_weights_that_do_not_fit_name_the_setting(monkeypatch) -> None:
    import torch

    class _Budget:
        cap_bytes = 1 << 30
        overhead_bytes = 1 << 28

    class _Part:
        device = "cuda:0"
        budget = _Budget()

    class _Adapter:
        args = parse_args({})

        def setup(self, device: Any) -> None:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(startup.StartupError, match="memory_fraction or ray_actor_options"):
        startup.load_weights(_Adapter(), _Part())  # type: ignore[arg-type]


def test_graphs_are_off_when_the_cap_leaves_little_room(monkeypatch, caplog) -> None:
    """Under GRAPH_MIN_ROOM_BYTES of room beside the weights no capture is tried (each
    capture's eager warm-up loads kernels outside torch), and the log names the fix."""
    from serve_app.gpu.graphs import GRAPH_MIN_ROOM_BYTES

    captured: list[int] = []
    adapter = type(
        "Adapter",
        (),
        {
            "args": parse_args({"adapter": "embeddings", "model_name": "tight"}),
            "capture_graphs": lambda self, *a: captured.append(1),
        },
    )()
    monkeypatch.setattr(startup, "graph_room_bytes", lambda partition: GRAPH_MIN_ROOM_BYTES // 2)
    with caplog.at_level("WARNING", logger="serve_app"):
        assert startup.capture_graphs(adapter, None, 64, 1.0) == {}  # type: ignore[arg-type]
    assert captured == []
    assert "CUDA graphs: off for 'tight'" in caplog.text and "memory.memory_fraction" in caplog.text


def test_the_first_launch_counts_against_the_capture_budget(monkeypatch) -> None:
    """On a GPU, the first launch (which loads the kernels the first capture used to) comes
    out of cuda_graph_startup_budget_s; a launch longer than the budget leaves capture none.
    Fakes for the partition and the GPU work: the wiring of the pipeline, not CUDA."""
    from types import SimpleNamespace

    budgets: list[float | None] = []
    launch_s = [0.4]
    part = SimpleNamespace(on_gpu=True, refit=lambda why: 0)
    monkeypatch.setattr(startup.Partition, "start", lambda args, num_gpus: part)
    monkeypatch.setattr(startup, "load_weights", lambda adapter, partition: None)
    monkeypatch.setattr(startup, "first_launch", lambda adapter, partition: launch_s[0])
    monkeypatch.setattr(
        startup,
        "capture_graphs",
        lambda adapter, partition, max_batch_size, budget_s: budgets.append(budget_s),
    )
    monkeypatch.setattr(
        startup, "initial_batch_cap", lambda args, adapter, partition: (8, None, None, None)
    )
    monkeypatch.setattr(startup, "warm_up", lambda *a: None)
    args = parse_args({"cuda_graph_startup_budget_s": 1.0})
    startup.start_replica(args, 0.25)
    launch_s[0] = 1.5
    startup.start_replica(args, 0.25)
    assert budgets == [pytest.approx(0.6), 0.0]
