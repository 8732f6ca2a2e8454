"""Dynamic batching that forms each batch when the model is free to run it.

Ray Serve 2.60's ``@serve.batch`` forms a batch when requests *arrive*: its loop collects for
``batch_wait_timeout_s`` and hands the batch to a task that then waits for the model
(``max_concurrent_batches``) without blocking the next collection. Under a steady stream that
queues many batches of one or two items behind a busy model, so a backlog never turns into big
batches (benchmarks/journal/2026-11-29-side-by-side-and-cuda-graphs.md). Here the one worker
takes everything queued, up to ``max_batch_size``, at the moment the model is free, as Triton's
dynamic batcher does. ``batch_wait_timeout_s`` only
delays a batch whose first item arrived less than that long ago: a backlog runs at once.

Overload gets a clean, early no: the queue holds at most ``max_queued_items`` items (a request
that would pass it is refused at once with ``Overloaded``, before any model work), and a
request whose items are still all queued ``queue_deadline_s`` after it arrived is failed with
``Overloaded`` too (checked when a request arrives and when a batch forms). Both carry a
Retry-After estimate: the queue's items over the model's measured items per second.

With ``cost`` (an item's tokens) and ``max_batch_tokens``, as text-embeddings-inference's
``--max-batch-tokens``, a batch is also bounded by its padded tokens (items x the longest), and
takes items of like lengths (``_take_by_tokens``): the oldest request's next items first, then
those of the same power-of-two length bucket behind it; items of other lengths join only when
everything queued fits in the one batch, or once passed over ``MAX_SKIPS`` times.

``idle_work`` (optional): work in small steps to run on the model's executor between batches
(the graphs and warm-up batches start-up left; before the first request starts the worker,
serving.idle.before_traffic runs them). ``busy`` is False once no request has come for
``IDLE_AFTER_S``, and True at least every ``IDLE_WORK_EVERY_S`` while requests come: then only
what the load needs (the graphs its batches wanted), so a request waits at most one step.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

from serve_app.errors import Overloaded
from serve_app.serving import packing, requestid

logger = logging.getLogger("serve_app")

T = TypeVar("T")
R = TypeVar("R")


class _Request:
    """One caller's items in the queue: ``taken`` of them are in a batch already, and the one
    future resolves once every output is in ``outputs``."""

    __slots__ = (
        "items",
        "outputs",
        "pending",
        "taken",
        "future",
        "enqueued_s",
        "counted",
        "request_id",
        "skipped",
    )

    def __init__(self, items: Sequence[Any], future: asyncio.Future[list[Any]], now_s: float):
        self.items = items
        self.outputs: list[Any] = [None] * len(items)
        self.pending = len(items)
        self.taken = 0
        self.future = future
        self.enqueued_s = now_s
        self.counted = True  # its untaken items are in Batcher._queued
        self.request_id = requestid.current()  # its batches' log lines name it
        self.skipped = 0  # batches formed past it while it waited (length bucketing)


class BatchSizeMismatch(RuntimeError):
    """The batch function returned a different number of outputs than it got inputs."""


class Batcher(Generic[T, R]):
    """Queue items from any number of requests; run them through ``run_batch`` in batches.

    ``run_batch`` runs on ``executor`` (one batch at a time) and returns one output per input,
    in order. An exception from it fails exactly the requests with items in that batch; the next
    batch runs. Items whose caller has gone (a cancelled future) are dropped before a batch is
    formed. A request's items stay in order and may be split across batches.

    Each request costs one future and one queue entry, however many items it carries: on the
    request path, a future per item (and a gather over them) cost more than the bookkeeping
    they replaced.
    """

    # The smoothing of the measured drain rate (items per second of model time) per batch.
    RATE_SMOOTHING = 0.2
    # Under load, a step of idle_work still runs at least this often.
    IDLE_WORK_EVERY_S = 0.5
    # The replica is idle once no request has arrived for this long. An empty queue alone is
    # not: under load it empties between every two batches while requests are on their way.
    IDLE_AFTER_S = 0.1
    # Length bucketing: a request passed over this many times joins the next batch whatever its
    # length (so an item waits at most this many batches beyond those of the items ahead of it),
    # and batches look this many requests behind the oldest for items of its length.
    MAX_SKIPS = 4
    SCAN_REQUESTS = 512

    def __init__(
        self,
        run_batch: Callable[[list[T]], list[R]],
        executor: Executor,
        max_batch_size: int,
        batch_wait_timeout_s: float,
        max_queued_items: int | None = None,
        queue_deadline_s: float | None = None,
        idle_work: Callable[[bool], bool] | None = None,
        cost: Callable[[T], int] | None = None,
        max_batch_tokens: int | None = None,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if batch_wait_timeout_s < 0:
            raise ValueError(f"batch_wait_timeout_s must be >= 0, got {batch_wait_timeout_s}")
        if max_queued_items is not None and max_queued_items < 1:
            raise ValueError(f"max_queued_items must be at least 1, got {max_queued_items}")
        if queue_deadline_s is not None and queue_deadline_s <= 0:
            raise ValueError(f"queue_deadline_s must be > 0, got {queue_deadline_s}")
        if max_batch_tokens is not None and (max_batch_tokens < 1 or cost is None):
            raise ValueError(f"max_batch_tokens needs a cost and >= 1, got {max_batch_tokens}")
        self.max_batch_tokens = max_batch_tokens
        self._cost = cost
        self.max_queued_items = max_queued_items
        self.queue_deadline_s = queue_deadline_s
        self.rejected_requests = 0  # refused at submit: the queue was full
        self.expired_requests = 0  # failed after queue_deadline_s in the queue
        self._items_per_s: float | None = None  # measured drain rate, for Retry-After
        self._run_batch = run_batch
        self._executor = executor
        self.max_batch_size = max_batch_size
        self.batch_wait_timeout_s = batch_wait_timeout_s
        self._queue: deque[_Request] = deque()
        self._queued = 0  # items in the queue not yet taken into a batch
        self._wakeup: asyncio.Event | None = None
        self._wake_at = 1  # queued items that wake the worker: 1 when idle, max when filling
        self._worker: asyncio.Task[None] | None = None
        self._idle_work = idle_work  # one step per call; returns whether steps remain
        self._idle_work_at_s = time.monotonic()
        self._arrived_at_s = time.monotonic()  # the latest request's arrival
        # Called with a request's wait once its first item joins a batch (serving/metrics).
        self.on_queued: Callable[[float], None] | None = None

    @property
    def started(self) -> bool:  # the worker, started by the first request, runs idle work
        return self._worker is not None

    @property
    def queued(self) -> int:
        return self._queued

    def retry_after_s(self, extra_items: int = 0) -> int:
        """Whole seconds until the queue (plus ``extra_items``) should have drained, from the
        measured drain rate: at least 1, at most the queue deadline (rounded up)."""
        ceiling = math.ceil(self.queue_deadline_s) if self.queue_deadline_s else 60
        if not self._items_per_s:
            return 1
        estimate = math.ceil((self._queued + extra_items) / self._items_per_s)
        return max(1, min(ceiling, estimate))

    def check_room(self, items: int = 1) -> None:
        """Raise Overloaded (and count it) when ``items`` more items would not fit in the queue
        now. Expired requests are failed first, so their room counts."""
        self._expire(time.monotonic())
        limit = self.max_queued_items
        if limit is None or self._queued + items <= limit:
            return
        self.rejected_requests += 1
        raise Overloaded(
            f"this replica's queue is full ({self._queued} items queued, at most {limit}: "
            "args.max_queued_items); retry later or add replicas",
            retry_after_s=self.retry_after_s(items),
            code="queue_full",
        )

    async def submit(self, items: Sequence[T]) -> list[R]:
        """Queue ``items`` (kept in order, possibly split across batches); their outputs.
        Raises Overloaded at once when the queue has no room for them, or later when they
        are still queued ``queue_deadline_s`` after they arrived."""
        if not items:
            return []
        self.check_room(len(items))
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._wakeup = asyncio.Event()
            # A context of its own: not the first request's, whose id its lines would carry.
            self._worker = loop.create_task(
                self._work(), name="serve_app-batcher", context=contextvars.Context()
            )
        future: asyncio.Future[list[Any]] = loop.create_future()
        req = _Request(items, future, time.monotonic())
        self._queue.append(req)
        self._arrived_at_s = req.enqueued_s
        self._queued += len(items)
        if self._queued >= self._wake_at:
            assert self._wakeup is not None
            self._wakeup.set()
        try:
            return await future
        except asyncio.CancelledError:
            # The caller has gone (a timeout, a client that closed): its items leave the
            # count now, and the worker skips them.
            self._forget(req)
            raise

    async def submit_redoing(
        self, items: Sequence[T], redo: Callable[[R], Callable[[], T] | None]
    ) -> list[R]:
        """``submit``, then each output that ``redo`` maps to a callable (a ``contract.Redo``'s
        ``prepare``: an item the batch handed back) is replaced by the output of what the
        callable returns, run in a thread (never the model's) and submitted once more."""
        outputs = await self.submit(items)
        again = [(i, fn) for i, out in enumerate(outputs) if (fn := redo(out)) is not None]
        if again:
            prepared = await asyncio.to_thread(lambda: [fn() for _, fn in again])
            for (i, _), out in zip(again, await self.submit(prepared), strict=True):
                outputs[i] = out
        return outputs

    def _forget(self, req: _Request) -> None:
        """Take a request's untaken items out of the count (once)."""
        if req.counted:
            req.counted = False
            self._queued -= len(req.items) - req.taken

    def _expire(self, now_s: float) -> None:
        """Fail the requests that have waited past the deadline with none of their items taken
        (a request already part-way through the model keeps its place)."""
        if self.queue_deadline_s is None:
            return
        cutoff_s = now_s - self.queue_deadline_s
        for req in self._queue:  # oldest first: stop at the first one young enough
            if req.enqueued_s > cutoff_s:
                break
            if req.taken or req.future.done():
                continue
            self._forget(req)
            self.expired_requests += 1
            req.future.set_exception(
                Overloaded(
                    f"waited {now_s - req.enqueued_s:.1f} s in this replica's queue, longer "
                    f"than args.queue_deadline_s ({self.queue_deadline_s:g} s); retry later "
                    "or add replicas",
                    retry_after_s=self.retry_after_s(),
                    code="queue_deadline_exceeded",
                )
            )
        self._drop_gone()

    async def _wait(self, wake_at: int, timeout_s: float | None) -> None:
        assert self._wakeup is not None
        self._wake_at = wake_at
        self._wakeup.clear()
        if self._queued >= wake_at:
            return
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout_s)
        except TimeoutError:
            pass

    def _drop_gone(self) -> None:
        """Drop requests at the head of the queue whose caller has gone."""
        while self._queue and self._queue[0].future.done():
            self._forget(self._queue.popleft())

    def _take(self) -> list[tuple[_Request, int]]:
        """Up to ``max_batch_size`` (request, item index) pairs from the head of the queue."""
        if self.max_batch_tokens is not None:
            return self._take_by_tokens()
        batch: list[tuple[_Request, int]] = []
        now_s = time.monotonic()
        while self._queue and len(batch) < self.max_batch_size:
            req = self._queue[0]
            if req.future.done():
                self._drop_gone()
                continue
            if req.taken == 0 and self.on_queued is not None:
                self.on_queued(now_s - req.enqueued_s)
            n = min(len(req.items) - req.taken, self.max_batch_size - len(batch))
            batch.extend((req, i) for i in range(req.taken, req.taken + n))
            req.taken += n
            self._queued -= n
            if req.taken == len(req.items):
                self._queue.popleft()
        return batch

    def _take_by_tokens(self) -> list[tuple[_Request, int]]:
        """A batch bounded by items and padded tokens, of like lengths (serving/packing)."""
        assert self._cost is not None and self.max_batch_tokens is not None
        self._drop_gone()
        now_s = time.monotonic()

        def taking(req: _Request) -> None:
            self._queued -= 1
            if req.taken == 0 and self.on_queued is not None:
                self.on_queued(now_s - req.enqueued_s)

        batch, emptied = packing.pack(
            self._queue,
            self._cost,
            self.max_batch_tokens,
            self.max_batch_size,
            self._queued,
            taking,
            packing.Bucketing(self.MAX_SKIPS, self.SCAN_REQUESTS),
        )
        if emptied:
            self._queue = deque(r for r in self._queue if r.taken < len(r.items))
        return batch

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._drop_gone()
                if self._idle_work is not None:
                    now = time.monotonic()
                    quiet_s = now - self._arrived_at_s
                    if not self._queue and quiet_s >= self.IDLE_AFTER_S:
                        await self._idle_step(loop, busy=False)
                        continue
                    if not self._queue:  # traffic was just here: the next request, or quiet
                        await self._wait(1, self.IDLE_AFTER_S - quiet_s)
                        continue
                    if now - self._idle_work_at_s >= self.IDLE_WORK_EVERY_S:
                        await self._idle_step(loop, busy=True)
                        continue
                if not self._queue:
                    await self._wait(1, None)
                    continue
                deadline_s = self._queue[0].enqueued_s + self.batch_wait_timeout_s
                while self._queued < self.max_batch_size:
                    remaining_s = deadline_s - time.monotonic()
                    if remaining_s <= 0:
                        break
                    await self._wait(self.max_batch_size, remaining_s)
                self._wake_at = 1
                self._expire(time.monotonic())
                batch = self._take()
                if batch:
                    await self._run(loop, batch)
        except asyncio.CancelledError:
            for req in self._queue:
                req.future.cancel()
            self._queue.clear()
            self._queued = 0
            raise

    async def _idle_step(self, loop: asyncio.AbstractEventLoop, busy: bool) -> None:
        """One step of ``idle_work`` on the executor (``busy``: requests are queued); it is
        dropped when done or when it fails (logged: what it had left is simply not done)."""
        assert self._idle_work is not None
        try:
            more = await loop.run_in_executor(self._executor, self._idle_work, busy)
        except Exception:  # noqa: BLE001 - serving goes on without the rest of it
            logger.exception("work between batches failed; the rest of it is dropped")
            more = False
        self._idle_work_at_s = time.monotonic()
        if not more:
            self._idle_work = None

    async def _run(
        self, loop: asyncio.AbstractEventLoop, batch: list[tuple[_Request, int]]
    ) -> None:
        started_s = time.perf_counter()
        try:
            outputs = await loop.run_in_executor(
                self._executor,
                requestid.in_batch,
                [req.request_id for req, _ in batch],
                self._run_batch,
                [req.items[i] for req, i in batch],
            )
            self._measure(len(batch), time.perf_counter() - started_s)
            if len(outputs) != len(batch):
                raise BatchSizeMismatch(
                    f"the batch function returned {len(outputs)} outputs for {len(batch)} inputs"
                )
        except Exception as exc:  # noqa: BLE001 - the batch's callers get the error
            for req, _ in batch:
                if not req.future.done():
                    req.future.set_exception(exc)
            return
        for (req, i), out in zip(batch, outputs, strict=True):
            req.outputs[i] = out
            req.pending -= 1
            if req.pending == 0 and not req.future.done():
                req.future.set_result(req.outputs)

    def _measure(self, items: int, took_s: float) -> None:
        if took_s <= 0:
            return
        rate = items / took_s
        prev = self._items_per_s
        self._items_per_s = rate if prev is None else prev + self.RATE_SMOOTHING * (rate - prev)

    def close(self) -> None:
        """Stop the worker; anything still queued is cancelled."""
        if self._worker is not None:
            self._worker.cancel()
