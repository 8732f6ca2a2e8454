"""A replica's start-up, one sequence of named, timed phases (``start_replica``): the partition
(device, CUDA context, memory cap), the weights, CUDA graphs (their pool stays, so they come
first), batch-size calibration beside them, then warm-up batches of the shapes traffic brings.
The GPU phases run batches under the replica's cap through ``warmup.run_fits``, which reports
an out-of-memory batch instead of raising. The replica only serves what it returns.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from serve_app import adapters
from serve_app.adapters.contract import Model
from serve_app.config.args import AppArgs
from serve_app.errors import StartupError
from serve_app.gpu.budget import format_bytes
from serve_app.gpu.capping import start_partition
from serve_app.gpu.graphs import graph_batch_limit
from serve_app.gpu.partition import Partition
from serve_app.gpu.snapshot import is_torch_oom
from serve_app.serving.gcwatch import GcWatch
from serve_app.startup.calibration import BatchCap, check_batch_cap_source, initial_batch_cap
from serve_app.startup.capture import capture_graphs
from serve_app.startup.warmup import WarmUp, batch_size_key, run_fits, warm_up

logger = logging.getLogger("serve_app")
PHASES = ("partition", "weights", "graph_capture", "calibration", "warmup")


@dataclass
class Started:
    """What a replica serves with, as ``start_replica`` left it.

    Attributes:
        partition: the device and, on a GPU, the budget and cap.
        model: the model, weights loaded (and graphs captured, when they were).
        cap: the batch cap and the calibration it came from.
        warmup: the warm-up, its batches left for between batches pending (``WarmUp``), or
            None when skipped.
        phases_s: seconds of each phase of ``PHASES``, after ``process`` and ``imports``
            (``PhaseTimer``), and ``total``.
        process_started_s: the process's start (epoch seconds).
        imports_started_s: when the process began importing serve_app (epoch seconds), or, in
            a warm worker, when the replica's own start began.
        preloaded: the replica started in a warm worker (warmpool).
        waited_s: in a warm worker, from the end of its preload to the replica's first phase.
        gc: the collector's pauses from here on (gcwatch).
    """

    partition: Partition
    model: Model
    cap: BatchCap
    warmup: WarmUp | None
    phases_s: dict[str, float]
    process_started_s: float
    imports_started_s: float
    preloaded: bool = False
    waited_s: float | None = None
    gc: GcWatch | None = None


def start_replica(args: AppArgs, num_gpus: float) -> Started:
    """Start a replica: each phase of ``PHASES`` in turn, timed; what it serves with.

    Raises:
        StartupError: a phase cannot complete (the message names the setting to change).
    """
    from serve_app.serving.accesslog import gate_access_log
    from serve_app.startup.threads import size_tokenizer_threads
    from serve_app.startup.warmpool import match_a_fresh_worker

    phases = PhaseTimer()
    match_a_fresh_worker()  # a warm worker imported torch before Ray set OMP_NUM_THREADS
    tokenizer_threads = size_tokenizer_threads()  # before the first encode_batch builds a pool
    if tokenizer_threads:
        logger.info("tokenizer threads sized to the replica's cores: %s", tokenizer_threads)
    gate_access_log()  # Serve builds each request's access-log record even when it is off
    family = adapters.family(args)
    # The partition comes first, before anything that could touch CUDA: under MPS enforcement
    # it sets the replica's driver limit in the environment, which the driver reads once.
    with phases("partition"):  # CUDA context, its measurement, the cap
        partition = start_partition(args, num_gpus, family.outside_torch_hook(args))
    launch_s = 0.0
    with phases("weights"):
        model = family.build(args)  # a user model's class is imported here, after the cap
        check_batch_cap_source(args, model.backend, partition)
        load_weights(model, partition)
        if partition.on_gpu:
            launch_s = first_launch(model, partition)
    # Graphs first: their memory pool stays, so calibration must measure beside it.
    with phases("graph_capture"):  # what was captured: model.backend.graphs.describe()
        if partition.on_gpu and args.cuda_graphs:
            # The first launch loads the kernels the first capture would: it counts against
            # the capture's budget, which bounds the delay graphs add to readiness.
            capture_graphs(
                model,
                partition,
                graph_batch_limit(args),
                max(0.0, args.cuda_graph_startup_budget_s - launch_s),
            )
            # Capture loads kernels and instantiates graphs outside torch: the cap makes room.
            partition.refit("CUDA graph capture")
    with phases("calibration"):
        cap = initial_batch_cap(args, model.backend, partition)
        partition.refit("calibration")
    with phases("warmup"):
        warmup = None
        if partition.on_gpu and args.warmup:
            warmup = warm_up(model.backend, partition, cap.batch_cap, args.warmup_startup_budget_s)
            partition.refit("warm-up")
    return Started(
        partition=partition,
        model=model,
        cap=cap,
        warmup=warmup,
        phases_s=phases.done(),
        process_started_s=phases.process_started_s,
        imports_started_s=phases.imports_started_s,
        preloaded=phases.preloaded,
        waited_s=phases.waited_s,
        gc=GcWatch(),
    )


def first_launch(model: Model, partition: Partition) -> float:
    """Run the smallest warm-up batch once and count what it added outside torch (kernels load
    on their first launch, outside the allocator) into the overhead, lowering the torch cap to
    match (``Partition.refit``); the seconds it took. Done while torch holds little more than
    the weights, so the process stays within its cap while the kernels load; found later, under
    a full allocator, they would take it past."""
    t0 = time.perf_counter()
    batches = model.backend.warmup_batches(1)
    if not batches:
        return 0.0
    if not run_fits(model.backend, partition, min(batches, key=batch_size_key)):
        cap = format_bytes(partition.budget.cap_bytes) if partition.budget else "none"
        raise StartupError(
            f"{model.name!r}: one input of the smallest size does not fit beside "
            f"the weights under the replica's cap ({cap}); raise num_gpus or "
            "memory.memory_fraction"
        )
    partition.free_cache(count=False)
    partition.refit("the first launch of the model's kernels")
    return time.perf_counter() - t0


def load_weights(model: Model, partition: Partition) -> None:
    """Set the backend up on the partition's device.

    Raises:
        StartupError: on a GPU, the weights do not fit under the replica's cap.
    """
    try:
        model.backend.setup(partition.device)
    except Exception as exc:
        budget = partition.budget
        if budget is None or not is_torch_oom(exc):
            raise
        del exc  # the traceback pins the half-loaded weights
        raise StartupError(
            f"model {model.name!r} does not fit in this replica's GPU memory cap "
            f"of {format_bytes(budget.cap_bytes)} ({format_bytes(budget.overhead_bytes)} of "
            "it is the CUDA context): loading its weights ran out of memory. Raise "
            "memory_fraction or ray_actor_options.num_gpus in the deploy config, or use a "
            "smaller model or dtype"
        ) from None


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
