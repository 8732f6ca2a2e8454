"""Batches run under a replica's cap at start-up: ``run_fits`` (a batch that runs out of memory
is reported, not raised), and the warm-up of the shapes traffic brings (``WarmUp``)."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from serve_app.adapters.contract import ModelBackend
from serve_app.gpu.graphs import steps_within
from serve_app.gpu.partition import Partition
from serve_app.gpu.snapshot import is_torch_oom

logger = logging.getLogger("serve_app")


def run_fits(backend: ModelBackend, partition: Partition, batch: list[Any]) -> bool:
    """Run one batch under the cap and wait for the GPU; False, with the cache freed, when it
    ran out of memory (any other error re-raises)."""
    try:
        backend.predict(batch)
        partition.memory.synchronize()
    except Exception as exc:  # noqa: BLE001 - only OOM is expected; others re-raise
        if not is_torch_oom(exc):
            raise
        del exc  # drop the traceback: it pins the failed attempt's tensors
        partition.free_cache(count=False)
        return False
    return True


def batch_size_key(batch: list[Any]) -> int:
    """A batch's size for ordering warm-up: its items times the longest item's length (token
    ids), or its items alone."""
    longest = max((len(x) for x in batch if isinstance(x, list | tuple)), default=1)
    return len(batch) * max(1, longest)


class WarmUp:
    """The backend's warm-up batches (the shapes traffic brings), smallest first, run one at
    a time under the cap (``step``): CUDA loads a kernel the first time it runs, and a first
    request should not pay for that. A batch size that runs out of memory is skipped with
    every larger one: serving still works, since a batch that does not fit is split at run
    time (serving/oom.py). Start-up runs it for at most ``warmup_startup_budget_s``; the replica
    runs the rest between batches once it serves."""

    def __init__(self, backend: ModelBackend, partition: Partition, max_batch_size: int):
        self.backend = backend
        self.partition = partition
        self.pending: deque[list[Any]] = deque(
            sorted(backend.warmup_batches(max_batch_size), key=batch_size_key)
        )
        self.ran = 0
        self.seconds = 0.0
        self.too_big: int | None = None

    def step(self) -> bool:
        """Run the next warm-up batch; whether any remain."""
        while self.pending:
            batch = self.pending.popleft()
            if self.too_big is not None and len(batch) >= self.too_big:
                continue
            t0 = time.perf_counter()
            if run_fits(self.backend, self.partition, batch):
                self.ran += 1
            else:
                self.too_big = len(batch)
                logger.warning(
                    "warm-up: batches of %d inputs ran out of memory under the cap and were "
                    "skipped; at run time such batches are split and the batch cap lowered. "
                    "Calibration (memory.calibrate: true) picks a batch cap that fits",
                    self.too_big,
                )
            self.seconds += time.perf_counter() - t0
            break
        if not self.pending:
            self.partition.free_cache(count=False)
        return bool(self.pending)

    def run(self, budget_s: float | None = None) -> None:
        """Steps until done, or until the next would likely end past ``budget_s`` (the
        longest step so far is the estimate)."""
        if self.pending:
            steps_within(self.step, budget_s)

    def describe(self) -> dict[str, Any]:
        return {"ran": self.ran, "pending": len(self.pending), "seconds": round(self.seconds, 3)}


def warm_up(
    backend: ModelBackend,
    partition: Partition,
    max_batch_size: int,
    budget_s: float | None = None,
) -> WarmUp:
    """Warm-up batches for at most ``budget_s`` (all of them without it); the WarmUp, with
    what is left pending."""
    warm = WarmUp(backend, partition, max_batch_size)
    warm.run(budget_s)
    partition.free_cache(count=False)
    partition.memory.reset_peak()
    logger.info(
        "warm-up: %d batches in %.2f s, %d left for between batches once serving",
        warm.ran,
        warm.seconds,
        len(warm.pending),
    )
    return warm
