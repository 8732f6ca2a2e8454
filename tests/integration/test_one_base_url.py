"""Two applications behind one base URL (configs/rag-stack.yaml's layout, below ``/stack`` so
that it shares the session cluster): embeddings at the base and an image classifier (dummy
weights) at its own route as prefix. Each route answers from its own application with no hop
between, ``/v1/models`` lists both with their routes, ``/v1/memory`` (what ``serve-app status``
reads) lists both applications' replicas. Both applications are deleted at the end."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from serve_app.ops.status import read_memory_report, render_status
from tests.integration.conftest import App

BASE = "/stack"
EMB_MODEL = "all-MiniLM-L6-v2"
EMB = {"adapter": "embeddings", "max_batch_size": 8, "warm_workers": 0}
IMG = {
    "adapter": "image-classification",
    "arch": "resnet18",
    "model_name": "stack-resnet18",
    "load_format": "dummy",
    "image_size": 64,
    "top_k": 2,
    "max_batch_size": 4,
    "warm_workers": 0,
}


@pytest.fixture(scope="module")
def stack(cluster: Any) -> Iterator[str]:
    opts = {"ray_actor_options": {"num_cpus": 0.5}}
    try:
        base, _ = cluster.deploy_many(
            App("stack-emb", BASE, EMB, opts), App("stack-img", f"{BASE}/v1/classify", IMG, opts)
        )
        yield base
    finally:
        for name in ("stack-img", "stack-emb"):
            cluster.delete(name)


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(buf, format="PNG")
    return buf.getvalue()


def test_each_route_answers_from_its_own_application(stack: str) -> None:
    emb = httpx.post(f"{stack}/v1/embeddings", json={"input": ["a", "b"]}, timeout=60.0)
    assert emb.status_code == 200, emb.text[:300]
    assert [len(d["embedding"]) for d in emb.json()["data"]] == [384, 384]
    img = httpx.post(
        f"{stack}/v1/classify",
        content=_png(),
        headers={"content-type": "image/png"},
        timeout=60.0,
    )
    assert img.status_code == 200, img.text[:300]
    assert len(img.json()["data"][0]["top_k"]) == 2
    # Different replicas answered: HAProxy sent each path straight to its own application.
    assert emb.headers["x-serve-app-replica"] != img.headers["x-serve-app-replica"]


def test_models_lists_both_with_their_routes(stack: str) -> None:
    body = httpx.get(f"{stack}/v1/models", timeout=30.0).json()
    assert "errors" not in body, body
    data = body["data"]
    routes = {d["id"]: (d["route"], d["application"]) for d in data}
    assert routes == {
        EMB_MODEL: (f"{BASE}/v1/embeddings", "stack-emb"),
        "stack-resnet18": (f"{BASE}/v1/classify", "stack-img"),
    }, data
    assert data[0]["id"] == EMB_MODEL and data[0]["dimensions"] == 384  # the answerer's first
    # The classifier's own prefix lists only what lies under it.
    own = httpx.get(f"{stack}/v1/classify/v1/models", timeout=30.0).json()["data"]
    assert [d["id"] for d in own] == ["stack-resnet18"]


def test_memory_lists_both_applications_replicas(stack: str) -> None:
    deadline = time.monotonic() + 30.0
    while True:
        doc = read_memory_report(stack)  # serve-app status's own reader
        apps = {r.get("application") for r in doc["replicas"]}
        if {"stack-emb", "stack-img"} <= apps or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {"stack-emb", "stack-img"} <= apps, apps
    mine = [r for r in doc["replicas"] if r.get("application") in {"stack-emb", "stack-img"}]
    assert {(r["application"], r["route"]) for r in mine} == {
        ("stack-emb", "/v1/embeddings"),
        ("stack-img", "/v1/classify"),
    }
    table = render_status(doc)
    assert EMB_MODEL in table and "stack-resnet18" in table
