"""Embeddings as JSON floats: short, and exactly the float32 values the model produced."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from serve_app.adapters.embeddings import float32_json_values

FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@given(st.lists(FLOAT32, min_size=1, max_size=64))
def test_values_give_back_the_float32_vector_exactly(values: list[float]) -> None:
    vec = np.array(values, dtype=np.float32)
    out = float32_json_values(vec)
    parsed = np.array(json.loads(json.dumps(out)), dtype=np.float64).astype(np.float32)
    np.testing.assert_array_equal(parsed, vec)


def test_values_have_at_most_nine_significant_digits() -> None:
    rng = np.random.default_rng(0)
    vec = rng.standard_normal(384).astype(np.float32)
    vec /= np.linalg.norm(vec)
    for text in json.dumps(float32_json_values(vec))[1:-1].split(","):
        digits = text.strip().lstrip("-").split("e")[0].replace(".", "").lstrip("0")
        assert len(digits) <= 9, text
    assert float32_json_values(np.zeros(2, dtype=np.float32)) == [0.0, 0.0]
