"""load_tests.benchmarks.throughput.payload: the request bodies and the no-op's answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from load_tests.benchmarks.throughput.payload import MIXED_BODIES, model_payload, noop_payload


def test_payloads() -> None:
    raw = model_payload("resnet50", 1)
    assert raw.content_type == "image/jpeg" and raw.body[:2] == b"\xff\xd8"
    assert 10_000 < len(raw.body) < 30_000 and raw.path == "/v1/classify"
    many = json.loads(model_payload("resnet50", 3).body)
    assert len(many["input"]) == 3 and many["model"] == "resnet50"
    text = json.loads(model_payload("minilm", 1).body)
    assert isinstance(text["input"], str) and 3 <= len(text["input"].split()) <= 8
    assert text["model"] == "all-MiniLM-L6-v2" and "encoding_format" not in text
    b64 = json.loads(model_payload("minilm", 16, "base64").body)
    assert len(b64["input"]) == 16 and b64["encoding_format"] == "base64"
    assert noop_payload().body == b"{}"
    # The no-op's answers are shaped like serve_app's: 384 shortest float32 per text.
    vectors = json.loads(model_payload("minilm", 2).response)["data"]
    assert [len(v["embedding"]) for v in vectors] == [384, 384]
    assert sum(x * x for x in vectors[0]["embedding"]) == pytest.approx(1.0, abs=1e-5)
    b64 = json.loads(model_payload("minilm", 1, "base64").response)["data"][0]["embedding"]
    assert len(b64) == 2048  # base64 of 384 float32
    tops = json.loads(model_payload("resnet50", 3).response)["data"]
    assert [len(t["top_k"]) for t in tops] == [5, 5, 5]
    with pytest.raises(ValueError):
        model_payload("gpt", 1)


def test_the_mixed_workload_is_64_seeded_bodies_with_their_mean_tokens(tmp_path: Path) -> None:
    from load_tests.harness.bodies import read_bodies
    from load_tests.workloads.texts import request_texts, token_counts

    p = model_payload("minilm", 4, workload="mixed")
    assert p.key == "minilm-x4-mixed-float" and p.workload == "mixed"
    assert len(p.bodies) == MIXED_BODIES and p.body == p.bodies[0]
    docs = [json.loads(b) for b in p.bodies]
    assert [d["input"] for d in docs] == request_texts("mixed", MIXED_BODIES, 4, 0)
    assert list(p.texts) == [t for d in docs for t in d["input"]]
    assert p.tokens_per_request == sum(token_counts(p.texts)) / MIXED_BODIES
    path = p.write(tmp_path)
    assert path.name == "minilm-x4-mixed-float.bodies" and read_bodies(path) == list(p.bodies)
    one = model_payload("minilm", 1, workload="mixed")
    assert isinstance(json.loads(one.body)["input"], str) and len(one.texts) == MIXED_BODIES
    short = model_payload("minilm", 2)
    assert short.all_bodies == (short.body,) and short.write(tmp_path).suffix == ".body"
    assert short.tokens_per_request == sum(token_counts(short.texts))
    assert model_payload("resnet50", 1).tokens_per_request is None
    with pytest.raises(ValueError, match="text models"):
        model_payload("resnet50", 1, workload="mixed")
