"""A replica's start-up, one sequence of named, timed phases (``start_replica``): the partition
(device, CUDA context, memory cap), the weights, CUDA graphs (their pool stays, so they come
first), batch-size calibration beside them, then warm-up batches of the shapes traffic brings.
The GPU phases run batches under the replica's cap (``Partition``) through ``run_fits``, which
reports an out-of-memory batch instead of raising. The replica only serves what it returns.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from serve_app.config.args import AppArgs
from serve_app.errors import StartupError
from serve_app.gpu import calibcache
from serve_app.gpu.budget import format_bytes
from serve_app.gpu.graphs import (
    GRAPH_MIN_ROOM_BYTES,
    GRAPH_POOL_ROOM_SHARE,
    GraphCaptureError,
    GraphMemoryLimit,
    graph_batch_limit,
    steps_within,
)
from serve_app.gpu.partition import Partition

logger = logging.getLogger("serve_app")
CPU_DEFAULT_BATCH = 32
PHASES = ("partition", "weights", "graph_capture", "calibration", "warmup")


@dataclass
class Started:
    """What a replica serves with, as ``start_replica`` left it.

    Attributes:
        partition: the device and, on a GPU, the budget and cap.
        adapter: the model, weights loaded (and graphs captured, when they were).
        batch_cap: the largest batch to run.
        calibration: the calibration result (measured or from the cache), or None.
        calibration_source: ``"measured"``, ``"cache"``, or None without calibration.
        calibration_entry: the cache entry the result came from or went to (to invalidate
            it on the first out-of-memory batch), or None.
        warmup: the warm-up, its batches left for between batches pending (``WarmUp``), or
            None when skipped.
        phases_s: seconds of each phase of ``PHASES``, after ``process`` and ``imports``
            (``PhaseTimer``), and ``total``.
        process_started_s: the process's start (epoch seconds).
        imports_started_s: when the process began importing serve_app (epoch seconds), or, in
            a warm worker, when the replica's own start began.
        preloaded: the replica started in a warm worker (warmpool).
        waited_s: in a warm worker, from the end of its preload to the replica's first phase.
    """

    partition: Partition
    adapter: Any
    batch_cap: int
    calibration: Any
    calibration_source: str | None
    calibration_entry: Any
    warmup: WarmUp | None
    phases_s: dict[str, float]
    process_started_s: float
    imports_started_s: float
    preloaded: bool = False
    waited_s: float | None = None


def start_replica(args: AppArgs, num_gpus: float) -> Started:
    """Start a replica: each phase of ``PHASES`` in turn, timed; what it serves with.

    Raises:
        StartupError: a phase cannot complete (the message names the setting to change).
    """
    from serve_app.adapters import make_adapter
    from serve_app.startup.warmpool import match_a_fresh_worker

    phases = PhaseTimer()
    match_a_fresh_worker()  # a warm worker imported torch before Ray set OMP_NUM_THREADS
    # The partition comes first, before anything that could touch CUDA: under MPS enforcement
    # it sets the replica's driver limit in the environment, which the driver reads once, when
    # CUDA initialises (mps.py); CUDA initialised earlier would run the replica without it.
    with phases("partition"):  # CUDA context, its measurement, the cap
        partition = Partition.start(args, num_gpus)
    launch_s = 0.0
    with phases("weights"):
        adapter = make_adapter(args)
        load_weights(adapter, partition)
        if partition.on_gpu:
            launch_s = first_launch(adapter, partition)
    # Graphs first: their memory pool stays, so calibration must measure beside it.
    with phases("graph_capture"):  # what was captured: adapter.graphs.describe()
        if partition.on_gpu and args.cuda_graphs:
            # The first launch loads the kernels that the first capture loaded before it ran
            # first (0.5 s of 0.6 on the H200): it counts against the capture's budget, which
            # bounds the delay graphs add to readiness.
            capture_graphs(
                adapter,
                partition,
                graph_batch_limit(args),
                max(0.0, args.cuda_graph_startup_budget_s - launch_s),
            )
            # Capture loads kernels and instantiates graphs outside torch: the cap makes room.
            partition.refit("CUDA graph capture")
    with phases("calibration"):
        batch_cap, calibration, source, entry = initial_batch_cap(args, adapter, partition)
        partition.refit("calibration")
    with phases("warmup"):
        warmup = None
        if partition.on_gpu and args.warmup:
            warmup = warm_up(adapter, partition, batch_cap, args.warmup_startup_budget_s)
            partition.refit("warm-up")
    return Started(
        partition=partition,
        adapter=adapter,
        batch_cap=batch_cap,
        calibration=calibration,
        calibration_source=source,
        calibration_entry=entry,
        warmup=warmup,
        phases_s=phases.done(),
        process_started_s=phases.process_started_s,
        imports_started_s=phases.imports_started_s,
        preloaded=phases.preloaded,
        waited_s=phases.waited_s,
    )


def first_launch(adapter: Any, partition: Partition) -> float:
    """Run the smallest warm-up batch once and count what it added outside torch (kernels load
    on their first launch, outside the allocator: 76 MiB for MiniLM on the H200) into the
    overhead, lowering the torch cap to match (``Partition.refit``); the seconds it took. Done
    while torch holds little more than the weights, so the process stays within its cap while
    the kernels load; found later, under a full allocator, they would take it past."""
    t0 = time.perf_counter()
    batches = adapter.warmup_batches(1)
    if not batches:
        return 0.0
    if not run_fits(adapter, partition, min(batches, key=_batch_size_key)):
        cap = format_bytes(partition.budget.cap_bytes) if partition.budget else "none"
        raise StartupError(
            f"{adapter.args.model_name!r}: one input of the smallest size does not fit beside "
            f"the weights under the replica's cap ({cap}); raise num_gpus or "
            "memory.memory_fraction"
        )
    partition.free_cache(count=False)
    partition.refit("the first launch of the model's kernels")
    return time.perf_counter() - t0


def load_weights(adapter: Any, partition: Partition) -> None:
    """Load the adapter's weights onto the partition's device.

    Raises:
        StartupError: on a GPU, the weights do not fit under the replica's cap.
    """
    from serve_app.serving.oom import is_torch_oom

    try:
        adapter.setup(partition.device)
    except Exception as exc:
        budget = partition.budget
        if budget is None or not is_torch_oom(exc):
            raise
        del exc  # the traceback pins the half-loaded weights
        raise StartupError(
            f"model {adapter.args.model_name!r} does not fit in this replica's GPU memory cap "
            f"of {format_bytes(budget.cap_bytes)} ({format_bytes(budget.overhead_bytes)} of "
            "it is the CUDA context): loading its weights ran out of memory. Raise "
            "memory_fraction or ray_actor_options.num_gpus in the deploy config, or use a "
            "smaller model or dtype"
        ) from None


def initial_batch_cap(
    args: AppArgs, adapter: Any, partition: Partition
) -> tuple[int, Any, str | None, Any]:
    """The batch cap to start serving with: calibrated on a GPU (from the calibration cache
    when it holds a valid entry for this replica's key), else ``max_batch_size`` or 32.

    Returns ``(batch_cap, calibration result or None, "cache" | "measured" | None, the cache
    entry or None)``.
    """
    configured = args.max_batch_size
    if not partition.on_gpu:
        logger.info("calibration skipped: the device is a CPU")
        return configured or CPU_DEFAULT_BATCH, None, None, None
    mem = args.memory
    if not mem.calibrate:
        logger.info("calibration off (memory.calibrate: false)")
        return configured or CPU_DEFAULT_BATCH, None, None, None
    limit = min(mem.calibration_max_batch_size, configured or mem.calibration_max_batch_size)
    budget = partition.budget
    assert budget is not None
    entry = calibration_entry(args, adapter, partition, limit)
    if entry is not None:
        cached = calibcache.load(
            entry, cap_bytes=budget.cap_bytes, overhead_bytes=budget.overhead_bytes, limit=limit
        )
        if cached is not None:
            logger.info(
                "calibration: batch %d from the cache (%s), peak %s of a %s cap",
                cached.batch_size,
                entry.path,
                format_bytes(cached.peak_bytes),
                format_bytes(budget.cap_bytes),
            )
            return cached.batch_size, cached, "cache", entry
    result = calibrate_batch_size(adapter, partition, limit)
    if entry is not None:
        calibcache.store(entry, result, budget.overhead_bytes)
    return int(result.batch_size), result, "measured", entry


def calibration_entry(
    args: AppArgs, adapter: Any, partition: Partition, limit: int
) -> calibcache.CacheEntry | None:
    """This replica's calibration cache entry; None when the cache is off (or its key cannot
    be built, which is logged: the replica then measures, as without a cache)."""
    directory = calibcache.resolve_dir(args.memory.calibration_cache_dir)
    if directory is None:
        logger.info("calibration cache off (memory.calibration_cache_dir: null)")
        return None
    try:
        key = calibcache.replica_key(args, adapter, partition, limit)
    except Exception as exc:  # noqa: BLE001 - the cache is an optimisation, never a failure
        logger.warning("calibration cache: no key for this replica (%r); measuring", exc)
        return None
    return calibcache.CacheEntry.at(directory, key)


class PhaseTimer:
    """Wall-clock seconds of each named start-up phase, after two that come before them:
    ``process``, from the worker process's start until it began importing serve_app, and
    ``imports``, from then to the first phase (serve_app, torch, Ray Serve's replica code).

    In a warm worker (warmpool: Ray started it ahead of time and it imported all of that as it
    started), ``process`` runs to the end of that preload and ``imports`` is 0: both happened
    before the replica was decided on, as long as the worker had finished when Ray gave it the
    replica. ``waited_s`` is then the time from the end of the preload to the replica's first
    phase (the worker idle in Ray's pool, then Ray Serve's own replica set-up), and
    ``preloaded`` is True."""

    def __init__(self) -> None:
        import psutil

        from serve_app import IMPORTED_AT_S
        from serve_app.startup.warmpool import preloaded_at_s

        now = time.time()
        self.process_started_s = psutil.Process(os.getpid()).create_time()
        ready = preloaded_at_s()
        self.preloaded = ready is not None
        if ready is not None:
            self.imports_started_s = now  # the replica's own start: nothing left to import
            self.waited_s: float | None = round(max(0.0, now - ready), 3)
            self.phases_s: dict[str, float] = {
                "process": round(max(0.0, ready - self.process_started_s), 3),
                "imports": 0.0,
            }
        else:
            self.imports_started_s = max(IMPORTED_AT_S, self.process_started_s)
            self.waited_s = None
            self.phases_s = {
                "process": round(self.imports_started_s - self.process_started_s, 3),
                "imports": round(now - self.imports_started_s, 3),
            }

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases_s[name] = round(time.perf_counter() - t0, 3)

    def done(self) -> dict[str, float]:
        """The phases, with ``total``: their sum (process start to now, less ``waited_s`` in a
        warm worker)."""
        self.phases_s["total"] = round(sum(self.phases_s.values()), 3)
        logger.info("start-up phases (s): %s", self.phases_s)
        return dict(self.phases_s)


def run_fits(adapter: Any, partition: Partition, batch: list[Any]) -> bool:
    """Run one batch under the cap and wait for the GPU; False, with the cache freed, when it
    ran out of memory (any other error re-raises)."""
    from serve_app.serving.oom import is_torch_oom

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


def _batch_size_key(batch: list[Any]) -> int:
    """A batch's size for ordering warm-up: its items times the longest item's length (token
    ids), or its items alone."""
    longest = max((len(x) for x in batch if isinstance(x, list | tuple)), default=1)
    return len(batch) * max(1, longest)


class WarmUp:
    """The adapter's warm-up batches (the shapes traffic brings), smallest first, run one at
    a time under the cap (``step``): CUDA loads a kernel the first time it runs, and a first
    request should not pay for that. A batch size that runs out of memory is skipped with
    every larger one: serving still works, since a batch that does not fit is split at run
    time (oom.py). Start-up runs it for at most ``warmup_startup_budget_s``; the replica runs
    the rest between batches once it serves."""

    def __init__(self, adapter: Any, partition: Partition, max_batch_size: int):
        self.adapter = adapter
        self.partition = partition
        self.pending: deque[list[Any]] = deque(
            sorted(adapter.warmup_batches(max_batch_size), key=_batch_size_key)
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
            if run_fits(self.adapter, self.partition, batch):
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
    adapter: Any, partition: Partition, max_batch_size: int, budget_s: float | None = None
) -> WarmUp:
    """Warm-up batches for at most ``budget_s`` (all of them without it); the WarmUp, with
    what is left pending."""
    warm = WarmUp(adapter, partition, max_batch_size)
    warm.run(budget_s)
    partition.free_cache(count=False)
    torch.cuda.reset_peak_memory_stats(partition.device)
    logger.info(
        "warm-up: %d batches in %.2f s, %d left for between batches once serving",
        warm.ran,
        warm.seconds,
        len(warm.pending),
    )
    return warm


def capture_graphs(
    adapter: Any, partition: Partition, max_batch_size: int, budget_s: float | None = None
) -> dict[str, Any]:
    """The adapter's forward pass as CUDA graphs for batches up to ``max_batch_size``, for at
    most ``budget_s`` (the shapes left are captured once the replica serves); what was
    captured (``GraphSet.describe``).

    Raises:
        StartupError: capture failed for another reason than memory; the message names the
            model and the way out (shapes that run out of memory are skipped, with a warning).
    """
    room = graph_room_bytes(partition)
    if room is not None and room < GRAPH_MIN_ROOM_BYTES:
        logger.warning(
            "CUDA graphs: off for %r: the room its cap leaves beside the weights (%s) is under "
            "%s, and graphs' pool and their memory outside torch would crowd out the eager "
            "batches (the model runs eagerly); raise num_gpus or memory.memory_fraction to "
            "graph it",
            adapter.args.model_name,
            format_bytes(room),
            format_bytes(GRAPH_MIN_ROOM_BYTES),
        )
        return {}
    limit = graph_memory_limit(partition, room)
    try:
        graphs = adapter.capture_graphs(max_batch_size, budget_s, limit)
    except GraphCaptureError as exc:
        raise StartupError(
            f"CUDA graph capture of {adapter.args.model_name!r} failed ({exc}); set "
            "args.cuda_graphs: false to run this model eagerly"
        ) from None
    torch.cuda.synchronize(partition.device)
    partition.free_cache(count=False)  # the eager runs before each capture
    info = graphs.describe()
    logger.info(
        "CUDA graphs: %d captured in %.2f s (batches up to %d; %s reserved); %d left to "
        "capture between batches once serving (cuda_graph_startup_budget_s %s)",
        info["graphs"],
        info["capture_s"],
        max_batch_size,
        format_bytes(max(0, info["pool_bytes"])),
        info["pending"],
        budget_s,
    )
    if info["skipped_out_of_memory"]:
        logger.warning(
            "CUDA graphs: %d shapes ran out of memory under the cap while captured and run "
            "eagerly instead; lower args.cuda_graph_max_batch_size to skip them, or raise the "
            "replica's memory share",
            info["skipped_out_of_memory"],
        )
    if info["skipped_over_limit"]:
        logger.warning(
            "CUDA graphs: %d shapes would have taken the graphs' memory past %s (%.0f%% of "
            "the room the cap leaves beside the weights) and run eagerly instead, so that eager "
            "batches keep their room; raise the replica's memory share to graph them",
            info["skipped_over_limit"],
            format_bytes(limit.limit_bytes if limit else 0),
            GRAPH_POOL_ROOM_SHARE * 100,
        )
    return info


def graph_room_bytes(partition: Partition) -> int | None:
    """The room a replica's torch cap leaves beside what is allocated now (the weights);
    None without a budget."""
    budget = partition.budget
    if budget is None:
        return None
    return max(0, budget.torch_cap_bytes - int(torch.cuda.memory_allocated(partition.device)))


def graph_memory_limit(partition: Partition, room: int | None) -> GraphMemoryLimit | None:
    """What a replica's CUDA graphs may cost: GRAPH_POOL_ROOM_SHARE of ``room`` (its
    ``graph_room_bytes``), counting what capture adds outside torch through the partition's
    reading; None without a budget (``room`` None)."""
    if room is None:
        return None
    return GraphMemoryLimit(
        limit_bytes=int(room * GRAPH_POOL_ROOM_SHARE),
        outside_torch_bytes=partition.outside_torch_bytes,
    )


def calibrate_batch_size(adapter: Any, partition: Partition, max_batch_size: int) -> Any:
    """Run worst-case batches of doubling size under the cap; the largest that fits wins.

    The peak compared with the budget is NVML's view of the process: the caching allocator's
    peak reserved bytes plus the non-torch overhead measured at start-up.
    """
    from serve_app.gpu.calibrate import find_max_batch

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
