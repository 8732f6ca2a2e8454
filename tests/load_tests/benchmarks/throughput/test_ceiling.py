"""load_tests.benchmarks.throughput.ceiling: the in-process ceiling's CPU preprocessing is
serve_app's, step for step (else its images/s would measure other work)."""

from __future__ import annotations

import numpy as np
import torch

from load_tests import payloads
from load_tests.benchmarks.throughput.ceiling import length_sorted_batches, preprocess_image
from serve_app.adapters.image.backend import ImageClassifier, to_model_input
from serve_app.config.args import parse_args


def test_preprocess_image_is_serve_apps_preprocessing() -> None:
    adapter = ImageClassifier(
        parse_args({"adapter": "image-classification", "load_format": "dummy"})
    )
    for seed in range(2):
        blob = payloads.image_bytes(224, "jpeg", seed)
        item = torch.from_numpy(np.stack([adapter._preprocess(blob, 0)]))
        ours = to_model_input(item, torch.device("cpu"), torch.float32)[0].numpy()
        np.testing.assert_allclose(preprocess_image(blob), ours, atol=1e-5)


def test_length_sorted_batches_cover_every_text_shortest_first() -> None:
    def tok(texts: list[str]) -> dict[str, list[list[int]]]:  # a word a token
        return {"input_ids": [[0] * len(t.split()) for t in texts]}

    texts = ["a b c", "a", "a b c d e", "a b"]
    assert length_sorted_batches(tok, texts, 3) == [["a", "a b", "a b c"], ["a b c d e"]]
    # fewer texts than a batch: repeated to fill it, so the batch size is the one timed
    assert length_sorted_batches(tok, texts[:2], 4) == [["a", "a", "a b c", "a b c"]]
