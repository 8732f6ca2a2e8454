"""Warm-up batches: the shapes traffic brings, within the batch cap and the token limit."""

import numpy as np
import pytest
import torch

from serve_app.adapters.contract import pow2_sizes
from serve_app.adapters.embeddings.adapter import EmbeddingAdapter
from serve_app.adapters.image.adapter import ImageClassifierAdapter
from serve_app.config.args import parse_args
from serve_app.startup.pipeline import warm_up


def test_pow2_sizes() -> None:
    assert pow2_sizes(1) == [1]
    assert pow2_sizes(8) == [1, 2, 4, 8]
    assert pow2_sizes(12) == [1, 2, 4, 8, 12]


def test_embedding_warmup_covers_lengths_and_batch_sizes() -> None:
    adapter = EmbeddingAdapter(parse_args({"adapter": "embeddings", "max_input_tokens": 100}))
    batches = adapter.warmup_batches(16)
    shapes = {(len(b), len(b[0])) for b in batches}
    assert {len(b) for b in batches} == {1, 2, 4, 8, 16}
    assert {n for _, n in shapes} == {8, 16, 24, 32, 48, 64, 96, 100}
    assert all(len(seq) <= adapter.max_tokens for b in batches for seq in b)


def test_embedding_batches_pad_to_a_multiple_of_8_with_the_same_vectors() -> None:
    adapter = EmbeddingAdapter(parse_args({"adapter": "embeddings"}))
    adapter.setup(__import__("torch").device("cpu"))
    ids = adapter.decode(b'{"input": ["hello there", "a longer sentence to embed"]}', "", {})
    together = adapter.predict(ids.items)
    alone = [adapter.predict([item])[0] for item in ids.items]
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_image_warmup_is_worst_case_items_at_each_size() -> None:
    adapter = ImageClassifierAdapter(
        parse_args({"adapter": "image-classification", "load_format": "dummy", "image_size": 32})
    )
    batches = adapter.warmup_batches(5)
    assert [len(b) for b in batches] == [1, 2, 4, 5]
    assert all(x.shape == (32, 32, 3) and x.dtype == np.uint8 for b in batches for x in b)


class _FakePartition:
    device = "cuda:0"

    def __init__(self) -> None:
        self.frees = 0

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


def test_warm_up_skips_sizes_that_run_out_of_memory(monkeypatch, caplog) -> None:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
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


def test_warm_up_stops_at_its_budget_and_the_rest_runs_step_by_step(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
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
    from serve_app.startup.pipeline import WarmUp

    adapter = EmbeddingAdapter(parse_args({"adapter": "embeddings"}))
    adapter.setup(torch.device("cpu"))
    warm = WarmUp(adapter, _FakePartition(), 16)  # type: ignore[arg-type]
    sizes = [len(b) * len(b[0]) for b in warm.pending]
    assert sizes == sorted(sizes) and len(sizes) == len(adapter.warmup_batches(16))


class _BadWeights(_OomAbove):
    def predict(self, batch: list[int]) -> list[int]:
        raise ValueError("bad weights")


def test_warm_up_re_raises_errors_other_than_oom(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
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


def test_work_between_batches_captures_graphs_first_then_warms_up() -> None:
    """The replica's idle work: every pending graph capture (under the lock that keeps
    check_health's GPU op apart), then the warm-up batches, one step per call."""
    import threading
    from types import SimpleNamespace

    from serve_app.serving.replica import ModelServer

    cls = ModelServer.func_or_class  # type: ignore[attr-defined]
    calls: list[str] = []
    lock = threading.Lock()

    class Graphs:
        pending = 2
        wanted = 0  # pending shapes a batch wanted, at the front

        @property
        def wanted_next(self) -> bool:
            return self.wanted > 0

        def capture_next(self) -> bool:
            assert lock.locked(), "a capture runs under the capture lock"
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
            assert not lock.locked()
            calls.append("warm")
            self.pending.pop(0)
            return bool(self.pending)

    refits: list[str] = []  # each step may load kernels: the partition re-reads its memory
    server = SimpleNamespace(
        adapter=SimpleNamespace(graphs=Graphs()),
        warmup=Warm(),
        _capture_lock=lock,
        partition=SimpleNamespace(refit=lambda why: refits.append(why) or 0),
    )
    server._start_up_left = lambda: cls._start_up_left(server)
    # under load, with nothing wanted: nothing at all
    assert cls._work_between_batches(server, busy=True) is True and calls == []
    assert refits == []
    more = [cls._work_between_batches(server) for _ in range(4)]
    assert calls == ["capture", "capture", "warm", "warm"]
    assert more == [True, True, True, False]
    assert len(refits) == 4


def test_work_between_batches_under_load_captures_only_wanted_shapes() -> None:
    """Busy steps capture the shapes batches wanted (all of them in one step, within
    WANTED_CAPTURE_S) and never run a warm-up batch; an idle step does the rest."""
    import threading
    from types import SimpleNamespace

    from serve_app.serving.replica import ModelServer

    cls = ModelServer.func_or_class  # type: ignore[attr-defined]
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
    server = SimpleNamespace(
        adapter=SimpleNamespace(graphs=graphs),
        warmup=Warm(),
        _capture_lock=threading.Lock(),
        partition=SimpleNamespace(refit=lambda why: 0),
    )
    server._start_up_left = lambda: cls._start_up_left(server)
    assert cls._work_between_batches(server, busy=True) is True
    assert calls == ["capture", "capture"] and graphs.pending == 3  # both wanted, no more
    assert cls._work_between_batches(server, busy=True) is True and len(calls) == 2
    assert cls._work_between_batches(server, busy=False) is True
    assert calls == ["capture"] * 3
