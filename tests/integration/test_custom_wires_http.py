"""A user model on the built-in families' wire specs, over real HTTP on the session's Ray Serve
cluster: ``wire: rerank`` (tests/unit/adapters/custom/user_models.py's PairScorer, one float per
query-document pair) on ``/v1/rerank`` and ``wire: predict`` (its Sentiment, per-label scores)
on ``/predict``, each replica importing the class by path. Answers are checked against the
class's own output computed here, the families' 4xx on a bad body, and the route in the
OpenAPI document and /v1/models."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.integration.conftest import App
from tests.unit.adapters.custom.user_models import PairScorer, Sentiment

HERE = "tests.unit.adapters.custom.user_models"
COMMON = {"max_batch_size": 4, "max_inputs_per_request": 8, "warm_workers": 0}
QUERY = "what do cats eat"
DOCS = ["Cats eat meat.", "The stock market fell.", "Kittens need small meals.", "Soup."]


@pytest.fixture(scope="module")
def apps(cluster: Any) -> Iterator[tuple[str, str]]:
    opts = {"ray_actor_options": {"num_cpus": 0.5}}
    rerank = {**COMMON, "adapter": f"{HERE}:PairScorer", "wire": "rerank", "model_name": "pairs"}
    predict = {**COMMON, "adapter": f"{HERE}:Sentiment", "wire": "predict"}
    try:
        t0 = time.monotonic()
        rerank_url, predict_url = cluster.deploy_many(
            App("wire-rerank", "/wire-rerank", rerank, opts),
            App("wire-predict", "/wire-predict", predict, opts),
        )
        urls = (rerank_url, predict_url)
        print(f"two user-model applications deployed in {time.monotonic() - t0:.1f} s")
        yield urls
    finally:
        cluster.delete("wire-rerank")
        cluster.delete("wire-predict")


def own(cls: type, inputs: list[Any]) -> Any:
    """The class's own output for ``inputs``, in this process (the same seeded weights)."""
    model = cls()
    model.setup(torch.device("cpu"))
    with torch.inference_mode():
        out = model.predict(inputs)
    return np.asarray(out.tolist() if isinstance(out, torch.Tensor) else out)


def test_wire_rerank_serves_the_user_models_scores_on_v1_rerank(apps) -> None:
    rr, _ = apps
    with httpx.Client(base_url=rr, timeout=30) as client:
        resp = client.post(
            "/v1/rerank", json={"model": "pairs", "query": QUERY, "documents": DOCS, "top_n": 3}
        )
        assert resp.status_code == 200, resp.text
        body = resp.json()
        want = own(PairScorer, [(QUERY, d) for d in DOCS])
        order = [int(i) for i in np.argsort(-want, kind="stable")]
        assert [r["index"] for r in body["results"]] == order[:3]
        np.testing.assert_allclose(
            [r["relevance_score"] for r in body["results"]], want[order[:3]], atol=1e-5
        )
        assert body["usage"] == {"prompt_tokens": 0, "total_tokens": 0}
        tei = client.post("/v1/rerank", json={"query": QUERY, "texts": DOCS})
        assert tei.status_code == 200 and [r["index"] for r in tei.json()] == order, tei.text
        # The reranker family's refusals, as JSON naming the field.
        empty = client.post("/v1/rerank", json={"query": QUERY, "documents": []})
        assert empty.status_code == 400 and empty.json()["error"]["param"] == "documents"
        top = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 9})
        assert top.status_code == 400 and top.json()["error"]["param"] == "top_n"
        other = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "model": "x"})
        assert other.status_code == 404 and "pairs" in other.json()["error"]["message"]
        assert "/v1/rerank" in client.get("/openapi.json").json()["paths"]
        card = client.get("/v1/models").json()["data"][0]
        assert card["wire"] == "rerank" and card["adapter"] == f"{HERE}:PairScorer"


def test_wire_predict_serves_labelled_scores_on_predict(apps) -> None:
    _, tc = apps
    pair = ["A man eats.", "Someone has a meal."]
    with httpx.Client(base_url=tc, timeout=30) as client:
        resp = client.post("/predict", json={"inputs": [["I like you."], pair], "top_k": 2})
        assert resp.status_code == 200, resp.text
        want = own(Sentiment, ["I like you.", tuple(pair)])
        for row, scores in zip(resp.json(), want, strict=True):
            best = np.argsort(-scores, kind="stable")[:2]
            assert [p["label"] for p in row] == [Sentiment.labels[i] for i in best]
            np.testing.assert_allclose([p["score"] for p in row], scores[best], atol=1e-5)
        arity = client.post("/predict", json={"inputs": [["a", "b", "c"]]})
        assert arity.status_code == 400 and arity.json()["error"]["param"] == "inputs[0]"
        wrong = client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
        assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "route_not_served"
