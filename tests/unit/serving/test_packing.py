"""serving.packing: batches bounded by padded tokens, of like lengths, with bounded waiting
(pure logic, hypothesis over queues of mixed lengths)."""

from __future__ import annotations

from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.serving.packing import Bucketing, pack


class Done:
    def __init__(self, done: bool = False):
        self._done = done

    def done(self) -> bool:
        return self._done


class Req:
    def __init__(self, name: int, lengths: list[int], gone: bool = False):
        self.name = name
        self.items = lengths
        self.taken = 0
        self.skipped = 0
        self.future = Done(gone)


def run_all(
    arrivals: list[list[Req]], max_tokens: int, max_items: int, bucketing: Bucketing
) -> list[list[tuple[Any, int]]]:
    """Pack batch after batch, the requests of ``arrivals[k]`` joining before batch k."""
    queue: deque[Req] = deque()
    batches = []
    step = 0
    while step < len(arrivals) or queue:
        if step < len(arrivals):
            queue.extend(arrivals[step])
        queued = sum(len(r.items) - r.taken for r in queue if not r.future.done())
        batch, _ = pack(
            queue, lambda c: c, max_tokens, max_items, queued, lambda r: None, bucketing
        )
        # the batcher drops emptied requests, and those whose callers left (_drop_gone)
        queue = deque(r for r in queue if r.taken < len(r.items) and not r.future.done())
        batches.append(batch)
        step += 1
        assert batch or not queue, "a batch formed empty while items were queued"
    return batches


lengths = st.lists(st.integers(1, 256), min_size=1, max_size=12)
arrivals_st = st.lists(st.lists(lengths, max_size=4), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    arrivals=arrivals_st,
    max_tokens=st.integers(64, 4096),
    max_items=st.integers(1, 32),
    max_skips=st.integers(0, 4),
)
def test_bounds_every_item_served_and_bounded_waiting(
    arrivals: list[list[list[int]]], max_tokens: int, max_items: int, max_skips: int
) -> None:
    name = iter(range(10**6))
    reqs = [[Req(next(name), ls) for ls in step] for step in arrivals]
    batches = run_all(reqs, max_tokens, max_items, Bucketing(max_skips, scan=64))
    served: dict[tuple[int, int], int] = {}
    first_batch: dict[int, int] = {}
    for k, batch in enumerate(batches):
        assert len(batch) <= max_items
        if len(batch) > 1:  # no batch past the token budget unless one item alone is
            assert len(batch) * max(r.items[i] for r, i in batch) <= max_tokens
        for r, i in batch:
            assert (r.name, i) not in served
            served[(r.name, i)] = k
            first_batch.setdefault(r.name, k)
    everything = {(r.name, i) for step in reqs for r in step for i in range(len(r.items))}
    assert set(served) == everything  # every item served, once
    # bounded waiting: every batch takes an item of the oldest request, so a request is
    # started within (the items queued ahead of it + 1) batches of its arrival
    ahead = 0
    for step, arrived in enumerate(reqs):
        for r in arrived:
            assert first_batch[r.name] - step <= ahead + 1
            ahead += len(r.items)
    for step in reqs:
        for r in step:
            ks = [served[(r.name, i)] for i in range(len(r.items))]
            assert ks == sorted(ks)


def test_short_queries_are_kept_apart_from_long_passages() -> None:
    # under load (more than one batch queued): a batch of passages, then one of queries
    queue = [Req(0, [200]), *(Req(n, [12]) for n in range(1, 41)), Req(41, [220])]
    batches = run_all([queue], max_tokens=16384, max_items=32, bucketing=Bucketing())
    widths = [sorted({r.items[i] for r, i in b}) for b in batches]
    assert widths[0] == [200, 220]
    assert all(w == [12] for w in widths[1:])


def test_short_lengths_share_a_bucket() -> None:
    # under load, queries of 7 and 40 tokens still batch together (one bucket up to 63)
    queue = [Req(0, [7]), *(Req(n, [40 if n % 2 else 9]) for n in range(1, 20))]
    batches = run_all([queue], max_tokens=16384, max_items=8, bucketing=Bucketing())
    assert [len(b) for b in batches] == [8, 8, 4]


def test_everything_left_fits_so_lengths_mix() -> None:
    queue = [Req(0, [12]), Req(1, [200]), Req(2, [12])]
    (batch,) = run_all([queue], max_tokens=16384, max_items=32, bucketing=Bucketing())
    assert len(batch) == 3


def test_a_request_passed_over_max_skips_times_joins_the_next_batch() -> None:
    # a stream of short queries with one passage: it waits at most max_skips batches
    arrivals = [[Req(0, [10] * 4), Req(1, [250])], *([[Req(n, [10] * 4)] for n in range(2, 12)])]
    batches = run_all(arrivals, max_tokens=100_000, max_items=4, bucketing=Bucketing(2, 64))
    k = next(k for k, b in enumerate(batches) if any(r.name == 1 for r, _ in b))
    assert k <= 3  # the first batch, then passed over twice


def test_a_large_request_is_split_by_tokens() -> None:
    batches = run_all([[Req(0, [200] * 128)]], 16384, 256, Bucketing())
    assert [len(b) for b in batches] == [81, 47]  # 81 x 200 <= 16384 < 82 x 200


def test_an_item_over_the_budget_runs_alone() -> None:
    batches = run_all([[Req(0, [300, 300]), Req(1, [4])]], 256, 8, Bucketing())
    assert [len(b) for b in batches][:2] == [1, 1]


def test_requests_whose_callers_left_are_skipped() -> None:
    batches = run_all([[Req(0, [5], gone=True), Req(1, [5])]], 256, 8, Bucketing())
    assert [[r.name for r, _ in b] for b in batches] == [[1]]
