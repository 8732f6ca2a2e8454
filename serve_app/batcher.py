"""Dynamic batching that forms each batch when the model is free to run it.

Ray Serve 2.60's ``@serve.batch`` forms a batch when requests *arrive*: its loop collects for
``batch_wait_timeout_s`` and hands the batch to a task that then waits for the model
(``max_concurrent_batches``) without blocking the next collection. Under a steady stream that
queues many batches of one or two items behind a busy model, so a backlog never turns into big
batches (we measured 1.0 to 1.3 items per batch with 700 ms of queue on an H200; see
docs/benchmarks.md). Here the one worker takes everything queued, up to ``max_batch_size``, at
the moment the model is free, as Triton's dynamic batcher does. ``batch_wait_timeout_s`` only
delays a batch whose first item arrived less than that long ago: a backlog runs at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class _Entry:
    item: Any
    future: asyncio.Future[Any]
    enqueued_s: float


class BatchSizeMismatch(RuntimeError):
    """The batch function returned a different number of outputs than it got inputs."""


class Batcher(Generic[T, R]):
    """Queue items from any number of requests; run them through ``run_batch`` in batches.

    ``run_batch`` runs on ``executor`` (one batch at a time) and returns one output per input,
    in order. An exception from it fails exactly the items of that batch; the next batch runs.
    Items whose caller has gone (cancelled futures) are dropped before a batch is formed.
    """

    def __init__(
        self,
        run_batch: Callable[[list[T]], list[R]],
        executor: Executor,
        max_batch_size: int,
        batch_wait_timeout_s: float,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if batch_wait_timeout_s < 0:
            raise ValueError(f"batch_wait_timeout_s must be >= 0, got {batch_wait_timeout_s}")
        self._run_batch = run_batch
        self._executor = executor
        self.max_batch_size = max_batch_size
        self.batch_wait_timeout_s = batch_wait_timeout_s
        self._queue: deque[_Entry] = deque()
        self._wakeup: asyncio.Event | None = None
        self._wake_at = 1  # queue length that wakes the worker: 1 when idle, max when filling
        self._worker: asyncio.Task[None] | None = None

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def submit(self, items: Sequence[T]) -> list[R]:
        """Queue ``items`` (kept in order, possibly split across batches); their outputs."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        self._ensure_worker(loop)
        now = time.monotonic()
        futures = [loop.create_future() for _ in items]
        self._queue.extend(_Entry(i, f, now) for i, f in zip(items, futures, strict=True))
        assert self._wakeup is not None
        if len(self._queue) >= self._wake_at:
            self._wakeup.set()
        try:
            return list(await asyncio.gather(*futures))
        except BaseException:
            for fut in futures:  # the caller is gone or one item failed: drop the rest
                if fut.done() and not fut.cancelled():
                    fut.exception()  # retrieved: no "exception never retrieved" noise
                fut.cancel()
            raise

    def _ensure_worker(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._worker is None or self._worker.done():
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._work(), name="serve_app-batcher")

    async def _wait(self, wake_at: int, timeout_s: float | None) -> None:
        assert self._wakeup is not None
        self._wake_at = wake_at
        self._wakeup.clear()
        if len(self._queue) >= wake_at:
            return
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout_s)
        except TimeoutError:
            pass

    def _take(self) -> list[_Entry]:
        batch: list[_Entry] = []
        while self._queue and len(batch) < self.max_batch_size:
            entry = self._queue.popleft()
            if not entry.future.done():
                batch.append(entry)
        return batch

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                while self._queue and self._queue[0].future.done():
                    self._queue.popleft()
                if not self._queue:
                    await self._wait(1, None)
                    continue
                deadline_s = self._queue[0].enqueued_s + self.batch_wait_timeout_s
                while len(self._queue) < self.max_batch_size:
                    remaining_s = deadline_s - time.monotonic()
                    if remaining_s <= 0:
                        break
                    await self._wait(self.max_batch_size, remaining_s)
                self._wake_at = 1
                batch = self._take()
                if batch:
                    await self._run(loop, batch)
        except asyncio.CancelledError:
            for entry in self._queue:
                entry.future.cancel()
            self._queue.clear()
            raise

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Entry]) -> None:
        try:
            outputs = await loop.run_in_executor(
                self._executor, self._run_batch, [e.item for e in batch]
            )
            if len(outputs) != len(batch):
                raise BatchSizeMismatch(
                    f"the batch function returned {len(outputs)} outputs for {len(batch)} inputs"
                )
        except Exception as exc:  # noqa: BLE001 - the batch's callers get the error
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(exc)
            return
        for entry, out in zip(batch, outputs, strict=True):
            if not entry.future.done():
                entry.future.set_result(out)

    def close(self) -> None:
        """Stop the worker; anything still queued is cancelled."""
        if self._worker is not None:
            self._worker.cancel()
