"""serving.oom: split-and-retry on OOM, item isolation, batch cap lowering."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.serving.oom import (
    ItemTooLarge,
    is_torch_oom,
    lowered_batch_cap,
    predict_with_oom_split,
    predict_with_oom_split_async,
)


class FakeOom(Exception):
    """Stands in for torch.OutOfMemoryError."""


def is_fake_oom(exc: BaseException) -> bool:
    return isinstance(exc, FakeOom)


class Model:
    """Items are ints (their memory size); a batch whose sizes sum above ``limit`` runs out."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls: list[list[int]] = []

    def predict(self, batch: Sequence[int]) -> list[int]:
        self.calls.append(list(batch))
        if sum(batch) > self.limit:
            raise FakeOom(f"batch of {sum(batch)} > {self.limit}")
        return [x * 2 for x in batch]


def run(items: list[int], limit: int) -> tuple[list[int | ItemTooLarge], list[int], Model]:
    model = Model(limit)
    oom_sizes: list[int] = []
    results = predict_with_oom_split(
        items, model.predict, is_oom=is_fake_oom, on_oom=oom_sizes.append
    )
    return results, oom_sizes, model


def test_batch_that_fits_runs_once() -> None:
    results, oom_sizes, model = run([1, 2, 3], limit=6)
    assert results == [2, 4, 6]
    assert oom_sizes == []
    assert model.calls == [[1, 2, 3]]


def test_empty_batch_does_not_call_predict() -> None:
    results, oom_sizes, model = run([], limit=1)
    assert results == []
    assert oom_sizes == []
    assert model.calls == []


def test_oom_splits_into_halves() -> None:
    results, oom_sizes, model = run([1, 1, 1, 1], limit=2)
    assert results == [2, 2, 2, 2]
    assert oom_sizes == [4]
    assert model.calls == [[1, 1, 1, 1], [1, 1], [1, 1]]


def test_single_item_too_large_is_isolated_with_its_index() -> None:
    results, oom_sizes, model = run([5, 1, 1, 1], limit=3)
    assert results == [ItemTooLarge(index=0), 2, 2, 2]
    assert oom_sizes == [4, 2, 1]
    assert model.calls == [[5, 1, 1, 1], [5, 1], [5], [1], [1, 1]]


def test_too_large_item_in_the_middle_keeps_order() -> None:
    results, oom_sizes, _ = run([1, 2, 3, 9, 1, 2, 8], limit=4)
    assert results == [2, 4, 6, ItemTooLarge(index=3), 2, 4, ItemTooLarge(index=6)]
    assert oom_sizes.count(1) == 2


def test_all_items_too_large() -> None:
    results, oom_sizes, _ = run([7, 8, 9], limit=5)
    assert results == [ItemTooLarge(0), ItemTooLarge(1), ItemTooLarge(2)]
    # [7,8,9] -> [7] and [8,9] -> [8], [9]
    assert oom_sizes == [3, 1, 2, 1, 1]


def test_size_hint_is_recorded() -> None:
    model = Model(limit=3)
    results = predict_with_oom_split(
        [1, 5], model.predict, is_oom=is_fake_oom, on_oom=lambda n: None, size_hint=lambda x: x
    )
    assert results == [2, ItemTooLarge(index=1, size_hint=5)]
    too_large = results[1]
    assert isinstance(too_large, ItemTooLarge)
    assert too_large.message == (
        "item 1 (size 5) does not fit in this model's GPU memory budget even on its own; "
        "send a smaller input"
    )


def test_non_oom_error_propagates_without_retry() -> None:
    calls: list[int] = []

    def predict(batch: Sequence[int]) -> list[int]:
        calls.append(len(batch))
        raise KeyError("bad input")

    oom_sizes: list[int] = []
    with pytest.raises(KeyError, match="bad input"):
        predict_with_oom_split([1, 2], predict, is_oom=is_fake_oom, on_oom=oom_sizes.append)
    assert calls == [2]
    assert oom_sizes == []


def test_non_oom_error_after_a_split_propagates() -> None:
    def predict(batch: Sequence[int]) -> list[int]:
        if len(batch) > 1:
            raise FakeOom()
        if batch[0] == 3:
            raise ValueError("item 3 is malformed")
        return list(batch)

    with pytest.raises(ValueError, match="malformed"):
        predict_with_oom_split([1, 2, 3], predict, is_oom=is_fake_oom, on_oom=lambda n: None)


def test_wrong_result_count_is_an_error() -> None:
    with pytest.raises(ValueError, match="returned 1 results for a batch of 2 items"):
        predict_with_oom_split([1, 2], lambda batch: [0], is_oom=is_fake_oom, on_oom=lambda n: None)


def test_exception_and_its_frames_are_released_before_on_oom() -> None:
    class Tensor:
        pass

    refs: list[weakref.ref[Tensor]] = []
    alive_in_on_oom: list[bool] = []

    def predict(batch: Sequence[int]) -> list[int]:
        activations = Tensor()  # a local of the failing frame, pinned by a held traceback
        refs.append(weakref.ref(activations))
        if len(batch) > 1:
            raise FakeOom()
        return list(batch)

    def on_oom(size: int) -> None:
        # No gc.collect(): reference counting alone must free it once the exception is dropped.
        alive_in_on_oom.append(refs[-1]() is not None)

    gc.disable()
    try:
        results = predict_with_oom_split([1, 2], predict, is_oom=is_fake_oom, on_oom=on_oom)
    finally:
        gc.enable()
    assert results == [1, 2]
    assert alive_in_on_oom == [False]


def test_retry_does_not_chain_to_the_oom() -> None:
    # A later error must not carry the dropped OOM as its __context__ (that would pin it).
    def predict(batch: Sequence[int]) -> list[int]:
        if len(batch) > 1:
            raise FakeOom()
        raise ValueError("later")

    with pytest.raises(ValueError) as info:
        predict_with_oom_split([1, 2], predict, is_oom=is_fake_oom, on_oom=lambda n: None)
    assert info.value.__context__ is None


def test_async_variant_matches_sync() -> None:
    model = Model(limit=3)
    oom_sizes: list[int] = []

    async def predict(batch: Sequence[int]) -> list[int]:
        await asyncio.sleep(0)
        return model.predict(batch)

    results = asyncio.run(
        predict_with_oom_split_async(
            [5, 1, 1, 1], predict, is_oom=is_fake_oom, on_oom=oom_sizes.append
        )
    )
    assert results == [ItemTooLarge(index=0), 2, 2, 2]
    assert oom_sizes == [4, 2, 1]


def test_async_variant_propagates_non_oom() -> None:
    async def predict(batch: Sequence[int]) -> list[int]:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        asyncio.run(
            predict_with_oom_split_async([1], predict, is_oom=is_fake_oom, on_oom=lambda n: None)
        )


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=20), max_size=40),
    limit=st.integers(min_value=0, max_value=30),
)
def test_property_items_that_fit_alone_get_answers(sizes: list[int], limit: int) -> None:
    results, oom_sizes, model = run(sizes, limit)
    assert len(results) == len(sizes)
    for index, (size, result) in enumerate(zip(sizes, results, strict=True)):
        if size <= limit:
            assert result == size * 2
        else:
            assert result == ItemTooLarge(index=index)
    too_large = sum(size > limit for size in sizes)
    assert oom_sizes.count(1) == too_large
    # Every call either fitted, isolated one item, or split into exactly two more calls.
    expected_calls = 1 + 2 * (len(oom_sizes) - too_large) if sizes else 0
    assert len(model.calls) == expected_calls


def test_is_torch_oom() -> None:
    assert is_torch_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_torch_oom(torch.cuda.OutOfMemoryError("x"))
    assert is_torch_oom(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert not is_torch_oom(RuntimeError("CUDA error: device-side assert triggered"))
    assert not is_torch_oom(MemoryError("host out of memory"))
    assert not is_torch_oom(ValueError("CUDA out of memory"))


@pytest.mark.parametrize(
    ("current_cap", "failed_batch_size", "expected"),
    [
        (32, 24, 12),
        (32, 32, 16),
        (8, 32, 8),  # never raises the cap
        (32, 3, 1),
        (32, 2, 1),
        (32, 1, 1),  # never below 1
        (1, 1, 1),
    ],
)
def test_lowered_batch_cap(current_cap: int, failed_batch_size: int, expected: int) -> None:
    assert lowered_batch_cap(current_cap, failed_batch_size) == expected


def test_lowered_batch_cap_rejects_non_positive() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        lowered_batch_cap(0, 4)
    with pytest.raises(ValueError, match="must be >= 1"):
        lowered_batch_cap(4, 0)
