"""The start-up work a replica left for between batches (CUDA graphs still to capture, warm-up
batches still to run), one step at a time on the model thread (the batcher's ``idle_work``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor

from serve_app.gpu.budget import format_bytes
from serve_app.gpu.graphs import GraphSet
from serve_app.gpu.partition import Partition
from serve_app.startup.warmup import WarmUp

logger = logging.getLogger("serve_app")

# Under load, the step between batches captures the shapes that batches wanted (GraphSet.want)
# for up to this long, and does nothing else: the rest waits for an idle moment, since doing it
# under load cost a shared GPU's replicas much of their throughput
# (benchmarks/journal/2026-12-01-startup-and-throughput-h200.md).
WANTED_CAPTURE_S = 0.25


class LeftoverStartup:
    """What start-up left: ``graphs`` pending and ``warmup`` batches pending.

    ``lock`` is held while a capture runs: a device-wide synchronisation (the health check)
    has no place beside a capture.
    """

    def __init__(self, graphs: GraphSet | None, warmup: WarmUp | None, partition: Partition):
        self.graphs = graphs
        self.warmup = warmup
        self.partition = partition
        self.lock = threading.Lock()

    def left(self) -> bool:
        """Whether any work remains."""
        graphs = self.graphs  # a GraphSet is falsy while it holds no graph yet
        return bool(
            (graphs is not None and graphs.pending) or (self.warmup and self.warmup.pending)
        )

    def step(self, busy: bool = False) -> bool:
        """One step; whether more remains.

        Idle (nothing queued): one CUDA graph capture, shapes that batches wanted first, else
        one warm-up batch. Busy (the batcher's step under load): only the captures of wanted
        shapes, for up to WANTED_CAPTURE_S. Under load, traffic warms the shapes it brings
        itself, and a warm-up batch of a shape it does not bring would hold this replica's
        queue and, on a shared GPU, its neighbours' kernels.
        """
        graphs = self.graphs
        if graphs is not None and (graphs.wanted_next if busy else graphs.pending):
            self._capture(graphs, busy)
        elif not busy and self.warmup is not None and self.warmup.pending:
            more_warmup = self.warmup.step()
            self.partition.refit("a warm-up batch")
            if not more_warmup:
                logger.info(
                    "warm-up: done, %d batches in %.2f s", self.warmup.ran, self.warmup.seconds
                )
        return self.left()

    def _capture(self, graphs: GraphSet, busy: bool) -> None:
        t0 = time.perf_counter()
        with self.lock:
            more = graphs.capture_next()
            while (
                busy and more and graphs.wanted_next and time.perf_counter() - t0 < WANTED_CAPTURE_S
            ):
                more = graphs.capture_next()
        self.partition.refit("CUDA graph capture between batches")
        if not more:
            info = graphs.describe()
            logger.info(
                "CUDA graphs: all %d captured (%d at start-up, %d out of memory, %d over "
                "their memory limit), %.2f s of capture, %s pool",
                info["graphs"],
                info["graphs_at_start"],
                info["skipped_out_of_memory"],
                info["skipped_over_limit"],
                info["capture_s"],
                format_bytes(max(0, info["pool_bytes"])),
            )


def before_traffic(
    work: Callable[[bool], bool], executor: Executor, traffic: Callable[[], bool]
) -> threading.Thread:
    """Step ``work`` (``busy`` False: nothing has arrived) on the model's ``executor`` from a
    daemon thread until it is done or ``traffic()`` says the batcher's worker has started and
    takes the steps over. The worker starts with a replica's first request, and HAProxy may
    send the first ones to a sibling: without this, a replica no request has reached yet would
    leave its graphs to capture under its first load. A step in flight when the first request
    arrives delays its batch by at most that step, as any idle step does."""

    def run() -> None:
        try:
            while not traffic() and executor.submit(work, False).result():
                pass
        except Exception:  # noqa: BLE001 - the batcher's steps try again once it serves
            logger.exception("start-up work before the first request failed; left to serving")

    thread = threading.Thread(target=run, name="idle-work", daemon=True)
    thread.start()
    return thread
