"""Batches bounded by padded tokens, of items of like lengths (the batcher's ``cost`` path).

A padded batch costs its items times its longest item, as text-embeddings-inference counts
``--max-batch-tokens`` for padded models; so a batch is bounded by that as well as by items,
and short queries are kept apart from long passages: the oldest request's next items first (in
order, whatever their lengths: the oldest is never passed over, and a large request is split
across batches by tokens), then items of the same power-of-two length bucket (lengths up to 63
share one) from the requests behind it. Items of other lengths join when everything queued
fits in the one batch (low load: nothing is gained by waiting), or once their request has been
passed over ``max_skips`` times, which bounds how long bucketing can hold an item back.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol


class Queued(Protocol):
    """A request in the batcher's queue (batcher._Request)."""

    items: Any
    taken: int
    skipped: int

    @property
    def future(self) -> Any: ...


@dataclass(frozen=True)
class Bucketing:
    """``max_skips``: batches that may pass a request over for its length; ``scan``: requests
    looked at behind the oldest for items of its length; ``floor``: lengths up to twice this
    share one bucket (short texts of 7 and 9 tokens are not kept apart: the in-process
    benchmark's batches halved when they were, benchmarks/journal/2026-12-01-tokens-cpu.md)."""

    max_skips: int = 4
    scan: int = 512
    floor: int = 32

    def bucket(self, tokens: int) -> int:
        return max(tokens, self.floor).bit_length()


def pack(
    queue: Iterable[Any],
    cost: Callable[[Any], int],
    max_tokens: int,
    max_items: int,
    queued: int,
    taking: Callable[[Any], None],
    bucketing: Bucketing,
) -> tuple[list[tuple[Any, int]], bool]:
    """The next batch as (request, item index) pairs, taken from ``queue`` (oldest first,
    ``queued`` items not yet taken; ``taking(req)`` is called before each item is taken), and
    whether a request was emptied (the caller drops those from its queue)."""
    batch: list[tuple[Any, int]] = []
    touched: set[int] = set()
    width = 0  # the batch's longest item
    live = [r for r in queue if not r.future.done()]
    emptied = False

    def take(req: Any, same_bucket: bool) -> None:
        nonlocal width, emptied, queued
        bucket = bucketing.bucket(width)
        while req.taken < len(req.items) and len(batch) < max_items:
            c = cost(req.items[req.taken])
            if same_bucket and bucketing.bucket(c) != bucket:
                return
            if batch and (len(batch) + 1) * max(width, c) > max_tokens:
                return
            taking(req)
            touched.add(id(req))
            batch.append((req, req.taken))
            width = max(width, c)
            req.taken += 1
            queued -= 1
        emptied = emptied or req.taken == len(req.items)

    if not live:
        return batch, emptied
    take(live[0], same_bucket=False)
    window = list(itertools.islice(live, 1, bucketing.scan))
    for req in window:
        if len(batch) >= max_items:
            break
        take(req, same_bucket=req.skipped < bucketing.max_skips)
    if 0 < queued <= max_items - len(batch):  # all that is left may fit: mix lengths
        costs = [cost(r.items[i]) for r in live for i in range(r.taken, len(r.items))]
        if (len(batch) + len(costs)) * max([width, *costs]) <= max_tokens:
            for req in live:
                take(req, same_bucket=False)
    for req in window:
        if id(req) not in touched and req.taken < len(req.items):
            req.skipped += 1
    return batch, emptied
