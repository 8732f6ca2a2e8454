"""serve-app plan --measure's targets file, its batch-cap rule and the requests it sends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from serve_app.config.args import parse_args
from serve_app.errors import ConfigError
from serve_app.plan.targets import (
    Targets,
    batch_cap,
    candidate_batch_sizes,
    check_targets,
    load_targets,
    measured_mode,
    request_for,
)

ROOT = Path(__file__).resolve().parents[3]
RAG = ROOT / "configs" / "rag-stack.yaml"
RAG_TARGETS = ROOT / "examples" / "planning" / "rag-stack-targets.yaml"
CUSTOM = ROOT / "examples" / "custom_model" / "config.yaml"


@pytest.mark.parametrize(
    ("cap", "count", "sizes"),
    [
        (256, 3, [64, 128, 256]),
        (24, 3, [8, 16, 24]),
        (2, 3, [1, 2]),
        (1, 3, [1]),
        (32, 1, [32]),
        (100, 4, [16, 32, 64, 100]),
    ],
)
def test_candidates_are_the_largest_sizes_calibration_probes(
    cap: int, count: int, sizes: list[int]
) -> None:
    assert candidate_batch_sizes(cap, count) == sizes


def test_candidate_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        candidate_batch_sizes(8, 0)


def test_batch_cap_is_the_configured_one_else_calibrations_or_the_cpus() -> None:
    assert batch_cap(parse_args({"max_batch_size": 48}), on_gpu=True) == 48
    assert batch_cap(parse_args({}), on_gpu=True) == 256  # calibration_max_batch_size
    assert batch_cap(parse_args({"memory": {"calibration_max_batch_size": 64}}), True) == 64
    # On a GPU calibration stops at its own limit, so no peak is measured above it.
    capped = {"max_batch_size": 512, "memory": {"calibration_max_batch_size": 128}}
    assert batch_cap(parse_args(capped), on_gpu=True) == 128
    assert batch_cap(parse_args({}), on_gpu=False) == 32
    assert batch_cap(parse_args({"max_batch_size": 8}), on_gpu=False) == 8


def test_the_rag_stack_targets_cover_its_applications() -> None:
    doc = yaml.safe_load(RAG.read_text())
    targets = load_targets(RAG_TARGETS)
    assert check_targets(doc, targets) == []
    assert targets.models["rerank"].load_rps == 300 and targets.reserve.cores == 4


def test_missing_and_unknown_targets_are_named(tmp_path: Path) -> None:
    doc = yaml.safe_load(RAG.read_text())
    targets = Targets.model_validate(
        {"models": {"embeddings": {"p99_target_s": 0.1}, "nope": {"p99_target_s": 1}}}
    )
    errors = check_targets(doc, targets)
    assert "application rerank: no target; add models.rerank to the targets file" in errors
    assert "targets models.nope: no serve_app application of that name" in errors
    assert not any("embeddings" in e for e in errors)


def test_a_json_wire_user_model_needs_a_request_body() -> None:
    doc = yaml.safe_load(CUSTOM.read_text())
    bare = Targets.model_validate({"models": {"byte-scorer": {"p99_target_s": 1}}})
    (error,) = check_targets(doc, bare)
    assert "byte-scorer" in error and "models.byte-scorer.request" in error
    given = {"p99_target_s": 1, "request": {"inputs": ["a", "b"]}, "items_per_request": 2}
    assert check_targets(doc, Targets.model_validate({"models": {"byte-scorer": given}})) == []


def test_a_bad_targets_file_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"models": {"a": {"p99_target_s": -1, "extra": 1}}}))
    with pytest.raises(ConfigError) as err:
        load_targets(bad)
    assert "p99_target_s" in err.value.message and "extra" in err.value.message
    with pytest.raises(ConfigError, match="cannot read"):
        load_targets(tmp_path / "missing.yaml")


def test_built_in_requests_carry_the_stated_items() -> None:
    target = Targets.model_validate({"models": {"x": {"p99_target_s": 1}}}).models["x"]
    body, ctype, items = request_for(parse_args({"adapter": "embeddings"}), target)
    sent = json.loads(body)
    assert ctype == "application/json" and items == 16 == len(sent["input"])
    assert sent["model"] == "all-MiniLM-L6-v2" and len(set(sent["input"])) > 1
    args = parse_args({"adapter": "rerank", "model_name": "r", "load_format": "dummy"})
    sent = json.loads(request_for(args, target)[0])
    assert sent["query"] and len(sent["documents"]) == 16
    args = parse_args({"adapter": "text-classification", "load_format": "dummy"})
    sent = json.loads(request_for(args, target)[0])
    assert len(sent["inputs"]) == 16 and all(len(i) == 1 for i in sent["inputs"])
    body, ctype, items = request_for(
        parse_args({"adapter": "image-classification", "load_format": "dummy"}), target
    )
    assert ctype == "image/jpeg" and items == 1 and body[:2] == b"\xff\xd8"
    four = Targets.model_validate(
        {"models": {"x": {"p99_target_s": 1, "items_per_request": 4}}}
    ).models["x"]
    assert len(json.loads(request_for(parse_args({}), four)[0])["input"]) == 4


def test_the_measured_mode_is_mps_only_when_every_application_runs_under_it() -> None:
    doc = yaml.safe_load(RAG.read_text())
    assert measured_mode(doc) == ("time-sliced", [])
    for app in doc["applications"]:
        app["args"]["memory"]["enforcement"] = "mps"
    assert measured_mode(doc) == ("mps", [])
    doc["applications"][0]["args"]["memory"]["enforcement"] = "torch"
    mode, errors = measured_mode(doc)
    assert mode == "time-sliced" and len(errors) == 1
    assert "set the same enforcement on every application" in errors[0]
