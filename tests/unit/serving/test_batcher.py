"""serving.batcher: batches form when the model is free, so a backlog runs as big batches."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from serve_app.errors import Overloaded
from serve_app.serving.batcher import Batcher, BatchSizeMismatch


class Model:
    """Records each batch; ``gate`` (when set) holds the first batch until released."""

    def __init__(self, gate: threading.Event | None = None, work_s: float = 0.0):
        self.sizes: list[int] = []
        self.seen: list[object] = []
        self.gate = gate
        self.started = threading.Event()
        self.work_s = work_s

    def __call__(self, items: list[object]) -> list[object]:
        self.started.set()
        if self.gate is not None:
            self.gate.wait(5.0)
            self.gate = None
        if self.work_s:
            time.sleep(self.work_s)
        if any(i == "boom" for i in items):
            raise ValueError("bad batch")
        self.sizes.append(len(items))
        self.seen.extend(items)
        return [f"out-{i}" for i in items]


@pytest.fixture
def executor():
    ex = ThreadPoolExecutor(max_workers=1)
    yield ex
    ex.shutdown(wait=True)


async def _wait_started(model: Model) -> None:
    while not model.started.is_set():
        await asyncio.sleep(0.001)


def test_backlog_runs_as_one_batch_when_the_model_frees(executor) -> None:
    gate = threading.Event()
    model = Model(gate)

    async def main() -> list[list[object]]:
        b = Batcher(model, executor, max_batch_size=64, batch_wait_timeout_s=0.0)
        first = asyncio.create_task(b.submit([0]))
        await _wait_started(model)
        rest = [asyncio.create_task(b.submit([i])) for i in range(1, 51)]
        await asyncio.sleep(0.02)  # 50 single-item requests queue behind the busy model
        assert b.queued == 50
        gate.set()
        return await asyncio.gather(first, *rest)

    results = asyncio.run(main())
    assert model.sizes == [1, 50]
    assert results == [[f"out-{i}"] for i in range(51)]


def test_steady_stream_batches_grow_with_model_time(executor) -> None:
    """Arrivals every 4 ms into a model that takes 20 ms: Ray 2.60's @serve.batch runs these
    one at a time (docs/benchmarks.md); here every batch after the first carries the backlog."""
    model = Model(work_s=0.02)

    async def main() -> None:
        b = Batcher(model, executor, max_batch_size=64, batch_wait_timeout_s=0.002)
        tasks = []
        for i in range(60):
            tasks.append(asyncio.create_task(b.submit([i])))
            await asyncio.sleep(0.004)
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert sum(model.sizes) == 60
    assert model.seen == list(range(60))
    assert max(model.sizes) >= 4
    assert len(model.sizes) <= 20


def test_max_batch_size_is_respected_and_order_kept(executor) -> None:
    gate = threading.Event()
    model = Model(gate)

    async def main() -> list[object]:
        b = Batcher(model, executor, max_batch_size=32, batch_wait_timeout_s=0.0)
        first = asyncio.create_task(b.submit(["first"]))
        await _wait_started(model)
        big = asyncio.create_task(b.submit(list(range(100))))
        await asyncio.sleep(0.01)
        gate.set()
        await first
        return await big

    out = asyncio.run(main())
    assert model.sizes == [1, 32, 32, 32, 4]
    assert out == [f"out-{i}" for i in range(100)]


def test_wait_timeout_collects_items_arriving_shortly_after(executor) -> None:
    model = Model()

    async def main() -> None:
        b = Batcher(model, executor, max_batch_size=8, batch_wait_timeout_s=0.3)
        t0 = time.monotonic()
        a = asyncio.create_task(b.submit(["a"]))
        await asyncio.sleep(0.05)
        c = asyncio.create_task(b.submit(["b"]))
        await asyncio.gather(a, c)
        elapsed_s = time.monotonic() - t0
        assert 0.25 <= elapsed_s < 2.0

    asyncio.run(main())
    assert model.sizes == [2]


def test_full_batch_does_not_wait_for_the_timeout(executor) -> None:
    model = Model()

    async def main() -> float:
        b = Batcher(model, executor, max_batch_size=4, batch_wait_timeout_s=5.0)
        t0 = time.monotonic()
        await b.submit([1, 2, 3, 4])
        return time.monotonic() - t0

    assert asyncio.run(main()) < 1.0
    assert model.sizes == [4]


def test_an_error_fails_only_its_batch(executor) -> None:
    gate = threading.Event()
    model = Model(gate)

    async def main() -> None:
        b = Batcher(model, executor, max_batch_size=1, batch_wait_timeout_s=0.0)
        ok1 = asyncio.create_task(b.submit(["x"]))
        await _wait_started(model)
        bad = asyncio.create_task(b.submit(["boom"]))
        ok2 = asyncio.create_task(b.submit(["y"]))
        await asyncio.sleep(0.01)
        gate.set()
        assert await ok1 == ["out-x"]
        with pytest.raises(ValueError, match="bad batch"):
            await bad
        assert await ok2 == ["out-y"]
        assert await b.submit(["z"]) == ["out-z"]  # the worker lives on

    asyncio.run(main())


def test_cancelled_callers_items_never_reach_the_model(executor) -> None:
    gate = threading.Event()
    model = Model(gate)

    async def main() -> None:
        b = Batcher(model, executor, max_batch_size=16, batch_wait_timeout_s=0.0)
        first = asyncio.create_task(b.submit(["first"]))
        await _wait_started(model)
        gone = asyncio.create_task(b.submit(["gone-1", "gone-2"]))
        kept = asyncio.create_task(b.submit(["kept"]))
        await asyncio.sleep(0.01)
        gone.cancel()
        await asyncio.sleep(0.01)
        gate.set()
        await first
        assert await kept == ["out-kept"]

    asyncio.run(main())
    assert "gone-1" not in model.seen and "gone-2" not in model.seen
    assert model.sizes == [1, 1]


def test_wrong_output_count_is_an_error(executor) -> None:
    async def main() -> None:
        b = Batcher(lambda items: items[:-1], executor, 8, 0.0)
        with pytest.raises(BatchSizeMismatch, match="1 outputs for 2 inputs"):
            await b.submit([1, 2])

    asyncio.run(main())


def test_lowering_max_batch_size_applies_to_the_next_batch(executor) -> None:
    gate = threading.Event()
    model = Model(gate)

    async def main() -> None:
        b = Batcher(model, executor, max_batch_size=64, batch_wait_timeout_s=0.0)
        first = asyncio.create_task(b.submit([0]))
        await _wait_started(model)
        rest = asyncio.create_task(b.submit(list(range(1, 21))))
        b.max_batch_size = 8
        gate.set()
        await asyncio.gather(first, rest)

    asyncio.run(main())
    assert model.sizes == [1, 8, 8, 4]


@pytest.mark.parametrize(("size", "wait_s"), [(0, 0.0), (4, -1.0)])
def test_bad_settings_are_refused(executor, size: int, wait_s: float) -> None:
    with pytest.raises(ValueError):
        Batcher(lambda items: items, executor, size, wait_s)


def test_empty_submit_returns_at_once(executor) -> None:
    assert asyncio.run(Batcher(lambda items: items, executor, 4, 1.0).submit([])) == []


def test_ray_serve_batch_forms_batches_on_arrival(executor, monkeypatch) -> None:
    """Why serve_app has its own batcher: the same stream through Ray 2.60's @serve.batch runs
    one item per batch while the backlog grows. If Ray changes this, revisit batcher.py."""
    from ray import serve
    from ray.serve import batching

    # The check reads the replica context, which only exists inside a deployment.
    monkeypatch.setattr(
        batching._BatchQueue, "_warn_if_max_batch_size_exceeds_max_ongoing_requests", lambda s: None
    )
    model = Model(work_s=0.02)

    class Deployment:
        @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.002)
        async def handle(self, items: list[int]) -> list[object]:
            return await asyncio.get_running_loop().run_in_executor(executor, model, items)

    async def main() -> None:
        d = Deployment()
        tasks = []
        for i in range(60):
            tasks.append(asyncio.create_task(d.handle(i)))
            await asyncio.sleep(0.004)
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert sum(model.sizes) == 60
    # No batching to speak of, against >= 4 above: most batches are one or two items. (Not the
    # largest batch: on loaded cores a late sleep lets two or three items meet once in a while.)
    # On loaded cores (CI's 2, with the other job beside) late wakeups let two meet more often.
    assert len(model.sizes) >= 25 and sorted(model.sizes)[len(model.sizes) // 2] <= 2, model.sizes


# ---- bounds: a full queue and an old request get Overloaded, at once and without model work


def test_a_full_queue_refuses_at_once_then_recovers(executor) -> None:
    gate = threading.Event()
    model = Model(gate)

    async def main() -> None:
        b = Batcher(model, executor, 64, 0.0, max_queued_items=4, queue_deadline_s=30.0)
        first = asyncio.create_task(b.submit(["running"]))
        await _wait_started(model)
        queued = [asyncio.create_task(b.submit([f"q{i}", f"q{i}b"])) for i in range(2)]
        await asyncio.sleep(0.01)
        assert b.queued == 4
        # At once, not after the running batch: that one holds until the gate opens below.
        with pytest.raises(Overloaded) as refused:
            await asyncio.wait_for(b.submit(["one-too-many"]), timeout=10.0)
        assert not gate.is_set() and b.queued == 4
        err = refused.value
        assert (err.status_code, err.error_type, err.code) == (503, "overloaded", "queue_full")
        assert err.headers() == {"Retry-After": "1"}  # no drain rate measured yet
        assert "4 items queued, at most 4" in err.message
        assert (b.rejected_requests, b.queued) == (1, 4)
        gate.set()
        await first
        assert await asyncio.gather(*queued) == [["out-q0", "out-q0b"], ["out-q1", "out-q1b"]]
        assert await b.submit(["after"]) == ["out-after"]  # room again

    asyncio.run(main())
    assert "one-too-many" not in model.seen
    assert model.sizes == [1, 4, 1]


def test_a_request_bigger_than_the_room_left_is_refused_whole(executor) -> None:
    gate = threading.Event()
    model = Model(gate)

    async def main() -> None:
        b = Batcher(model, executor, 64, 0.0, max_queued_items=4)
        first = asyncio.create_task(b.submit(["running"]))
        await _wait_started(model)
        ok = asyncio.create_task(b.submit(["a", "b"]))
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded):
            await b.submit(["c", "d", "e"])  # 2 + 3 > 4: none of it is queued
        assert b.queued == 2
        gate.set()
        await asyncio.gather(first, ok)

    asyncio.run(main())
    assert model.seen == ["running", "a", "b"]


def test_a_request_queued_past_the_deadline_fails_without_model_work(executor) -> None:
    gate = threading.Event()
    model = Model(gate)

    async def main() -> None:
        b = Batcher(model, executor, 64, 0.0, max_queued_items=100, queue_deadline_s=0.05)
        first = asyncio.create_task(b.submit(["running"]))
        await _wait_started(model)
        old = asyncio.create_task(b.submit(["old-1", "old-2"]))
        await asyncio.sleep(0.1)  # past the deadline while the model is busy
        young = asyncio.create_task(b.submit(["young"]))  # an arrival checks the deadline
        await asyncio.sleep(0)
        with pytest.raises(Overloaded) as expired:
            await old
        assert expired.value.code == "queue_deadline_exceeded"
        assert "longer than args.queue_deadline_s (0.05 s)" in expired.value.message
        assert int(expired.value.headers()["Retry-After"]) >= 1
        assert (b.expired_requests, b.queued) == (1, 1)
        gate.set()
        await first
        assert await young == ["out-young"]

    asyncio.run(main())
    assert "old-1" not in model.seen and "old-2" not in model.seen


def test_the_deadline_is_checked_when_a_batch_forms(executor) -> None:
    gate = threading.Event()
    model = Model(gate)

    async def main() -> None:
        b = Batcher(model, executor, 64, 0.0, queue_deadline_s=0.05)
        first = asyncio.create_task(b.submit(["running"]))
        await _wait_started(model)
        old = asyncio.create_task(b.submit(["old"]))
        await asyncio.sleep(0.1)
        gate.set()  # no arrival: the worker itself expires it before the next batch
        await first
        with pytest.raises(Overloaded):
            await old
        assert b.expired_requests == 1

    asyncio.run(main())
    assert model.seen == ["running"]


def test_a_request_part_way_through_the_model_keeps_its_place(executor) -> None:
    gate = threading.Event()
    model = Model(gate)

    async def main() -> list[object]:
        b = Batcher(model, executor, 2, 0.0, queue_deadline_s=0.05)
        big = asyncio.create_task(b.submit([1, 2, 3, 4]))  # batches [1, 2] then [3, 4]
        await _wait_started(model)
        await asyncio.sleep(0.1)  # [3, 4] are older than the deadline, but 1 and 2 are in
        gate.set()
        return await big

    assert asyncio.run(main()) == ["out-1", "out-2", "out-3", "out-4"]
    assert model.sizes == [2, 2]


def test_a_cancelled_caller_frees_its_room_at_once(executor) -> None:
    gate = threading.Event()
    model = Model(gate)

    async def main() -> None:
        b = Batcher(model, executor, 64, 0.0, max_queued_items=4)
        first = asyncio.create_task(b.submit(["running"]))
        await _wait_started(model)
        gone = asyncio.create_task(b.submit([1, 2, 3, 4]))
        await asyncio.sleep(0.01)
        assert b.queued == 4
        gone.cancel()  # what a per-request timeout does
        await asyncio.sleep(0)
        assert b.queued == 0  # before the worker has looked at the queue again
        kept = asyncio.create_task(b.submit([5, 6, 7, 8]))
        await asyncio.sleep(0.01)
        gate.set()
        await first
        assert await kept == ["out-5", "out-6", "out-7", "out-8"]
        assert b.queued == 0

    asyncio.run(main())
    assert model.seen == ["running", 5, 6, 7, 8]


def test_retry_after_follows_the_measured_drain_rate(executor) -> None:
    """A model that takes 0.1 s per batch of 10 drains about 100 items/s, less the executor's
    overhead (the bounds below hold from 50 to 100 items/s): 1,000 queued items want 10 to 20
    s, capped at the queue deadline."""
    gate = threading.Event()
    model = Model(work_s=0.1)

    async def main() -> tuple[int, int, int]:
        b = Batcher(model, executor, 10, 0.0, max_queued_items=1000, queue_deadline_s=8.0)
        await b.submit(list(range(10)))  # measures the rate
        model.gate, model.started = gate, threading.Event()
        first = asyncio.create_task(b.submit(["running"]))
        await _wait_started(model)
        small = b.retry_after_s(100)  # about 1 s
        backlog = asyncio.create_task(b.submit(list(range(1000))))
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded) as refused:
            await b.submit(["x"])
        capped = int(refused.value.headers()["Retry-After"])
        backlog.cancel()
        gate.set()
        await first
        return small, b.retry_after_s(400), capped

    small, middle, capped = asyncio.run(main())
    assert small in (1, 2)  # 100 items at 50 to 100 items/s
    assert 4 <= middle <= 8  # 400 items, the rate smoothed with the 1-item batch's
    assert capped == 8  # ~10 s of backlog, capped at queue_deadline_s


@pytest.mark.parametrize(("queued", "deadline_s"), [(0, None), (None, 0.0), (None, -1.0)])
def test_bad_bounds_are_refused(executor, queued: int | None, deadline_s: float | None) -> None:
    with pytest.raises(ValueError):
        Batcher(lambda items: items, executor, 4, 0.0, queued, deadline_s)


class IdleWork:
    """``steps`` steps of work between batches, each ``step_s`` long; records what ran when."""

    def __init__(self, steps: int, step_s: float = 0.0, fail_at: int | None = None):
        self.left = steps
        self.step_s = step_s
        self.fail_at = fail_at
        self.ran: list[float] = []
        self.busy: list[bool] = []
        self.threads: set[str] = set()

    def __call__(self, busy: bool) -> bool:
        self.threads.add(threading.current_thread().name)
        self.busy.append(busy)
        if self.fail_at is not None and len(self.ran) == self.fail_at:
            raise RuntimeError("capture failed")
        time.sleep(self.step_s)
        self.ran.append(time.monotonic())
        self.left -= 1
        return self.left > 0


def test_idle_work_runs_on_the_model_executor_while_the_queue_is_empty() -> None:
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="predict")
    model, work = Model(), IdleWork(steps=5)

    async def main() -> list[object]:
        b = Batcher(model, executor, max_batch_size=8, batch_wait_timeout_s=0.0, idle_work=work)
        out = await b.submit(["a"])
        while work.left:  # nothing queued: the steps run one after another
            await asyncio.sleep(0.005)
        again = await b.submit(["b"])
        b.close()
        return [*out, *again]

    try:
        assert asyncio.run(main()) == ["out-a", "out-b"]
    finally:
        executor.shutdown(wait=True)
    assert len(work.ran) == 5 and work.left == 0  # called no more once it said it was done
    assert not any(work.busy)  # nothing was queued at any step
    assert all(name.startswith("predict") for name in work.threads), work.threads


def test_idle_work_still_runs_under_load_at_least_every_interval(executor) -> None:
    model, work = Model(work_s=0.01), IdleWork(steps=1000)

    async def main() -> None:
        b = Batcher(model, executor, max_batch_size=4, batch_wait_timeout_s=0.0, idle_work=work)
        b.IDLE_WORK_EVERY_S = 0.05
        # 200 items queued at once: 50 batches of 4, 10 ms each; the queue empties only at the
        # end, so any step before that ran because the interval had passed
        await asyncio.gather(*(b.submit([i]) for i in range(200)))
        b.close()

    asyncio.run(main())
    assert sum(model.sizes) == 200 and len(model.sizes) >= 50
    assert len(work.ran) >= 4, len(work.ran)
    # the steps taken while requests were queued said so (the replica then does only what the
    # load itself needs)
    assert work.busy.count(True) >= 3, work.busy


def test_an_empty_queue_between_requests_is_not_idle(executor) -> None:
    """Requests 10 ms apart, each served at once: the queue is empty between them, but the
    replica is not idle, so every step taken meanwhile is a busy one; once requests stop for
    IDLE_AFTER_S, the steps are idle ones."""
    model, work = Model(), IdleWork(steps=1000)

    async def main() -> float:
        b = Batcher(model, executor, max_batch_size=8, batch_wait_timeout_s=0.0, idle_work=work)
        b.IDLE_WORK_EVERY_S = 0.05
        # 10 ms gaps against a quiet time of 0.25 s: a loaded CI machine's stalls stay below it.
        b.IDLE_AFTER_S = 0.25
        for i in range(40):
            await b.submit([i])
            await asyncio.sleep(0.01)
        stopped = time.monotonic()
        await asyncio.sleep(0.6)
        b.close()
        return stopped

    stopped = asyncio.run(main())
    # The steps that finished: one may still be running on the executor after close() (its
    # busy flag recorded, its end not yet).
    ran = list(work.ran)
    done = list(zip(ran, work.busy[: len(ran)], strict=True))
    during = [busy for at, busy in done if at < stopped]
    after = [busy for at, busy in done if at >= stopped]
    assert during and all(during), during
    assert after and not any(after), after


def test_failing_idle_work_is_dropped_and_serving_goes_on(executor, caplog) -> None:
    model, work = Model(), IdleWork(steps=10, fail_at=2)

    async def main() -> list[object]:
        b = Batcher(model, executor, max_batch_size=8, batch_wait_timeout_s=0.0, idle_work=work)
        await b.submit(["a"])
        await asyncio.sleep(b.IDLE_AFTER_S + 0.1)  # quiet: idle steps, until the failure
        out = await b.submit(["b"])
        b.close()
        return out

    assert asyncio.run(main()) == ["out-b"]
    assert len(work.ran) == 2 and work.left == 8  # no step after the failure
    assert "work between batches failed" in caplog.text


def test_an_item_handed_back_is_prepared_off_the_model_thread_and_queued_again(
    executor,
) -> None:
    prepared_in: list[str] = []

    def run(items: list[object]) -> list[object]:
        # the first sight of "slow" hands it back; its prepared form runs
        return [("redo", i) if i == "slow" else f"out-{i}" for i in items]

    def prepare() -> object:
        prepared_in.append(threading.current_thread().name)
        return "slow-prepared"

    def redo(out: object) -> object:
        return prepare if isinstance(out, tuple) else None

    async def main() -> list[object]:
        b = Batcher(run, executor, max_batch_size=8, batch_wait_timeout_s=0.0)
        try:
            return await b.submit_redoing(["a", "slow", "b"], redo)
        finally:
            b.close()

    assert asyncio.run(main()) == ["out-a", "out-slow-prepared", "out-b"]
    model_thread = executor.submit(lambda: threading.current_thread().name).result()
    assert len(prepared_in) == 1 and prepared_in[0] != model_thread


def test_token_budget_bounds_batches_and_every_request_gets_its_outputs(executor) -> None:
    gate = threading.Event()
    batches: list[list[int]] = []

    def model(items: list[int]) -> list[str]:
        gate.wait(5.0)
        batches.append(list(items))
        return [f"out-{i}" for i in items]

    async def main() -> list[list[str]]:
        b: Batcher[int, str] = Batcher(
            model, executor, 64, 0.0, cost=lambda n: n, max_batch_tokens=1024
        )
        first = asyncio.create_task(b.submit([8]))
        await asyncio.sleep(0.02)  # the model holds the first batch; the rest queue
        rest = [asyncio.create_task(b.submit(req)) for req in ([200] * 10, [10] * 40, [250])]
        await asyncio.sleep(0.02)
        gate.set()
        return await asyncio.gather(first, *rest)

    outs = asyncio.run(main())
    assert outs == [["out-8"], ["out-200"] * 10, ["out-10"] * 40, ["out-250"]]
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(batch) <= 1024
    # the passages ran apart from the queries (one bucket per batch once the backlog formed)
    assert all(len({max(n, 32).bit_length() for n in batch}) == 1 for batch in batches[1:])


def test_max_batch_tokens_needs_a_cost(executor) -> None:
    with pytest.raises(ValueError, match="max_batch_tokens"):
        Batcher(lambda xs: xs, executor, 8, 0.0, max_batch_tokens=100)
