"""serve_app.serving.index: /v1/models over several applications on one base URL."""

from __future__ import annotations

from typing import Any

from serve_app.serving.index import model_entries, public_route, route_prefixes, under


def rep(replica: str, application: str, model: str, route: str, **card: Any) -> dict[str, Any]:
    return {
        "replica_id": replica,
        "application": application,
        "app": model,
        "route": route,
        "model_card": {"id": model, "object": "model", **card},
    }


EMB = rep("e1", "embeddings", "minilm", "/v1/embeddings", dimensions=384)
RERANK = rep("r1", "rerank", "ms-marco", "/v1/rerank")
IMAGES = rep("i1", "images", "resnet50", "/v1/classify")
PREFIXES = {"embeddings": "/", "rerank": "/v1/rerank", "images": "/images"}


def test_public_route() -> None:
    assert public_route("/", "/v1/embeddings") == "/v1/embeddings"
    assert public_route("/v1/rerank", "/v1/rerank") == "/v1/rerank"  # the prefix is the route
    assert public_route("/v1/rerank/", "/v1/rerank") == "/v1/rerank"
    assert public_route("/images", "/v1/classify") == "/images/v1/classify"
    assert public_route("/stack/v1/classify", "/v1/classify") == "/stack/v1/classify"
    assert public_route(None, "/v1/classify") is None


def test_under() -> None:
    assert under("", "/v1/rerank") and under("/", "/predict")
    assert under("/images", "/images/v1/classify") and under("/v1/rerank", "/v1/rerank")
    assert not under("/images", "/imagesx/v1/classify") and not under("/images", "/v1/rerank")


def test_route_prefixes_from_serve_details() -> None:
    details = {"applications": {"a": {"route_prefix": "/"}, "b": {"route_prefix": None}}}
    assert route_prefixes(details) == {"a": "/", "b": None}
    assert route_prefixes({}) == {}


def test_the_root_lists_every_model_with_its_route_own_first() -> None:
    second = {**EMB, "replica_id": "e2"}
    data = model_entries("", EMB, [RERANK, IMAGES, EMB, second], PREFIXES)
    assert [(d["id"], d["route"], d["application"], d["replicas"]) for d in data] == [
        ("minilm", "/v1/embeddings", "embeddings", 2),
        ("resnet50", "/images/v1/classify", "images", 1),
        ("ms-marco", "/v1/rerank", "rerank", 1),
    ]
    assert data[0]["dimensions"] == 384 and data[0]["object"] == "model"


def test_a_prefix_lists_the_models_under_it_only() -> None:
    data = model_entries("/images", IMAGES, [EMB, RERANK, IMAGES], PREFIXES)
    assert [d["route"] for d in data] == ["/images/v1/classify"]
    data = model_entries("/v1/rerank", RERANK, [EMB, RERANK, IMAGES], PREFIXES)
    assert [d["route"] for d in data] == ["/v1/rerank"]


def test_gone_applications_and_old_reports_are_left_out() -> None:
    gone = rep("g1", "deleted", "old", "/v1/embeddings")
    old = {"replica_id": "o1", "app": "x"}  # a report without the fields
    data = model_entries("", EMB, [gone, old, EMB], {"embeddings": "/"})
    assert [d["id"] for d in data] == ["minilm"]
