"""Warm-up batches: the shapes traffic brings, within the batch cap and the token limit."""

import numpy as np
import pytest
import torch

from serve_app.adapters import embeddings
from serve_app.adapters.contract import pow2_sizes
from serve_app.adapters.embeddings.backend import SentenceEncoder
from serve_app.adapters.image.backend import ImageClassifier
from serve_app.config.args import parse_args
from serve_app.startup.warmup import WarmUp, warm_up


def test_pow2_sizes() -> None:
    assert pow2_sizes(1) == [1]
    assert pow2_sizes(8) == [1, 2, 4, 8]
    assert pow2_sizes(12) == [1, 2, 4, 8, 12]


def test_embedding_warmup_covers_lengths_and_batch_sizes() -> None:
    adapter = SentenceEncoder(parse_args({"adapter": "embeddings", "max_input_tokens": 100}))
    batches = adapter.warmup_batches(16)
    shapes = {(len(b), len(b[0])) for b in batches}
    assert {len(b) for b in batches} == {1, 2, 4, 8, 16}
    assert {n for _, n in shapes} == {8, 16, 24, 32, 48, 64, 96, 100}
    assert all(len(seq) <= adapter.max_tokens for b in batches for seq in b)


def test_embedding_batches_pad_to_a_multiple_of_8_with_the_same_vectors() -> None:
    model = embeddings.build(parse_args({"adapter": "embeddings"}))
    adapter = model.backend
    adapter.setup(torch.device("cpu"))
    ids = model.decode(b'{"input": ["hello there", "a longer sentence to embed"]}', "", {})
    together = adapter.predict(ids.items)
    alone = [adapter.predict([item])[0] for item in ids.items]
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_image_warmup_is_worst_case_items_at_each_size() -> None:
    adapter = ImageClassifier(
        parse_args({"adapter": "image-classification", "load_format": "dummy", "image_size": 32})
    )
    batches = adapter.warmup_batches(5)
    assert [len(b) for b in batches] == [1, 2, 4, 5]
    assert all(x.shape == (32, 32, 3) and x.dtype == np.uint8 for b in batches for x in b)


class _FakeMemory:
    def synchronize(self) -> None:
        pass

    def reset_peak(self) -> None:
        pass


class _FakePartition:
    device = "cuda:0"

    def __init__(self) -> None:
        self.frees = 0
        self.memory = _FakeMemory()

    def free_cache(self, count: bool = True) -> None:
        self.frees += 1


class _OomAbove:
    """An adapter whose batches of ``limit`` or more inputs run out of GPU memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.ran: list[int] = []

    def warmup_batches(self, max_batch_size: int) -> list[list[int]]:
        return [[0] * b for _ in range(2) for b in pow2_sizes(max_batch_size)]

    def predict(self, batch: list[int]) -> list[int]:
        if len(batch) >= self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        self.ran.append(len(batch))
        return batch


def test_warm_up_skips_sizes_that_run_out_of_memory(caplog) -> None:
    adapter, part = _OomAbove(limit=8), _FakePartition()
    warm = warm_up(adapter, part, 32)  # type: ignore[arg-type]
    # smallest first: 1, 2, 4 twice each; 8 fails once and 8+ are never tried again
    assert adapter.ran == [1, 1, 2, 2, 4, 4]
    assert warm.describe()["ran"] == 6 and warm.too_big == 8 and not warm.pending
    assert part.frees >= 2  # after the OOM, and at the end
    assert "batches of 8 inputs ran out of memory" in caplog.text


class _Slow(_OomAbove):
    def predict(self, batch: list[int]) -> list[int]:
        import time

        time.sleep(0.02)
        return super().predict(batch)


def test_warm_up_stops_at_its_budget_and_the_rest_runs_step_by_step() -> None:
    adapter, part = _Slow(limit=1000), _FakePartition()
    warm = warm_up(adapter, part, 32, budget_s=0.07)  # type: ignore[arg-type]
    # 0.02 s or more each: at most 3 fit, the smallest first
    assert 1 <= len(adapter.ran) <= 3 and adapter.ran == [1, 1, 2][: len(adapter.ran)]
    left = len(warm.pending)
    assert left == 12 - len(adapter.ran)
    steps = [warm.step() for _ in range(left)]
    assert steps == [True] * (left - 1) + [False]
    assert adapter.ran == [1, 1, 2, 2, 4, 4, 8, 8, 16, 16, 32, 32]
    assert warm.step() is False  # nothing left: a no-op


def test_embedding_warmup_runs_smallest_shapes_first() -> None:
    adapter = SentenceEncoder(parse_args({"adapter": "embeddings"}))
    adapter.setup(torch.device("cpu"))
    warm = WarmUp(adapter, _FakePartition(), 16)  # type: ignore[arg-type]
    sizes = [len(b) * len(b[0]) for b in warm.pending]
    assert sizes == sorted(sizes) and len(sizes) == len(adapter.warmup_batches(16))


class _BadWeights(_OomAbove):
    def predict(self, batch: list[int]) -> list[int]:
        raise ValueError("bad weights")


def test_warm_up_re_raises_errors_other_than_oom() -> None:
    with pytest.raises(ValueError, match="bad weights"):
        warm_up(_BadWeights(limit=1), _FakePartition(), 4)  # type: ignore[arg-type]


def test_phase_timer_times_each_phase_and_the_total() -> None:
    import time

    from serve_app.startup.pipeline import PhaseTimer

    timer = PhaseTimer()
    with timer("weights"):
        time.sleep(0.02)
    with timer("warmup"):
        pass
    phases = timer.done()
    assert phases["process"] >= 0.0 and phases["weights"] >= 0.02 and phases["warmup"] >= 0.0
    assert phases["imports"] >= 0.0
    parts = phases["process"] + phases["imports"] + phases["weights"] + phases["warmup"]
    assert abs(phases["total"] - parts) <= 0.003  # rounding of each part to 1 ms
