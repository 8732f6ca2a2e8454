"""The reranker and the text classifier over real HTTP on the session's Ray Serve cluster
(HAProxy ingress), each deployed from a random-weight directory built in a tmp dir
(tests/fixtures/text_models.py): answers in both rerank shapes and TEI's /predict, the scores
the same model gives in-process, and a JSON 4xx naming the problem for every bad request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from tests.fixtures.text_models import classifier_dir
from tests.integration.conftest import App

RERANK = "tiny-reranker"
CLASSIFIER = "tiny-classifier"
LABELS = ["negative", "neutral", "positive"]
MAX_INPUTS = 8
MAX_BODY_BYTES = 16384
COMMON = {
    "max_batch_size": 16,
    "max_inputs_per_request": MAX_INPUTS,
    "max_body_bytes": MAX_BODY_BYTES,
    "max_input_tokens": 128,
}
QUERY = "what do cats eat"
DOCS = ["Cats eat meat.", "The stock market fell.", "Kittens need small meals.", "Soup."]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("text-models")
    # two encoder layers keep the replicas' start and each request cheap on 2 cores
    return (
        classifier_dir(root / "reranker", layers=2),
        classifier_dir(root / "classifier", LABELS, layers=2, seed=1),
    )


@pytest.fixture(scope="module")
def apps(cluster, dirs: tuple[Path, Path]) -> Iterator[tuple[str, str]]:
    rr_args = {**COMMON, "adapter": "rerank", "model_name": RERANK, "model_path": str(dirs[0])}
    tc_args = {
        **COMMON,
        "adapter": "text-classification",
        "model_name": CLASSIFIER,
        "model_path": str(dirs[1]),
    }
    opts = {"ray_actor_options": {"num_cpus": 0.5}}
    rr, tc = cluster.deploy_many(App("rr", "/rr", rr_args, opts), App("tc", "/tc", tc_args, opts))
    yield rr, tc
    cluster.delete("rr")
    cluster.delete("tc")


def test_rerank_answers_sorted_scores_of_the_same_model(apps, dirs) -> None:
    from serve_app.adapters import rerank
    from serve_app.config.args import parse_args

    rr, _ = apps
    resp = httpx.post(
        f"{rr}/v1/rerank",
        json={"model": RERANK, "query": QUERY, "documents": DOCS, "top_n": 3},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] == RERANK and len(body["results"]) == 3
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] > 0
    # the same directory in this process scores the same pairs alike
    local = rerank.build(parse_args({"adapter": "rerank", "model_path": str(dirs[0])}))
    local.backend.setup(torch.device("cpu"))
    decoded = local.decode(json.dumps({"query": QUERY, "documents": DOCS}).encode(), "", {})
    expected = local.encode(local.backend.predict(decoded.items), decoded)
    assert isinstance(expected, dict)
    assert [r["index"] for r in body["results"]] == [r["index"] for r in expected["results"][:3]]
    np.testing.assert_allclose(
        [r["relevance_score"] for r in body["results"]],
        [r["relevance_score"] for r in expected["results"][:3]],
        atol=1e-5,
    )
    tei = httpx.post(
        f"{rr}/v1/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}, timeout=30
    )
    assert tei.status_code == 200, tei.text
    assert [r["index"] for r in tei.json()][:3] == [r["index"] for r in body["results"]]
    assert [r["text"] for r in tei.json()] == [DOCS[r["index"]] for r in tei.json()]


def test_predict_answers_tei_shapes(apps) -> None:
    _, tc = apps
    single = httpx.post(f"{tc}/predict", json={"inputs": "I like you."}, timeout=30)
    assert single.status_code == 200, single.text
    preds = single.json()
    assert sorted(p["label"] for p in preds) == sorted(LABELS)
    assert sum(p["score"] for p in preds) == pytest.approx(1.0, abs=1e-5)
    batch = httpx.post(
        f"{tc}/predict",
        json={"inputs": [["I like you."], ["A man eats.", "Someone has a meal."]], "top_k": 1},
        timeout=30,
    )
    assert batch.status_code == 200, batch.text
    assert [len(row) for row in batch.json()] == [1, 1]
    # padded beside a longer pair: the same label, a score within float32 noise
    assert batch.json()[0][0] == {
        "label": preds[0]["label"],
        "score": pytest.approx(preds[0]["score"], abs=1e-5),
    }
    models = httpx.get(f"{tc}/v1/models", timeout=10).json()["data"][0]
    assert models["task"] == "text-classification" and models["labels"] == LABELS


BIG = "x" * MAX_BODY_BYTES


@pytest.mark.parametrize(
    ("app", "route", "doc", "status", "needle"),
    [
        (0, "/v1/rerank", {"query": "q", "documents": []}, 400, "'documents' must not be empty"),
        (0, "/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 400, "'top_n'"),
        (0, "/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 9}, 400, "'top_n'"),
        (0, "/v1/rerank", {"query": "q", "documents": ["a"] * 9}, 400, "at most 8"),
        (0, "/v1/rerank", {"query": "q", "documents": ["a"], "model": "x"}, 404, "'x'"),
        (0, "/v1/rerank", {"query": "q", "documents": [BIG]}, 413, "body"),
        (0, "/v1/rerank", {"query": "q", "documents": ["w " * 200]}, 400, "'documents[0]'"),
        (1, "/predict", {"inputs": [["a", "b", "c"]]}, 400, "'inputs[0]' must be a list of one"),
        (1, "/predict", {"inputs": ["a", "b", "c"]}, 400, "got 3 items"),
        (1, "/predict", {"inputs": []}, 400, "'inputs'"),
        (1, "/predict", {"inputs": "a", "top_k": 0}, 400, "'top_k'"),
        (1, "/predict", {"inputs": "a", "model": "x"}, 404, "'x'"),
        (1, "/predict", {"inputs": [BIG]}, 413, "body"),
        (1, "/v1/rerank", {"query": "q", "documents": ["a"]}, 404, "/predict"),
        (0, "/predict", {"inputs": "a"}, 404, "/v1/rerank"),
    ],
)
def test_bad_requests_get_a_json_4xx_naming_the_problem(
    apps, app: int, route: str, doc: dict, status: int, needle: str
) -> None:
    resp = httpx.post(f"{apps[app]}{route}", json=doc, timeout=30)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert needle.replace("must not be empty", "must not be an empty list") in error["message"]
    assert error["type"]


def test_the_openapi_documents_name_their_routes(apps) -> None:
    rr, tc = apps
    assert "/v1/rerank" in httpx.get(f"{rr}/openapi.json", timeout=10).json()["paths"]
    assert "/predict" in httpx.get(f"{tc}/openapi.json", timeout=10).json()["paths"]
