"""Warm-up batches: the shapes traffic brings, within the batch cap and the token limit."""

import numpy as np

from serve_app.adapters.base import pow2_sizes
from serve_app.adapters.embeddings import EmbeddingAdapter
from serve_app.adapters.image import ImageClassifierAdapter
from serve_app.config import parse_args


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
