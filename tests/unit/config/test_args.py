"""The app's config schema and the whole-file check."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from serve_app.config.args import AppArgs, parse_args
from serve_app.config.deploy import check_deploy_config, load_deploy_config
from serve_app.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def test_defaults() -> None:
    args = parse_args({})
    assert args.adapter == "embeddings"
    assert args.model_name == "all-MiniLM-L6-v2"
    assert args.max_batch_size is None
    assert args.memory.cache_policy == "threshold"
    assert args.memory.cache_threshold_fraction == 0.10


def test_image_model_name_defaults_to_arch() -> None:
    assert (
        parse_args({"adapter": "image-classification", "arch": "resnet18"}).model_name == "resnet18"
    )


@pytest.mark.parametrize(
    ("raw", "path", "fix"),
    [
        ({"max_batch_size": 0}, "args.max_batch_size", "allowed range"),
        ({"batch_wait_timeout_s": "soon"}, "args.batch_wait_timeout_s", "right type"),
        ({"adapter": "llm"}, "args.adapter", "use one of"),
        ({"memory": {"cache_policy": "sometimes"}}, "args.memory.cache_policy", "use one of"),
        ({"memory": {"memory_fraction": 1.5}}, "args.memory.memory_fraction", "allowed range"),
        ({"max_batch_sise": 8}, "args.max_batch_sise", "check its spelling"),
    ],
)
def test_bad_values_name_field_value_and_fix(raw: dict, path: str, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_args(raw)
    msg = info.value.message
    assert path in msg and fix in msg
    bad_value = next(iter(raw.values()))
    if not isinstance(bad_value, dict):
        assert repr(bad_value) in msg


def test_every_error_is_listed() -> None:
    with pytest.raises(ConfigError) as info:
        parse_args({"max_batch_size": -1, "top_k": 0})
    assert "args.max_batch_size" in info.value.message and "args.top_k" in info.value.message


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_shipped_configs_are_valid(name: str) -> None:
    doc = load_deploy_config(ROOT / "configs" / name)
    assert check_deploy_config(doc) == []


def test_memory_fraction_above_num_gpus_is_reported() -> None:
    doc = {
        "applications": [
            {
                "name": "a",
                "import_path": "serve_app.app:build_app",
                "args": {"memory": {"memory_fraction": 0.5}},
                "deployments": [{"name": "model", "ray_actor_options": {"num_gpus": 0.25}}],
            }
        ]
    }
    errors = check_deploy_config(doc)
    assert len(errors) == 1
    assert "applications[0].args.memory.memory_fraction" in errors[0]
    assert "lower memory_fraction or raise num_gpus" in errors[0]


def test_serve_schema_errors_are_reported() -> None:
    errors = check_deploy_config({"applications": [{"name": "a"}]})
    assert any("import_path" in e for e in errors), errors
    assert check_deploy_config({"nope": 1}) == [
        "applications: missing; a Serve config needs a list of applications"
    ]


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_deploy_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_deploy_config(bad)
    bad.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_deploy_config(bad)


def test_schema_round_trip() -> None:
    args = AppArgs(max_batch_size=8)
    assert parse_args(args.model_dump()) == args


def test_a_user_model_by_import_path_gets_its_defaults() -> None:
    args = parse_args({"adapter": "mypkg.models:MyModel"})
    assert args.model_name == "MyModel" and args.wire == "json"
    assert args.cuda_graphs is False  # opt-in for user models
    chosen = parse_args(
        {"adapter": "m:C", "model_name": "mine", "cuda_graphs": True, "wire": "embeddings"}
    )
    assert (chosen.model_name, chosen.cuda_graphs, chosen.wire) == ("mine", True, "embeddings")
    # The dump a replica re-parses keeps the same settings.
    assert parse_args(args.model_dump()) == args


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        ({"adapter": "mypkg.models.MyModel"}, "args.adapter", "module:Class"),
        ({"adapter": "mypkg:My-Model"}, "args.adapter", "use one of 'embeddings'"),
        ({"adapter": "m:C", "wire": "grpc"}, "args.wire", "use one of"),
        ({"wire": "json"}, "args", "wire applies to a user model"),
        ({"adapter_options": {"a": 1}}, "args", "adapter_options applies to a user model"),
    ],
)
def test_user_model_fields_are_checked(raw: dict, path: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_args(raw)
    assert f"{path}:" in info.value.message and words in info.value.message


def test_max_batch_tokens_is_validated_and_for_the_text_families_only() -> None:
    assert parse_args({}).max_batch_tokens is None
    assert parse_args({"adapter": "rerank", "max_batch_tokens": 16384}).max_batch_tokens == 16384
    with pytest.raises(ConfigError, match="max_batch_tokens"):
        parse_args({"max_batch_tokens": 0})
    with pytest.raises(ConfigError, match="max_batch_tokens applies to embeddings"):
        parse_args({"adapter": "image-classification", "max_batch_tokens": 4096})
