"""load_tests.benchmarks.stack.plan: the families of configs/rag-stack.yaml, their requests,
the quick CPU config and the verdict (pure functions)."""

from __future__ import annotations

import json
from typing import Any

from load_tests.benchmarks.stack.plan import (
    KNOWN_ROUTES,
    families,
    family_row,
    quick_config,
    request_for,
    verdict,
)
from load_tests.harness.meta import ROOT
from serve_app.config.deploy import check_deploy_config, load_deploy_config

RAG = load_deploy_config(ROOT / "configs" / "rag-stack.yaml")


def test_the_rag_stack_on_one_base_url() -> None:
    fams = families(RAG)
    assert [(f.application, f.adapter, f.route) for f in fams] == [
        ("embeddings", "embeddings", "/v1/embeddings"),
        ("rerank", "rerank", "/v1/rerank"),
        ("classify-text", "text-classification", "/predict"),
        ("classify-images", "image-classification", "/v1/classify"),
    ]
    assert {f.route for f in fams} == set(KNOWN_ROUTES.values())
    assert [f.torch_threads for f in fams] == [1, 1, 1, 2]
    assert all(f.app_args["load_format"] == "dummy" for f in fams[1:])


def test_requests_in_each_familys_wire_shape() -> None:
    by_name = {f.application: f for f in families(RAG)}
    emb = request_for(by_name["embeddings"], 8)
    assert json.loads(emb.body)["input"] and emb.items == 8
    rerank = json.loads(request_for(by_name["rerank"], 8).body)
    assert set(rerank) == {"model", "query", "documents"} and len(rerank["documents"]) == 8
    batch = json.loads(request_for(by_name["classify-text"], 4).body)["inputs"]
    assert len(batch) == 4 and all(len(seq) == 1 for seq in batch)  # four one-text sequences
    img = request_for(by_name["classify-images"], 8)
    assert img.content_type == "image/jpeg" and img.items == 1 and img.body[:2] == b"\xff\xd8"


def test_quick_config_runs_on_the_cpu_with_the_families_this_checkout_has() -> None:
    doc, notes = quick_config(RAG, ["embeddings", "image-classification"], 8123)
    assert [a["name"] for a in doc["applications"]] == ["embeddings", "classify-images"]
    assert len(notes) == 2 and "rerank" in notes[0]
    for app in doc["applications"]:
        assert app["args"]["device"] == "cpu"
        assert app["deployments"][0]["ray_actor_options"] == {"num_cpus": 0.25}
    assert doc["http_options"]["port"] == 8123
    assert check_deploy_config(doc) == []
    assert RAG["applications"][0]["deployments"][0]["num_replicas"] == 2  # the source untouched


def _wrk(p99_ms: float, rps: float, errors: int = 0) -> dict[str, Any]:
    return {"p99_ms": p99_ms, "requests_per_s": rps, "errors": errors}


def test_rows_and_verdict() -> None:
    fam = families(RAG)[0]
    req = request_for(fam, 8)
    ceiling = {"items_per_s_max": 16000.0, "best_batch": 128}
    row = family_row(fam, req, _wrk(10.0, 1000.0), _wrk(12.0, 800.0), ceiling)
    assert row["p99_ratio"] == 1.2 and row["p99_ok"]
    assert row["items_per_s_alone"] == 8000.0 and row["mixed_of_ceiling"] == 0.4
    slow = family_row(fam, req, _wrk(10.0, 1000.0), _wrk(13.0, 800.0, errors=2), ceiling)
    assert not slow["p99_ok"] and slow["errors"] == 2
    watch = {"budget_violations": 0, "nvml_samples_judged": 500}
    assert verdict([row], watch, on_gpu=True)["all_ok"]
    bad = verdict([row, slow], watch, on_gpu=True)
    assert not bad["p99_ok"] and not bad["errors_ok"] and not bad["all_ok"]
    blind = {"budget_violations": 0, "nvml_samples_judged": 0}
    assert not verdict([row], blind, on_gpu=True)["budget_ok"]  # judged nothing: no proof
    assert verdict([row], blind, on_gpu=False)["budget_ok"]
    missing = family_row(fam, req, _wrk(10.0, 1000.0), {"error": "wrk failed"}, None)
    assert missing["failed"] == ["mixed"] and not verdict([missing], watch, True)["errors_ok"]
