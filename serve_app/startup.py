"""The start-up steps that run the model on the GPU, in the order the replica takes them:
CUDA graphs (their pool stays, so they come first), batch-size calibration beside them, then
warm-up batches of the shapes traffic brings. Each runs batches under the replica's cap
(``Partition``) through ``run_fits``, which reports an out-of-memory batch instead of raising.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from serve_app.config import AppArgs
from serve_app.errors import StartupError
from serve_app.memory import format_bytes
from serve_app.partition import Partition

logger = logging.getLogger("serve_app")


class PhaseTimer:
    """Wall-clock seconds of each named start-up phase, plus ``process`` (from the replica
    process's start to the first phase: Ray's worker start-up and the imports)."""

    def __init__(self) -> None:
        import psutil

        created_s = psutil.Process(os.getpid()).create_time()
        self.phases_s: dict[str, float] = {"process": round(time.time() - created_s, 3)}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases_s[name] = round(time.perf_counter() - t0, 3)

    def done(self) -> dict[str, float]:
        """The phases, with ``total`` (process start to now)."""
        self.phases_s["total"] = round(sum(self.phases_s.values()), 3)
        logger.info("start-up phases (s): %s", self.phases_s)
        return dict(self.phases_s)


def run_fits(adapter: Any, partition: Partition, batch: list[Any]) -> bool:
    """Run one batch under the cap and wait for the GPU; False, with the cache freed, when it
    ran out of memory (any other error re-raises)."""
    from serve_app.oom import is_torch_oom

    try:
        adapter.predict(batch)
        torch.cuda.synchronize(partition.device)
    except Exception as exc:  # noqa: BLE001 - only OOM is expected; others re-raise
        if not is_torch_oom(exc):
            raise
        del exc  # drop the traceback: it pins the failed attempt's tensors
        partition.free_cache(count=False)
        return False
    return True


def warm_up(adapter: Any, partition: Partition, max_batch_size: int) -> float:
    """Run the adapter's warm-up batches (the shapes traffic brings) so that first requests do
    not pay for CUDA's lazy kernel loading; the seconds it took.

    A batch size that runs out of memory is skipped with every larger one: serving still works,
    since a batch that does not fit is split at run time (oom.py).
    """
    t0 = time.perf_counter()
    too_big: int | None = None
    ran = 0
    for batch in adapter.warmup_batches(max_batch_size):
        if too_big is not None and len(batch) >= too_big:
            continue
        if run_fits(adapter, partition, batch):
            ran += 1
        else:
            too_big = len(batch)
    if too_big is not None:
        logger.warning(
            "warm-up: batches of %d inputs ran out of memory under the cap and were skipped; "
            "at run time such batches are split and the batch cap lowered. Calibration "
            "(memory.calibrate: true) picks a batch cap that fits",
            too_big,
        )
    partition.free_cache(count=False)
    torch.cuda.reset_peak_memory_stats(partition.device)
    elapsed_s = time.perf_counter() - t0
    logger.info("warm-up: %d batches in %.2f s", ran, elapsed_s)
    return elapsed_s


def graph_batch_limit(args: AppArgs) -> int:
    """The largest batch captured as a CUDA graph: ``cuda_graph_max_batch_size``, within
    ``max_batch_size`` when that is set."""
    return min(
        args.cuda_graph_max_batch_size, args.max_batch_size or args.cuda_graph_max_batch_size
    )


def capture_graphs(adapter: Any, partition: Partition, max_batch_size: int) -> dict[str, Any]:
    """The adapter's forward pass as CUDA graphs for batches up to ``max_batch_size``; what was
    captured (``GraphSet.describe``).

    Raises:
        StartupError: capture failed for another reason than memory; the message names the
            model and the way out (shapes that run out of memory are skipped, with a warning).
    """
    from serve_app.graphs import GraphCaptureError

    before = torch.cuda.memory_reserved(partition.device)
    try:
        graphs = adapter.capture_graphs(max_batch_size)
    except GraphCaptureError as exc:
        raise StartupError(
            f"CUDA graph capture of {adapter.args.model_name!r} failed ({exc}); set "
            "args.cuda_graphs: false to run this model eagerly"
        ) from None
    torch.cuda.synchronize(partition.device)
    partition.free_cache(count=False)  # the eager runs before each capture
    info = graphs.describe()
    info["pool_bytes"] = torch.cuda.memory_reserved(partition.device) - before
    logger.info(
        "CUDA graphs: %d captured in %.2f s (batches up to %d; %s reserved)",
        info["graphs"],
        info["capture_s"],
        max_batch_size,
        format_bytes(max(0, info["pool_bytes"])),
    )
    if info["skipped_out_of_memory"]:
        logger.warning(
            "CUDA graphs: %d shapes ran out of memory under the cap while captured and run "
            "eagerly instead; lower args.cuda_graph_max_batch_size to skip them, or raise the "
            "replica's memory share",
            info["skipped_out_of_memory"],
        )
    return info


def calibrate_batch_size(adapter: Any, partition: Partition, max_batch_size: int) -> Any:
    """Run worst-case batches of doubling size under the cap; the largest that fits wins.

    The peak compared with the budget is NVML's view of the process: the caching allocator's
    peak reserved bytes plus the non-torch overhead measured at start-up.
    """
    from serve_app.calibrate import find_max_batch

    assert partition.budget is not None
    budget = partition.budget
    device = partition.device

    def probe(n: int) -> int | None:
        partition.free_cache(count=False)
        torch.cuda.reset_peak_memory_stats(device)
        if not run_fits(adapter, partition, adapter.worst_case_items(n)):
            return None
        return int(torch.cuda.max_memory_reserved(device)) + budget.overhead_bytes

    result = find_max_batch(probe, budget_bytes=budget.cap_bytes, max_batch_size=max_batch_size)
    partition.free_cache(count=False)
    torch.cuda.reset_peak_memory_stats(device)
    logger.info(
        "calibration: batch %d peaks at %s of a %s cap; next step %s -> %s",
        result.batch_size,
        format_bytes(result.peak_bytes),
        format_bytes(budget.cap_bytes),
        result.first_failure_size,
        result.first_failure,
    )
    return result
