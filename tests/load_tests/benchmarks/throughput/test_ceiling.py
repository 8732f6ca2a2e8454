"""load_tests.benchmarks.throughput.ceiling: the in-process ceiling's CPU preprocessing is
serve_app's, step for step (else its images/s would measure other work)."""

from __future__ import annotations

import numpy as np
import torch

from load_tests import payloads
from load_tests.benchmarks.throughput.ceiling import preprocess_image
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
