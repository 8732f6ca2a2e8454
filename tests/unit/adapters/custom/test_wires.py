"""A user model on a built-in family's wire spec (serve_app.adapters.custom.wires), with real
tiny torch models (user_models.py): ``wire: rerank`` (the reranker's ``/v1/rerank``, one float
per (query, document) pair) and ``wire: predict`` (the text classifier's ``/predict``, a list of
per-label scores per input). Requests go through the family's spec and the user's predict; the
answers are checked against the class's own output, the 4xx against the family's, and outputs
of the wrong shape against the 500 naming the class."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest
import torch

from serve_app import adapters
from serve_app.adapters.custom import UserModelError
from serve_app.config.args import parse_args
from serve_app.errors import ConfigError, ServeAppError, StartupError
from serve_app.serving.http import guarded
from serve_app.startup import pipeline
from serve_app.startup.calibration import check_batch_cap_source
from serve_app.startup.warmup import run_fits

HERE = "tests.unit.adapters.custom.user_models"
QUERY = "what do cats eat"
DOCS = ["Cats eat meat.", "The stock market fell.", "Kittens need small meals.", "Soup."]
LABELS = ["negative", "neutral", "positive"]


def model_of(name: str, **args: Any) -> adapters.Model:
    model = adapters.build_model(parse_args({"adapter": f"{HERE}:{name}", **args}))
    model.backend.setup(torch.device("cpu"))
    return model


def answer(model: adapters.Model, doc: dict[str, Any]) -> Any:
    """The JSON body the replica sends for ``doc``: decode, the user's predict, encode."""
    decoded = model.decode(json.dumps(doc).encode(), "application/json", {})
    body = model.encode(model.backend.predict(decoded.items), decoded)
    return orjson.loads(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))


def own_scores(model: adapters.Model, inputs: list[Any]) -> list[Any]:
    """What the user's class itself returns for ``inputs``, in this process."""
    with torch.inference_mode():
        out = model.backend.model.predict(inputs)  # type: ignore[attr-defined]
    return out.tolist() if isinstance(out, torch.Tensor) else out


# wire: rerank


def test_wire_rerank_answers_the_cohere_shape_with_the_models_own_scores() -> None:
    model = model_of("PairScorer", wire="rerank", model_name="pairs")
    assert model.spec.route == "/v1/rerank"
    body = answer(
        model,
        {"model": "pairs", "query": QUERY, "documents": [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]]},
    )
    want = own_scores(model, [(QUERY, d) for d in DOCS])
    assert [r["index"] for r in body["results"]] == sorted(range(4), key=lambda i: -want[i])
    np.testing.assert_allclose(
        [r["relevance_score"] for r in body["results"]], sorted(want, reverse=True), atol=1e-6
    )
    assert body["model"] == "pairs" and body["usage"] == {"prompt_tokens": 0, "total_tokens": 0}
    top = answer(model, {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True})[
        "results"
    ]
    assert top == [{**r, "document": {"text": DOCS[r["index"]]}} for r in body["results"][:2]], (
        "top_n and return_documents as the reranker family gives them"
    )
    # The model's scores are its own: raw_scores changes nothing (no sigmoid on top).
    raw = answer(model, {"query": QUERY, "documents": DOCS, "raw_scores": True})
    assert raw["results"] == body["results"]
    assert model.backend.describe()["wire"] == "rerank"


def test_wire_rerank_answers_the_tei_shape() -> None:
    model = model_of("PairScorer", wire="rerank")
    body = answer(model, {"query": QUERY, "texts": DOCS, "return_text": True})
    want = own_scores(model, [(QUERY, d) for d in DOCS])
    assert [r["index"] for r in body] == sorted(range(4), key=lambda i: -want[i])
    assert [r["text"] for r in body] == [DOCS[r["index"]] for r in body]
    np.testing.assert_allclose([r["score"] for r in body], sorted(want, reverse=True), atol=1e-6)


def test_wire_rerank_takes_a_column_of_scores_as_a_one_label_model_gives_them() -> None:
    column = answer(model_of("PairScorerColumn", wire="rerank"), {"query": "q", "texts": DOCS})
    flat = answer(model_of("PairScorer", wire="rerank"), {"query": "q", "texts": DOCS})
    assert column == flat


@pytest.mark.parametrize(
    ("doc", "status", "param"),
    [
        ({"documents": ["a"]}, 400, "query"),
        ({"query": 3, "documents": ["a"]}, 400, "query"),
        ({"query": "q"}, 400, "documents"),
        ({"query": "q", "documents": []}, 400, "documents"),
        ({"query": "q", "documents": ["a"] * 5}, 400, "documents"),
        ({"query": "q", "documents": ["a", 3]}, 400, "documents[1]"),
        ({"query": "q", "documents": ["a"], "texts": ["a"]}, 400, "documents"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, 400, "top_n"),
        ({"query": "q", "documents": ["a"], "top_n": 5}, 400, "top_n"),
        ({"query": "q", "documents": ["a"], "return_documents": "yes"}, 400, "return_documents"),
        ({"query": "q", "texts": ["a"], "truncate": True}, 400, "truncate"),
        ({"query": "q", "documents": ["a"], "model": "other"}, 404, "model"),
    ],
)
def test_wire_rerank_refuses_what_the_reranker_family_refuses(
    doc: dict[str, Any], status: int, param: str
) -> None:
    model = model_of("PairScorer", wire="rerank", max_inputs_per_request=4)
    with pytest.raises(ServeAppError) as info:
        model.decode(json.dumps(doc).encode(), "application/json", {})
    assert (info.value.status_code, info.value.param) == (status, param), info.value.message


@pytest.mark.parametrize(
    ("name", "shape"),
    [("TwoScoresPerPair", "shape (2,)"), ("NanScorer", "a float 'nan'")],
)
def test_wire_rerank_outputs_of_the_wrong_shape_are_a_500_naming_the_class(
    name: str, shape: str, caplog
) -> None:
    model = model_of(name, wire="rerank")
    decoded = model.decode(b'{"query": "q", "documents": ["a", "b"]}', "", {})
    with pytest.raises(UserModelError) as info:
        model.backend.predict(decoded.items)
    err = info.value
    assert err.status_code == 500 and err.error_id in caplog.text
    assert f"{HERE}:{name}.predict returned an output of {shape} for wire: rerank" in err.message
    assert "one finite float, the (query, document) pair's score" in err.message

    async def request() -> Any:
        raise err

    response = asyncio.run(guarded(request()))  # what the replica answers
    assert response.status_code == 500
    assert orjson.loads(response.body)["error"]["message"] == err.message


def test_wire_rerank_example_inputs_are_pairs_for_calibration_and_warm_up() -> None:
    args = parse_args({"adapter": f"{HERE}:PairScorer", "wire": "rerank"})
    started = pipeline.start_replica(args, 0.0)
    backend = started.model.backend
    # The example's JSON lists come as the tuples the spec's decode gives predict.
    assert backend.worst_case_items(2) == [("q" * 64, "d" * 512)] * 2
    # What calibration's probe and warm-up run on a GPU (warmup.run_fits), here on the CPU.
    batches = backend.warmup_batches(4)
    assert [len(b) for b in batches] == [1, 2, 4]
    assert all(run_fits(backend, started.partition, b) for b in batches)
    assert backend.model.batches == [1, 2, 4]  # type: ignore[attr-defined]
    # With example_inputs, a GPU calibrates: no max_batch_size needed (the checks stop there).
    check_batch_cap_source(args, backend, SimpleNamespace(on_gpu=True))  # type: ignore[arg-type]


def test_wire_rerank_example_inputs_that_are_no_pairs_fail_start_up_naming_them() -> None:
    with pytest.raises(StartupError) as info:
        model_of("BadPairExamples", wire="rerank").backend.worst_case_items(2)
    msg = info.value.message
    assert f"{HERE}:BadPairExamples.example_inputs(2) gave an input wire: rerank" in msg
    assert "no (query, document) pair of two strings" in msg


# wire: predict


def test_wire_predict_answers_teis_shapes_with_the_models_labels_and_scores() -> None:
    model = model_of("Sentiment", wire="predict", model_name="sentiment")
    assert model.spec.route == "/predict"
    pair = ("A man eats.", "Someone has a meal.")
    want = own_scores(model, ["I like you.", pair])
    single = answer(model, {"inputs": "I like you.", "model": "sentiment"})
    assert single == [
        {"label": LABELS[i], "score": pytest.approx(want[0][i], abs=1e-6)}
        for i in np.argsort(want[0])[::-1]
    ]
    batch = answer(model, {"inputs": [["I like you."], list(pair)], "top_k": 1})
    best = [int(np.argmax(w)) for w in want]
    assert batch == [
        [{"label": LABELS[b], "score": pytest.approx(w[b], abs=1e-6)}]
        for b, w in zip(best, want, strict=True)
    ]
    assert answer(model, {"inputs": list(pair)}) == answer(model, {"inputs": [list(pair)]})[0]
    # The model's scores are its own: raw_scores changes nothing (no second softmax).
    assert answer(model, {"inputs": "I like you.", "raw_scores": True}) == single


def test_wire_predict_without_labels_names_them_label_i() -> None:
    model = model_of("Unlabelled", wire="predict")
    body = answer(model, {"inputs": [["a"], ["b", "c"]]})
    assert [sorted(p["label"] for p in row) for row in body] == [
        ["LABEL_0", "LABEL_1", "LABEL_2"]
    ] * 2


@pytest.mark.parametrize(
    ("doc", "status", "param"),
    [
        ({}, 400, "inputs"),
        ({"inputs": []}, 400, "inputs"),
        ({"inputs": 3}, 400, "inputs"),
        ({"inputs": ["a", "b", "c"]}, 400, "inputs"),
        ({"inputs": [["a", "b", "c"]]}, 400, "inputs[0]"),
        ({"inputs": [["a"], "b"]}, 400, "inputs[1]"),
        ({"inputs": [["a", 2]]}, 400, "inputs[0][1]"),
        ({"inputs": [["a"]] * 5}, 400, "inputs"),
        ({"inputs": "a", "top_k": 0}, 400, "top_k"),
        ({"inputs": "a", "truncate": True}, 400, "truncate"),
        ({"inputs": "a", "model": "other"}, 404, "model"),
    ],
)
def test_wire_predict_refuses_what_the_text_classifier_refuses(
    doc: dict[str, Any], status: int, param: str
) -> None:
    model = model_of("Sentiment", wire="predict", max_inputs_per_request=4)
    with pytest.raises(ServeAppError) as info:
        model.decode(json.dumps(doc).encode(), "application/json", {})
    assert (info.value.status_code, info.value.param) == (status, param), info.value.message


@pytest.mark.parametrize(
    ("name", "inputs", "message"),
    [
        (
            "WrongLabelCount",
            ["a"],
            "returned an output of shape (3,) for wire: predict; each output must be a list of "
            "finite floats, one score per label (4)",
        ),
        ("RaggedScores", ["a", "b"], "returned an output of shape (2,) for wire: predict"),
    ],
)
def test_wire_predict_outputs_of_the_wrong_shape_are_a_500_naming_the_class(
    name: str, inputs: list[str], message: str
) -> None:
    model = model_of(name, wire="predict")
    with pytest.raises(UserModelError) as info:
        model.backend.predict(inputs)
    assert info.value.status_code == 500
    assert f"{HERE}:{name}.predict {message}" in info.value.message


def test_wire_predict_labels_that_are_no_strings_fail_naming_the_class() -> None:
    with pytest.raises(ConfigError) as info:
        adapters.build_model(parse_args({"adapter": f"{HERE}:LabelsNotStrings", "wire": "predict"}))
    msg = info.value.message
    assert msg.startswith(f"args.adapter: {HERE}:LabelsNotStrings.labels is a list")
    assert "make it a list of strings, one label per score" in msg


def test_wire_predict_example_inputs_are_texts_and_pairs_for_calibration() -> None:
    started = pipeline.start_replica(
        parse_args({"adapter": f"{HERE}:Unlabelled", "wire": "predict"}), 0.0
    )
    items = started.model.backend.worst_case_items(3)
    assert items == ["t" * 512, ("p" * 256, "h" * 256), "t" * 512]
    # Calibration's probe on a GPU (warmup.run_fits) runs them; the label count is then known.
    assert run_fits(started.model.backend, started.partition, items)
    assert started.model.spec.model.labels == ["LABEL_0", "LABEL_1", "LABEL_2"]  # type: ignore[attr-defined]


def test_the_openapi_operations_are_the_families() -> None:
    rerank = model_of("PairScorer", wire="rerank", max_inputs_per_request=4).spec.openapi(1024)
    request = rerank.schemas["RerankRequest"]["properties"]
    assert request["documents"]["maxItems"] == 4
    assert {"RerankResponse", "TeiRerankResponse"} <= set(rerank.schemas)
    predict = model_of("Sentiment", wire="predict").spec.openapi(1024)
    assert {"PredictRequest", "PredictResponse"} <= set(predict.schemas)
    assert predict.operation["summary"] == "Text classification (TEI's /predict)"
