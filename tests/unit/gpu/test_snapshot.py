"""gpu.snapshot: memory readings as data, the one owner of torch's memory calls, and
``memory_profiling``'s arithmetic."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from serve_app.gpu.snapshot import DeviceMemory, MemorySnapshot, memory_profiling

SERVE_APP = Path(__file__).resolve().parents[3] / "serve_app"


def test_snapshot_measure_on_cpu_reports_zero_torch_figures() -> None:
    snapshot = MemorySnapshot.measure("cpu", None)
    assert snapshot == MemorySnapshot(
        allocated_bytes=0,
        reserved_bytes=0,
        peak_allocated_bytes=0,
        peak_reserved_bytes=0,
        nvml_process_bytes=None,
        non_torch_bytes=None,
    )


def test_snapshot_measure_on_cpu_with_nvml_figure() -> None:
    snapshot = MemorySnapshot.measure(torch.device("cpu"), 512_000_000)
    assert snapshot.nvml_process_bytes == 512_000_000
    assert snapshot.non_torch_bytes == 512_000_000
    assert snapshot.reserved_bytes == 0


def test_snapshot_measure_reads_torch_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = {
        "memory_allocated": 1_000,
        "memory_reserved": 4_000,
        "max_memory_allocated": 3_000,
        "max_memory_reserved": 6_000,
    }
    seen: list[torch.device] = []
    for name, value in figures.items():

        def fake(device: torch.device, value: int = value) -> int:
            seen.append(device)
            return value

        monkeypatch.setattr(torch.cuda, name, fake)
    snapshot = MemorySnapshot.measure("cuda:1", 10_000)
    assert dataclasses.astuple(snapshot) == (1_000, 4_000, 3_000, 6_000, 10_000, 6_000)
    assert seen == [torch.device("cuda:1")] * 4


def test_device_memory_on_a_cpu_reads_zero_and_frees_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.cuda touched for a CPU device")

    names = ("empty_cache", "memory_reserved", "memory_allocated", "memory_stats")
    for name in (*names, "memory_stats_as_nested_dict"):
        monkeypatch.setattr(torch.cuda, name, never)
    memory = DeviceMemory(torch.device("cpu"))
    memory.free_cache()
    assert (memory.reserved_bytes(), memory.allocated_bytes()) == (0, 0)
    assert memory.reserved_and_allocated_bytes() == (0, 0)
    assert memory.process_bytes() is None and memory.outside_torch_bytes() is None


def test_reserved_and_allocated_come_from_the_allocators_nested_stats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The figures torch.cuda.memory_reserved and memory_allocated give (the flattened
    ``reserved_bytes.all.current`` and ``allocated_bytes.all.current``), read from one nested
    dict without the flattening. The nesting is the allocator's (torch._C._cuda_memoryStats)."""
    pool = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
    nested = {
        "reserved_bytes": {"all": {**pool, "current": 6 << 20}, "large_pool": pool},
        "allocated_bytes": {"all": {**pool, "current": 5 << 20}, "small_pool": pool},
        "num_alloc_retries": 0,
    }
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda device=None: nested)
    memory = DeviceMemory(torch.device("cuda", 0))
    assert memory.reserved_and_allocated_bytes() == (6 << 20, 5 << 20)
    # what torch's flattening reads from the same dict
    monkeypatch.setattr(
        torch.cuda.memory, "memory_stats_as_nested_dict", lambda device=None: nested
    )
    flat = torch.cuda.memory.memory_stats(0)
    assert (flat["reserved_bytes.all.current"], flat["allocated_bytes.all.current"]) == (
        6 << 20,
        5 << 20,
    )


class Readings(DeviceMemory):
    """DeviceMemory over a script of figures (the arithmetic, not CUDA)."""

    def __init__(self, reserved: list[int], used: list[int]):
        super().__init__(torch.device("cpu"))
        self.reserved, self.used = reserved, used
        self.frees = 0

    def free_cache(self) -> None:
        self.frees += 1

    def reserved_bytes(self) -> int:
        return self.reserved[0]


def test_memory_profiling_counts_growth_outside_torch_only() -> None:
    reserved, used = [100], [1_000]
    memory = Readings(reserved, used)
    with memory_profiling(memory, lambda: used[0]) as profile:
        reserved[0], used[0] = 150, 1_080  # torch grew 50, the process 80: 30 outside torch
        profile.sample()
        used[0] = 1_070  # the high mark stays
        profile.sample()
    assert (profile.before_bytes, profile.high_bytes) == (1_000, 1_080)
    assert (profile.reserved_before_bytes, profile.reserved_after_bytes) == (100, 150)
    assert profile.outside_torch_growth_bytes == 30
    assert memory.frees == 3  # before, and at each sample


def test_memory_profiling_never_reports_negative_growth() -> None:
    reserved, used = [100], [1_000]
    memory = Readings(reserved, used)
    with memory_profiling(memory, lambda: used[0]) as profile:
        reserved[0] = 400  # torch grew more than the process did
        profile.sample()
    assert profile.outside_torch_growth_bytes == 0


def _calls(tree: ast.AST, attr: str) -> int:
    return sum(
        1 for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == attr
    )


def test_only_the_snapshot_module_frees_the_cache_or_reads_torch_memory() -> None:
    """One owner of memory readings: torch's cache frees and memory reads appear in
    gpu/snapshot.py alone (the cap itself is the partition's)."""
    owned = (
        "empty_cache",
        "memory_reserved",
        "memory_allocated",
        "memory_stats",
        "memory_stats_as_nested_dict",
        "max_memory_reserved",
        "reset_peak_memory_stats",
        "mem_get_info",
    )
    found = {
        str(path.relative_to(SERVE_APP)): [
            a for a in owned if _calls(ast.parse(path.read_text()), a)
        ]
        for path in SERVE_APP.rglob("*.py")
    }
    offenders = {
        path: attrs for path, attrs in found.items() if attrs and path != "gpu/snapshot.py"
    }
    assert offenders == {}
    assert found["gpu/snapshot.py"]
