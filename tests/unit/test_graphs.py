"""CUDA graph buckets, and the adapters' graph path run through a CPU stand-in of GraphSet.

The stand-in keeps GraphSet's contract (static input buffers of the bucket's rows, stale rows
past the batch, outputs sliced to the batch) but calls the forward pass instead of replaying a
graph, so these tests check what the adapters send into a graph and take out of it: the padding
to a bucket, and that the vectors and scores are the eager ones. tests/gpu/test_cuda_graphs_gpu.py
checks real graphs on a GPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from serve_app.adapters.embeddings import GRAPH_LENGTHS, EmbeddingAdapter
from serve_app.adapters.image import ImageClassifierAdapter
from serve_app.config import parse_args
from serve_app.errors import ConfigError
from serve_app.graphs import bucket_for, graph_batch_sizes

Tensors = tuple[torch.Tensor, ...]


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
    assert args.cuda_graphs is True and args.cuda_graph_max_batch_size == 64
    with pytest.raises(ConfigError, match="cuda_graph_max_batch_size"):
        parse_args({"cuda_graph_max_batch_size": 0})


class CpuGraphSet:
    """GraphSet's contract on the CPU: static buffers with stale rows, forward called on them."""

    def __init__(self, forward: Callable[..., Tensors]):
        self.forward = forward
        self.static: dict[Hashable, Tensors] = {}
        self.runs: list[tuple[Hashable, int]] = []

    def capture_all(self, examples: Sequence[tuple[Hashable, Tensors]]) -> list[Hashable]:
        for key, example in examples:
            # stale rows: whatever a previous batch left (here: random ids / noise)
            self.static[key] = tuple(
                torch.randint_like(t, 1000, 2000) if t.dtype == torch.long else t.clone()
                for t in example
            )
        return []

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


def _with_cpu_graphs(adapter: Any, monkeypatch: pytest.MonkeyPatch, module: str) -> CpuGraphSet:
    holder: dict[str, CpuGraphSet] = {}

    def make(forward: Callable[..., Tensors], device: torch.device) -> CpuGraphSet:
        holder["set"] = CpuGraphSet(forward)
        return holder["set"]

    monkeypatch.setattr(f"serve_app.adapters.{module}.GraphSet", make)
    adapter.capture_graphs(8)
    return holder["set"]


def test_embeddings_graph_path_pads_to_buckets_and_matches_eager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    adapter = EmbeddingAdapter(parse_args({"adapter": "embeddings"}))
    adapter.setup(torch.device("cpu"))
    texts = ["hello there", "a longer sentence to embed, with a few more words in it", "hi"]
    items = adapter.decode(json.dumps({"input": texts}).encode(), "", {})
    eager = adapter.predict(items.items)
    graphs = _with_cpu_graphs(adapter, monkeypatch, "embeddings")
    assert set(graphs.static) == {(b, n) for b in (1, 2, 4, 8) for n in GRAPH_LENGTHS}
    graphed = adapter.predict(items.items)
    longest = max(len(ids) for ids in items.items)
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


def test_image_graph_path_pads_to_buckets_and_matches_eager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    adapter = ImageClassifierAdapter(
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
