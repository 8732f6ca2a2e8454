"""load_tests.benchmarks.throughput.peers: the peers' request parse, answer and batch split,
and the model itself on the CPU (the real tokenizer and BERT-6x384, random weights)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from load_tests.benchmarks.throughput.payload import model_payload
from load_tests.benchmarks.throughput.peers import (
    Embedder,
    RequestError,
    parse_request,
    response_doc,
    split,
)


def test_parse_request_takes_the_benchmarks_payloads() -> None:
    one = json.loads(model_payload("minilm", 1).body)
    many = json.loads(model_payload("minilm", 16, "base64").body)
    assert parse_request(one) == ([one["input"]], "float")
    texts, fmt = parse_request(many)
    assert len(texts) == 16 and fmt == "base64"


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        ([], "JSON object"),
        ({}, "'input'"),
        ({"input": []}, "'input'"),
        ({"input": ["a", 3]}, "'input'"),
        ({"input": "a", "encoding_format": "int8"}, "'encoding_format'"),
    ],
)
def test_parse_request_names_the_bad_field(doc: object, names: str) -> None:
    with pytest.raises(RequestError, match=names):
        parse_request(doc)


def test_response_doc_is_openai_shaped_in_floats_or_base64() -> None:
    vectors = np.array([[0.6, 0.8], [1.0, 0.0]], dtype=np.float32)
    doc = response_doc(vectors, "float", "m", 7)
    assert doc["object"] == "list" and doc["model"] == "m"
    assert doc["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [d["index"] for d in doc["data"]] == [0, 1]
    assert doc["data"][0]["embedding"] == pytest.approx([0.6, 0.8])
    b64 = response_doc(vectors, "base64", "m", 7)["data"][1]["embedding"]
    assert np.frombuffer(base64.b64decode(b64), dtype="<f4").tolist() == [1.0, 0.0]
    json.dumps(doc)  # plain JSON types only


def test_split_cuts_a_batch_back_into_requests() -> None:
    assert split([1, 2, 3, 4, 5, 6], [1, 3, 2]) == [[1], [2, 3, 4], [5, 6]]
    with pytest.raises(ValueError):
        split([1, 2, 3], [1, 1])


def test_the_embedder_gives_unit_vectors_that_do_not_depend_on_the_batch() -> None:
    emb = Embedder("cpu")
    texts = ["a short query", "a somewhat longer passage about serving models on one GPU"]
    both, tokens = emb.embed(texts)
    alone, _ = emb.embed(texts[:1])
    assert both.shape == (2, 384) and both.dtype == np.float32
    assert np.linalg.norm(both, axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)
    assert tokens[0] < tokens[1]
    # Padding the short text to the long one's length leaves its vector as it was.
    assert both[0] == pytest.approx(alone[0], abs=1e-5)
