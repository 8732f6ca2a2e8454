"""The start-up work a replica left for between batches (serving.idle.LeftoverStartup): graph
captures first, wanted shapes first under load, warm-up batches only when idle."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from serve_app.serving.batcher import Batcher
from serve_app.serving.idle import LeftoverStartup, before_traffic


def test_work_between_batches_captures_graphs_first_then_warms_up() -> None:
    """The replica's idle work: every pending graph capture (under the lock that keeps
    check_health's GPU op apart), then the warm-up batches, one step per call."""
    calls: list[str] = []
    holder: list[LeftoverStartup] = []

    class Graphs:
        pending = 2
        wanted = 0  # pending shapes a batch wanted, at the front

        @property
        def wanted_next(self) -> bool:
            return self.wanted > 0

        def capture_next(self) -> bool:
            assert holder[0].lock.locked(), "a capture runs under the capture lock"
            calls.append("capture")
            self.pending -= 1
            self.wanted = max(0, self.wanted - 1)
            return self.pending > 0

        def describe(self) -> dict[str, object]:
            return {
                "graphs": 2,
                "graphs_at_start": 0,
                "skipped_out_of_memory": 0,
                "skipped_over_limit": 0,
                "capture_s": 0.0,
                "pool_bytes": 0,
            }

    class Warm:
        pending = [1, 2]
        ran, seconds = 0, 0.0

        def step(self) -> bool:
            assert not holder[0].lock.locked()
            calls.append("warm")
            self.pending.pop(0)
            return bool(self.pending)

    refits: list[str] = []  # each step may load kernels: the partition re-reads its memory
    partition = SimpleNamespace(refit=lambda why: refits.append(why) or 0)
    left = LeftoverStartup(Graphs(), Warm(), partition)  # type: ignore[arg-type]
    holder.append(left)
    # under load, with nothing wanted: nothing at all
    assert left.step(busy=True) is True and calls == []
    assert refits == []
    more = [left.step() for _ in range(4)]
    assert calls == ["capture", "capture", "warm", "warm"]
    assert more == [True, True, True, False]
    assert len(refits) == 4


def test_work_between_batches_under_load_captures_only_wanted_shapes() -> None:
    """Busy steps capture the shapes batches wanted (all of them in one step, within
    WANTED_CAPTURE_S) and never run a warm-up batch; an idle step does the rest."""
    calls: list[str] = []

    class Graphs:
        pending, wanted = 5, 2

        @property
        def wanted_next(self) -> bool:
            return self.wanted > 0

        def capture_next(self) -> bool:
            calls.append("capture")
            self.pending -= 1
            self.wanted = max(0, self.wanted - 1)
            return self.pending > 0

    class Warm:
        pending = [1]
        ran, seconds = 0, 0.0

        def step(self) -> bool:
            calls.append("warm")
            self.pending.pop(0)
            return False

    graphs = Graphs()
    partition = SimpleNamespace(refit=lambda why: 0)
    left = LeftoverStartup(graphs, Warm(), partition)  # type: ignore[arg-type]
    assert left.step(busy=True) is True
    assert calls == ["capture", "capture"] and graphs.pending == 3  # both wanted, no more
    assert left.step(busy=True) is True and len(calls) == 2
    assert left.step(busy=False) is True
    assert calls == ["capture"] * 3


def test_before_traffic_steps_on_the_executor_until_the_first_request_takes_over() -> None:
    """A replica no request has reached yet still does its start-up work (HAProxy may send the
    first requests to a sibling); the batcher's worker, started by the first request, takes the
    steps over and the thread stops."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="predict")
    left, threads, busy = [40], set(), []

    def work(is_busy: bool) -> bool:
        threads.add(threading.current_thread().name)
        busy.append(is_busy)
        time.sleep(0.005)
        left[0] -= 1
        return left[0] > 0

    b = Batcher(lambda items: items, executor, 8, 0.0, idle_work=work)

    async def main() -> int:
        thread = before_traffic(work, executor, lambda: b.started)
        while left[0] > 35:  # no request yet: the steps run anyway
            await asyncio.sleep(0.002)
        assert await b.submit(["a"]) == ["a"]
        thread.join(2.0)
        assert not thread.is_alive()  # the worker has started: the thread has stopped
        stepped = 40 - left[0]
        while left[0] > 0:  # the rest, run by the worker while the replica is quiet
            await asyncio.sleep(0.005)
        b.close()
        return stepped

    try:
        assert asyncio.run(main()) >= 5
    finally:
        executor.shutdown(wait=True)
    assert left[0] == 0 and not any(busy)  # nothing was queued at any step
    assert threads == {"predict_0"}


def test_before_traffic_ends_when_the_work_is_done_or_fails(caplog) -> None:
    executor = ThreadPoolExecutor(max_workers=1)
    calls = []

    def three(busy: bool) -> bool:
        calls.append(busy)
        return len(calls) < 3

    def failing(busy: bool) -> bool:
        raise RuntimeError("capture failed")

    try:
        before_traffic(three, executor, lambda: False).join(5.0)
        assert calls == [False, False, False]
        with caplog.at_level("ERROR", logger="serve_app"):
            thread = before_traffic(failing, executor, lambda: False)
            thread.join(5.0)
        assert not thread.is_alive() and "before the first request failed" in caplog.text
    finally:
        executor.shutdown(wait=True)
