"""serve_app.gpu.hostheap: glibc's free heap memory given back, when due."""

from __future__ import annotations

import ctypes
import ctypes.util

import psutil
import torch

from serve_app.gpu.hostheap import HostHeap
from serve_app.gpu.partition import Partition

MIB = 1 << 20


def test_trims_only_when_due() -> None:
    heap = HostHeap(every_s=3600.0)
    assert heap.available  # glibc here
    assert heap.after_batch() is False  # just made: not due
    assert heap.trims == 0
    heap.every_s = 0.0
    assert heap.after_batch() is True
    assert heap.trims == 1
    assert heap.trim_s >= 0.0


def test_without_malloc_trim_it_does_nothing() -> None:
    heap = HostHeap(every_s=0.0, _trim=None)
    assert heap.available is False
    assert heap.after_batch() is False
    assert heap.trims == 0


def test_a_trim_returns_free_memory_held_inside_the_heap() -> None:
    """Blocks freed below one still in use stay in the heap (glibc trims only its top): the
    growth the replicas showed. A trim gives their pages back."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = 64 * 1024  # under glibc's mmap threshold: from the heap
    blocks = [libc.malloc(block) for _ in range(1024)]  # 64 MiB
    for b in blocks:
        ctypes.memset(b, 1, block)  # touched: resident
    kept = blocks[9::10]  # one in ten stays in use, pinning the pages around it
    for b in blocks:
        if b not in kept:
            libc.free(b)
    process = psutil.Process()
    before = process.memory_info().rss
    try:
        assert HostHeap(every_s=0.0).after_batch() is True
        released = before - process.memory_info().rss
    finally:
        for b in kept:
            libc.free(b)
    assert released > 32 * MIB, f"released {released / MIB:.1f} MiB of ~57 MiB free"


def test_a_cpu_partition_trims_after_a_batch_when_due() -> None:
    part = Partition(device=torch.device("cpu"), num_gpus=0.0, heap=HostHeap(every_s=3600.0))
    assert part.after_batch() is False  # no torch cache on a CPU; the heap not due yet
    assert part.heap.trims == 0
    part.heap.every_s = 0.0
    part.after_batch()
    assert part.heap.trims == 1
