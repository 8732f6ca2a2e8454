"""The text classifier end to end without Ray, on a random-weight three-label classifier built
from the packaged MiniLM's config (tests/fixtures/text_models.py): logits against transformers'
AutoModelForSequenceClassification on the same weights, TEI's /predict shapes, and every refused
request."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from serve_app.adapters import textclass
from serve_app.adapters.contract import Model
from serve_app.config.args import parse_args
from serve_app.errors import BadRequest, ItemError, NotFound
from tests.fixtures.text_models import classifier_dir

# float32 on the CPU, serve_app's BERT against transformers': measured differences ~1e-6.
LOGIT_ATOL = 1e-4
LABELS = ["negative", "neutral", "positive"]
TEXTS = ["I love this film.", "The service was slow and the food was cold.", "ok"]
PAIRS = [("A man is eating.", "Someone is having a meal."), ("It rains.", "The sun is out.")]


@pytest.fixture(scope="module")
def cls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return classifier_dir(tmp_path_factory.mktemp("cls") / "classifier", LABELS, layers=3, seed=1)


@pytest.fixture(scope="module")
def model(cls_dir: Path) -> Model:
    args = {"adapter": "text-classification", "model_path": str(cls_dir)}
    built = textclass.build(parse_args({**args, "max_inputs_per_request": 8}))
    built.backend.setup(torch.device("cpu"))
    return built


def run(model: Model, doc: dict) -> list:
    decoded = model.decode(json.dumps(doc).encode(), "application/json", {})
    out = model.encode(model.backend.predict(decoded.items), decoded)
    assert isinstance(out, list)
    return out


def reference_logits(path: Path, texts: list, pairs: list) -> np.ndarray:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    hf = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    tok = AutoTokenizer.from_pretrained(str(path))
    with torch.no_grad():
        single = hf(**tok(texts, padding=True, return_tensors="pt")).logits
        a, b = zip(*pairs, strict=True)
        paired = hf(**tok(list(a), list(b), padding=True, return_tensors="pt")).logits
    return torch.cat([single, paired]).numpy()


def test_logits_equal_transformers(model: Model, cls_dir: Path) -> None:
    batch = [[t] for t in TEXTS] + [list(p) for p in PAIRS]
    out = run(model, {"inputs": batch, "raw_scores": True})
    expected = reference_logits(cls_dir, TEXTS, PAIRS)
    assert np.ptp(expected, axis=1).min() > 0.1  # the weights tell labels apart
    got = np.array([[{p["label"]: p["score"] for p in row}[n] for n in LABELS] for row in out])
    np.testing.assert_allclose(got, expected, atol=LOGIT_ATOL)
    for row in out:  # every label, highest first
        assert [p["score"] for p in row] == sorted((p["score"] for p in row), reverse=True)
        assert sorted(p["label"] for p in row) == sorted(LABELS)


def test_scores_are_a_softmax_and_top_k_keeps_the_best(model: Model, cls_dir: Path) -> None:
    logits = reference_logits(cls_dir, TEXTS[:1], PAIRS[:1])
    probs = torch.softmax(torch.from_numpy(logits), dim=1).numpy()
    single = run(model, {"inputs": TEXTS[0]})  # a single input: one list of predictions
    assert [p["label"] for p in single] == [LABELS[i] for i in np.argsort(-probs[0])]
    np.testing.assert_allclose([p["score"] for p in single], np.sort(probs[0])[::-1], atol=1e-5)
    pair = run(model, {"inputs": list(PAIRS[0]), "top_k": 1})  # a flat pair, as TEI reads it
    assert pair == [
        {
            "label": LABELS[int(np.argmax(probs[1]))],
            "score": pytest.approx(probs[1].max(), abs=1e-5),
        }
    ]
    one = run(model, {"inputs": [TEXTS[0]], "top_k": 1000})
    assert one == single
    batch = run(model, {"inputs": [[TEXTS[0]], list(PAIRS[0])], "top_k": 2})
    alone = [single[:2], run(model, {"inputs": list(PAIRS[0])})[:2]]
    for got, want in zip(batch, alone, strict=True):  # padded with each other: ~1e-7 apart
        assert [p["label"] for p in got] == [p["label"] for p in want]
        np.testing.assert_allclose([p["score"] for p in got], [p["score"] for p in want], atol=1e-5)


def test_multi_label_models_get_a_sigmoid_per_label(cls_dir: Path, tmp_path: Path) -> None:
    multi = classifier_dir(
        tmp_path / "multi",
        LABELS,
        layers=1,
        extra_config={"problem_type": "multi_label_classification"},
    )
    built = textclass.build(
        parse_args({"adapter": "text-classification", "model_path": str(multi)})
    )
    built.backend.setup(torch.device("cpu"))
    raw = run(built, {"inputs": TEXTS[1], "raw_scores": True})
    scores = run(built, {"inputs": TEXTS[1]})
    expect = {p["label"]: 1 / (1 + np.exp(-p["score"])) for p in raw}
    assert {p["label"]: p["score"] for p in scores} == pytest.approx(expect, abs=1e-6)
    assert sum(p["score"] for p in scores) != pytest.approx(1.0)


def test_labels_come_from_id2label(model: Model) -> None:
    assert model.backend.describe()["labels"] == LABELS
    assert model.backend.describe()["task"] == "text-classification"


def body(doc: object) -> bytes:
    return json.dumps(doc).encode()


def decode_and_batch(model: Model, raw: bytes) -> list:
    """What the replica does: decode on the loop, then the batch (tokenizing it); the first
    ItemError is the request's 4xx."""
    decoded = model.decode(raw, "application/json", {})
    outputs = model.backend.predict(decoded.items)
    for out in outputs:
        if isinstance(out, ItemError):
            raise out.error
    return outputs


@pytest.mark.parametrize(
    ("doc", "exc", "needle", "param"),
    [
        ({}, BadRequest, "'inputs' is required", "inputs"),
        ({"inputs": []}, BadRequest, "a string, a sequence or a batch", "inputs"),
        ({"inputs": 3}, BadRequest, "a string, a sequence or a batch", "inputs"),
        ({"inputs": ["a", "b", "c"]}, BadRequest, "one or two strings, got 3 items", "inputs"),
        ({"inputs": [[]]}, BadRequest, "got 0 items", "inputs[0]"),
        ({"inputs": [["a", "b", "c"]]}, BadRequest, "got 3 items", "inputs[0]"),
        ({"inputs": [["a"], ["b", "c", "d"]]}, BadRequest, "got 3 items", "inputs[1]"),
        ({"inputs": [["a"], "b"]}, BadRequest, "got str", "inputs[1]"),
        ({"inputs": ["a", ["b"]]}, BadRequest, "'inputs[1]' must be a string", "inputs[1]"),
        ({"inputs": [["a", 2]]}, BadRequest, "'inputs[0][1]' must be a string", "inputs[0][1]"),
        ({"inputs": [["a"]] * 9}, BadRequest, "at most 8", "inputs"),
        ({"inputs": "a", "top_k": 0}, BadRequest, "between 1 and 1000", "top_k"),
        ({"inputs": "a", "top_k": 1001}, BadRequest, "between 1 and 1000", "top_k"),
        ({"inputs": "a", "top_k": "2"}, BadRequest, "must be an integer", "top_k"),
        ({"inputs": "a", "raw_scores": "no"}, BadRequest, "true or false", "raw_scores"),
        ({"inputs": "a", "truncate": True}, BadRequest, "never truncates", "truncate"),
        ({"inputs": "a", "model": "other"}, NotFound, "GET /v1/models", "model"),
        ({"inputs": "word " * 600}, BadRequest, "at most 512", "inputs[0]"),
    ],
)
def test_bad_requests_name_the_field(
    model: Model, doc: dict, exc: type, needle: str, param: str
) -> None:
    with pytest.raises(exc) as info:
        decode_and_batch(model, body(doc))
    assert needle in info.value.message
    assert info.value.to_json()["error"]["param"] == param


def test_dummy_weights_get_transformers_default_labels() -> None:
    dummy = textclass.build(parse_args({"adapter": "text-classification", "load_format": "dummy"}))
    dummy.backend.setup(torch.device("cpu"))
    out = dummy.encode(dummy.backend.predict(dummy.backend.worst_case_items(1)), _decoded())
    assert sorted(p["label"] for p in out) == ["LABEL_0", "LABEL_1"]


def _decoded():
    from serve_app.adapters.contract import Decoded

    return Decoded(inputs=["x"], meta={"single": True, "raw": False, "top_k": None})
