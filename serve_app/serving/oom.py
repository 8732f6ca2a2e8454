"""Out-of-memory recovery for one batch: split and retry, isolate items that cannot fit.

A batch that runs out of memory under the replica's cap is retried as two halves, recursively,
until each piece fits; an item that runs out of memory on its own gets an ``ItemTooLarge`` result
in its slot while the rest of the batch is answered. The caller frees the allocator cache and
lowers its batch cap in ``on_oom``, which runs *after* the exception has been dropped: a held
exception keeps its traceback, whose frames keep the failed batch's GPU tensors alive.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from serve_app.gpu.snapshot import is_torch_oom

__all__ = [
    "ItemTooLarge",
    "is_torch_oom",
    "lowered_batch_cap",
    "predict_with_oom_split",
    "predict_with_oom_split_async",
]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class ItemTooLarge:
    """The result for an item that ran out of memory even in a batch of one.

    Attributes:
        index: the item's position in the original batch.
        size_hint: the item's size as the caller's ``size_hint`` function measured it (e.g.
            tokens or pixels), or None when no function was given.
    """

    index: int
    size_hint: int | None = None

    @property
    def message(self) -> str:
        """A client-facing explanation, without internals."""
        size = "" if self.size_hint is None else f" (size {self.size_hint})"
        return (
            f"item {self.index}{size} does not fit in this model's GPU memory budget even on "
            "its own; send a smaller input"
        )


def lowered_batch_cap(current_cap: int, failed_batch_size: int) -> int:
    """The batch cap after a batch of ``failed_batch_size`` ran out of memory.

    Half the failed size, never above the current cap and never below 1:
    ``max(1, min(current_cap, failed_batch_size // 2))``. Example: cap 32, a batch of 24 fails:
    the cap becomes 12.
    """
    if current_cap < 1 or failed_batch_size < 1:
        raise ValueError(
            f"current_cap and failed_batch_size must be >= 1, got {current_cap} and "
            f"{failed_batch_size}"
        )
    return max(1, min(current_cap, failed_batch_size // 2))


def _run(
    predict: Callable[[Sequence[T]], Sequence[R]],
    batch: Sequence[T],
    is_oom: Callable[[BaseException], bool],
) -> Sequence[R] | None:
    """``predict(batch)``, or None when it ran out of memory; other errors propagate."""
    try:
        return predict(batch)
    except Exception as exc:
        if not is_oom(exc):
            raise
    # Python unbinds ``exc`` when the except clause ends, and nothing else holds it, so the
    # traceback and the tensors its frames reference are released before we return.
    return None


async def _run_async(
    predict: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
    batch: Sequence[T],
    is_oom: Callable[[BaseException], bool],
) -> Sequence[R] | None:
    try:
        return await predict(batch)
    except Exception as exc:
        if not is_oom(exc):
            raise
    return None


def _check_length(outputs: Sequence[R], start: int, stop: int) -> None:
    if len(outputs) != stop - start:
        raise ValueError(
            f"predict returned {len(outputs)} results for a batch of {stop - start} items; "
            "it must return exactly one result per item, in order"
        )


def _hint(items: Sequence[T], index: int, size_hint: Callable[[T], int] | None) -> int | None:
    return None if size_hint is None else size_hint(items[index])


def predict_with_oom_split(
    items: Sequence[T],
    predict: Callable[[Sequence[T]], Sequence[R]],
    *,
    is_oom: Callable[[BaseException], bool],
    on_oom: Callable[[int], None],
    size_hint: Callable[[T], int] | None = None,
) -> list[R | ItemTooLarge]:
    """Run ``predict`` on ``items``, splitting the batch in halves on out-of-memory errors.

    The whole batch runs first. When it raises an error that ``is_oom`` recognises, the error is
    dropped, ``on_oom(len(failed_batch))`` is called (free the cache and lower the batch cap
    there; it is called once per OOM event, so it also counts them), and the two halves run
    separately, left first, splitting again as needed. An item that runs out of memory on its own
    gets ``ItemTooLarge(index=<its index in items>)``. Any other error propagates at once.

    Example: sizes ``[5, 1, 1, 1]`` with room for 3: ``[5,1,1,1]`` OOM -> ``on_oom(4)``;
    ``[5,1]`` OOM -> ``on_oom(2)``; ``[5]`` OOM -> ``on_oom(1)``, item 0 is too large; ``[1]``
    and ``[1,1]`` fit. Result: ``[ItemTooLarge(0), r1, r2, r3]``.

    Args:
        items: the batch.
        predict: returns one result per item, in order.
        is_oom: recognises an out-of-memory error (``is_torch_oom`` for torch models).
        on_oom: called with the failed batch's size after each OOM, outside the ``except``.
        size_hint: optional measure of an item, copied into ``ItemTooLarge.size_hint``.

    Returns:
        One entry per item, in input order: predict's result or ``ItemTooLarge``.
    """
    results: dict[int, R | ItemTooLarge] = {}
    pending = [(0, len(items))] if items else []
    while pending:
        start, stop = pending.pop()
        outputs = _run(predict, items[start:stop], is_oom)
        if outputs is not None:
            _check_length(outputs, start, stop)
            results.update(zip(range(start, stop), outputs, strict=True))
            continue
        on_oom(stop - start)
        if stop - start == 1:
            results[start] = ItemTooLarge(index=start, size_hint=_hint(items, start, size_hint))
        else:
            middle = (start + stop) // 2
            pending += [(middle, stop), (start, middle)]  # stack: the left half runs first
    return [results[i] for i in range(len(items))]


async def predict_with_oom_split_async(
    items: Sequence[T],
    predict: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
    *,
    is_oom: Callable[[BaseException], bool],
    on_oom: Callable[[int], None],
    size_hint: Callable[[T], int] | None = None,
) -> list[R | ItemTooLarge]:
    """``predict_with_oom_split`` for an async ``predict`` (e.g. one that awaits a thread)."""
    results: dict[int, R | ItemTooLarge] = {}
    pending = [(0, len(items))] if items else []
    while pending:
        start, stop = pending.pop()
        outputs = await _run_async(predict, items[start:stop], is_oom)
        if outputs is not None:
            _check_length(outputs, start, stop)
            results.update(zip(range(start, stop), outputs, strict=True))
            continue
        on_oom(stop - start)
        if stop - start == 1:
            results[start] = ItemTooLarge(index=start, size_hint=_hint(items, start, size_hint))
        else:
            middle = (start + stop) // 2
            pending += [(middle, stop), (start, middle)]
    return [results[i] for i in range(len(items))]
