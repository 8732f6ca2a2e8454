"""CUDA graph buckets, and the adapters' graph path run through a CPU stand-in of GraphSet.

The stand-in keeps GraphSet's contract (static input buffers of the bucket's rows, stale rows
past the batch, outputs sliced to the batch) but calls the forward pass instead of replaying a
graph, so these tests check what the adapters send into a graph and take out of it: the padding
to a bucket, and that the vectors and scores are the eager ones. tests/gpu/test_cuda_graphs_gpu.py
checks real graphs on a GPU.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from serve_app.adapters import embeddings
from serve_app.adapters.embeddings.backend import GRAPH_LENGTHS
from serve_app.adapters.image.backend import ImageClassifier
from serve_app.config.args import parse_args
from serve_app.errors import ConfigError
from serve_app.gpu.graphs import (
    GraphCaptureError,
    GraphMemory,
    GraphSet,
    bucket_for,
    graph_batch_limit,
    graph_batch_sizes,
)
from serve_app.gpu.snapshot import DeviceMemory

Tensors = tuple[torch.Tensor, ...]
CPU_MEMORY = GraphMemory(DeviceMemory(torch.device("cpu")))


def test_graph_batch_sizes() -> None:
    assert graph_batch_sizes(0) == []
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(8) == [1, 2, 4, 8]
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]
    assert graph_batch_sizes(40) == [1, 2, 4, 8, 12, 16, 24, 32, 40]
    assert graph_batch_sizes(100) == [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 100]


def test_padding_to_a_bucket_adds_less_than_half_above_eight() -> None:
    sizes = graph_batch_sizes(256)
    for n in range(9, 257):
        bucket = bucket_for(n, sizes)
        assert bucket is not None and n <= bucket < n * 1.5, (n, bucket)


def test_bucket_for() -> None:
    assert bucket_for(1, [1, 2, 4]) == 1
    assert bucket_for(3, [1, 2, 4]) == 4
    assert bucket_for(5, [1, 2, 4]) is None
    assert bucket_for(3, []) is None


def test_config_fields() -> None:
    args = parse_args({})
    assert args.cuda_graphs is True and args.cuda_graph_max_batch_size is None
    with pytest.raises(ConfigError, match="cuda_graph_max_batch_size"):
        parse_args({"cuda_graph_max_batch_size": 0})


def test_graph_batch_limit_defaults_by_family() -> None:
    # Text batches of short inputs reach the calibration cap; images stay at 64.
    assert graph_batch_limit(parse_args({"adapter": "embeddings"})) == 256
    assert graph_batch_limit(parse_args({"adapter": "rerank"})) == 256
    text = {"adapter": "text-classification", "memory": {"calibration_max_batch_size": 512}}
    assert graph_batch_limit(parse_args(text)) == 512
    assert graph_batch_limit(parse_args({"adapter": "image-classification"})) == 64
    # An explicit limit wins, within max_batch_size.
    assert graph_batch_limit(parse_args({"cuda_graph_max_batch_size": 128})) == 128
    assert graph_batch_limit(parse_args({"max_batch_size": 32})) == 32
    images = {"adapter": "image-classification", "cuda_graph_max_batch_size": 128}
    assert graph_batch_limit(parse_args({**images, "max_batch_size": 96})) == 96


class CpuGraphSet(GraphSet):
    """GraphSet on the CPU: its own ordering, budget and pending queue (``capture_all``,
    ``capture_next``), but ``capture`` keeps static buffers with stale rows and ``run`` calls
    the forward pass on them. ``capture_s_each`` (when set) is how long each capture takes."""

    def __init__(self, forward: Callable[..., Tensors], capture_s_each: float = 0.0):
        super().__init__(forward, CPU_MEMORY)
        self.static: dict[Hashable, Tensors] = {}
        self.order: list[Hashable] = []
        self.runs: list[tuple[Hashable, int]] = []
        self.capture_s_each = capture_s_each

    def capture(self, key: Hashable, example: Tensors) -> None:
        if self.capture_s_each:
            time.sleep(self.capture_s_each)
        # stale rows: whatever a previous batch left (here: random ids / noise)
        self.static[key] = tuple(
            torch.randint_like(t, 1000, 2000) if t.dtype == torch.long else t.clone()
            for t in example
        )
        self.order.append(key)

    def __len__(self) -> int:
        return len(self.static)

    def has(self, key: Hashable) -> bool:
        return key in self.static

    def run(self, key: Hashable, inputs: Tensors) -> Tensors:
        rows = inputs[0].shape[0]
        static = self.static[key]
        for dst, src in zip(static, inputs, strict=True):
            assert dst.shape[1:] == src.shape[1:], (dst.shape, src.shape)
            dst[:rows].copy_(src)
        self.runs.append((key, rows))
        with torch.inference_mode():
            return tuple(out[:rows] for out in self.forward(*static))


def _with_cpu_graphs(
    adapter: Any, monkeypatch: pytest.MonkeyPatch, module: str, budget_s: float | None = None
) -> CpuGraphSet:
    holder: dict[str, CpuGraphSet] = {}

    def make(forward: Callable[..., Tensors], memory: GraphMemory) -> CpuGraphSet:
        assert memory.limit_bytes is None  # no budget in these tests
        holder["set"] = CpuGraphSet(forward, capture_s_each=0.01 if budget_s is not None else 0)
        return holder["set"]

    monkeypatch.setattr(f"serve_app.adapters.{module}.backend.GraphSet", make)
    adapter.capture_graphs(8, budget_s, CPU_MEMORY)
    return holder["set"]


def _examples(sizes: Sequence[int]) -> list[tuple[Hashable, Tensors]]:
    return [(b, (torch.zeros((b, 3)),)) for b in sizes]


def test_capture_all_captures_largest_first_within_the_budget() -> None:
    graphs = CpuGraphSet(lambda x: (x,), capture_s_each=0.02)
    graphs.capture_all(_examples([1, 2, 4, 8, 16, 32, 64, 128, 256, 512]), budget_s=0.09)
    # 0.02 s each (at least: sleep overruns on a busy machine): a capture starts only if it
    # should end within 0.09 s, so 4 at most, and never fewer than 1
    n = graphs.captured_at_start
    assert 1 <= n <= 4 and graphs.order == [512, 256, 128, 64][:n], graphs.order
    assert graphs.pending == 10 - n
    described = graphs.describe()
    assert described["graphs_at_start"] == n and described["pending"] == 10 - n
    more = [graphs.capture_next() for _ in range(10 - n)]
    assert more == [True] * (9 - n) + [False]
    assert graphs.order == [512, 256, 128, 64, 32, 16, 8, 4, 2, 1]
    assert graphs.capture_next() is False and graphs.pending == 0


def test_capture_all_without_a_budget_captures_everything_and_zero_defers_all() -> None:
    graphs = CpuGraphSet(lambda x: (x,))
    graphs.capture_all(_examples([4, 1, 2]))
    assert graphs.order == [4, 2, 1] and graphs.pending == 0
    deferred = CpuGraphSet(lambda x: (x,))
    deferred.capture_all(_examples([4, 1, 2]), budget_s=0.0)
    assert deferred.order == [] and deferred.pending == 3 and deferred.captured_at_start == 0


def test_want_puts_a_pending_shape_first_once() -> None:
    graphs = CpuGraphSet(lambda x: (x,))
    graphs.capture_all(_examples([1, 2, 4, 8, 16]), budget_s=0.0)
    assert not graphs.wanted_next
    graphs.want(2)
    graphs.want(99)  # not a shape of this set: nothing happens
    assert graphs.wanted_next and graphs.pending == 5
    graphs.want(4)
    assert graphs.capture_next() and graphs.capture_next()
    assert graphs.order == [4, 2] and not graphs.wanted_next
    graphs.want(2)  # captured already
    while graphs.capture_next():
        pass
    assert graphs.order == [4, 2, 16, 8, 1]


def test_capture_next_skips_out_of_memory_and_stops_on_other_errors() -> None:
    class Failing(CpuGraphSet):
        def capture(self, key: Hashable, example: Tensors) -> None:
            if key == 4:
                raise GraphCaptureError("no room", out_of_memory=True)
            if key == 2:
                raise GraphCaptureError("host sync inside the forward pass")
            super().capture(key, example)

    graphs = Failing(lambda x: (x,))
    graphs.capture_all(_examples([8, 4, 2, 1]), budget_s=0.0)
    assert graphs.capture_next() is True  # 8
    assert graphs.capture_next() is True and graphs.skipped == [4]
    with pytest.raises(GraphCaptureError, match="host sync"):
        graphs.capture_next()
    assert graphs.pending == 0 and graphs.order == [8]  # nothing more is tried


def test_config_startup_budget() -> None:
    assert parse_args({}).cuda_graph_startup_budget_s == 5.0
    assert parse_args({"cuda_graph_startup_budget_s": 0}).cuda_graph_startup_budget_s == 0.0
    with pytest.raises(ConfigError, match="cuda_graph_startup_budget_s"):
        parse_args({"cuda_graph_startup_budget_s": -1})


def test_embeddings_graph_path_pads_to_buckets_and_matches_eager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = embeddings.build(parse_args({"adapter": "embeddings"}))
    adapter = model.backend
    adapter.setup(torch.device("cpu"))
    texts = ["hello there", "a longer sentence to embed, with a few more words in it", "hi"]
    items = model.decode(json.dumps({"input": texts}).encode(), "", {})
    eager = adapter.predict(items.items)
    graphs = _with_cpu_graphs(adapter, monkeypatch, "embeddings")
    assert set(graphs.static) == {(b, n) for b in (1, 2, 4, 8) for n in GRAPH_LENGTHS}
    graphed = adapter.predict(items.items)
    longest = max(len(it.ids) for it in items.items)  # tokenized by the batch
    assert graphs.runs == [((4, bucket_for(longest, GRAPH_LENGTHS)), 3)]
    for a, b in zip(eager, graphed, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # a batch past the largest bucket runs eagerly
    many = [items.items[0]] * 9
    assert len(adapter.predict(many)) == 9 and len(graphs.runs) == 1
    # an input past the longest captured length runs eagerly
    long_item = [[101, *([1000] * (GRAPH_LENGTHS[-1] + 5)), 102]]
    adapter.predict(long_item)
    assert len(graphs.runs) == 1


def _small_resnet() -> ImageClassifier:
    """ResNet-18 on 32 x 32 crops, random weights, on the CPU."""
    adapter = ImageClassifier(
        parse_args(
            {
                "adapter": "image-classification",
                "load_format": "dummy",
                "arch": "resnet18",
                "image_size": 32,
            }
        )
    )
    adapter.setup(torch.device("cpu"))
    return adapter


def test_image_graph_path_pads_to_buckets_and_matches_eager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    adapter = _small_resnet()
    rng = np.random.default_rng(0)
    items = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(3)]
    eager = adapter.predict(items)
    graphs = _with_cpu_graphs(adapter, monkeypatch, "image")
    assert set(graphs.static) == {1, 2, 4, 8}
    graphed = adapter.predict(items)
    assert graphs.runs == [(4, 3)]
    for (s1, c1), (s2, c2) in zip(eager, graphed, strict=True):
        np.testing.assert_array_equal(c1[:5], c2[:5])
        np.testing.assert_allclose(s1, s2, atol=1e-5)
    assert len(adapter.predict(items * 3)) == 9 and len(graphs.runs) == 1  # 9 > 8: eager


def test_embeddings_shapes_left_pending_run_eagerly_until_captured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = embeddings.build(parse_args({"adapter": "embeddings"}))
    adapter = model.backend
    adapter.setup(torch.device("cpu"))
    items = model.decode(json.dumps({"input": ["hello there", "hi"]}).encode(), "", {})
    graphs = _with_cpu_graphs(adapter, monkeypatch, "embeddings", budget_s=0.0)
    assert graphs.pending == 4 * len(GRAPH_LENGTHS) and not graphs.static
    eager = adapter.predict(items.items)
    assert graphs.runs == []  # nothing captured yet: eager
    # the shape that batch needed is captured first, not in its largest-first turn
    assert graphs.wanted_next
    graphs.capture_next()
    assert graphs.order == [(2, 8)] and not graphs.wanted_next
    while graphs.capture_next():
        pass
    graphed = adapter.predict(items.items)
    assert len(graphs.runs) == 1 and graphs.runs[0][0][0] == 2
    for a, b in zip(eager, graphed, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_image_pads_to_a_captured_bucket_while_smaller_ones_are_pending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    adapter = _small_resnet()
    graphs = _with_cpu_graphs(adapter, monkeypatch, "image", budget_s=0.0)
    rng = np.random.default_rng(0)
    items = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(3)]
    adapter.predict(items)
    assert graphs.runs == []  # nothing captured: eager
    assert graphs.wanted_next  # 4, which that batch needed, is captured first
    graphs.capture_next()
    assert graphs.order == [4]
    adapter.predict(items[:1])
    assert graphs.runs == [(4, 1)]  # 1 pads up to 4 while 1 is pending, and wants 1
    assert graphs.wanted_next
    while graphs.capture_next():
        pass
    assert graphs.order == [4, 1, 8, 2]  # then largest first
    adapter.predict(items)
    assert graphs.runs[-1] == (4, 3)


class _Graphs:
    """has/want of a GraphSet, for text_batch_shape (the graph path itself: test_rerank.py)."""

    def __init__(self, captured: set[tuple[int, int]]):
        self.captured, self.wanted = captured, []

    def has(self, key):
        return key in self.captured

    def want(self, key):
        self.wanted.append(key)


def test_text_batch_shape_replays_a_captured_bucket_and_asks_for_a_missing_one() -> None:
    from serve_app.gpu.graphs import text_batch_shape

    g = _Graphs({(4, 32)})
    shape = (g, [1, 2, 4, 8], [16, 32, 64])
    assert text_batch_shape(*shape, 3, 20, 512, 8) == ((4, 32), 32)  # padded to the graph's width
    assert g.wanted == []
    assert text_batch_shape(*shape, 5, 20, 512, 8) == (None, 24)  # eager: rounded up to 8
    assert g.wanted == [(8, 32)]  # captured next, between batches
    assert text_batch_shape(*shape, 3, 100, 512, 8) == (None, 104)  # past every length bucket
    assert text_batch_shape(None, [1], [16], 1, 13, 14, 8) == (None, 14)  # within the positions
