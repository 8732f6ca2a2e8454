"""config.cores: the cores a config's first roll-out reserves against one host's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from serve_app.config.cores import core_asks, cores_error, starting_replicas

ROOT = Path(__file__).resolve().parents[3]


def config(*deployments: dict[str, Any]) -> dict[str, Any]:
    return {"applications": [{"name": "a", "deployments": list(deployments)}]}


@pytest.mark.parametrize(
    ("dep", "replicas"),
    [
        ({}, 1),
        ({"num_replicas": 3}, 3),
        ({"num_replicas": "auto"}, 1),
        ({"autoscaling_config": {"min_replicas": 2, "max_replicas": 8}}, 2),
        ({"autoscaling_config": {"min_replicas": 0, "initial_replicas": 3}}, 3),
        ({"autoscaling_config": {"max_replicas": 8}}, 1),
        ({"autoscaling_config": {"min_replicas": 0}}, 0),
        ({"num_replicas": "many"}, None),
        ({"num_replicas": True}, None),
    ],
)
def test_starting_replicas_follows_serves_rules(dep: dict[str, Any], replicas: int | None) -> None:
    assert starting_replicas(dep) == replicas


def test_serves_default_of_one_core_counts_and_zero_cores_do_not() -> None:
    doc = config(
        {"name": "plain", "num_replicas": 2},
        {"name": "half", "num_replicas": 3, "ray_actor_options": {"num_cpus": 0.5}},
        {"name": "free", "num_replicas": 4, "ray_actor_options": {"num_cpus": 0}},
    )
    assert [(a.name, a.replicas, a.num_cpus) for a in core_asks(doc)] == [
        ("a/plain", 2, 1.0),
        ("a/half", 3, 0.5),
    ]
    assert cores_error(doc, 3.5) is None
    error = cores_error(doc, 3.0)
    assert error is not None and "reserve 3.5 cores" in error
    assert "a/plain 2 x 1; a/half 3 x 0.5" in error and "gives Ray 3" in error


def test_the_shipped_configs_on_a_two_core_host() -> None:
    def on_two_cores(name: str) -> str | None:
        return cores_error(yaml.safe_load((ROOT / "configs" / name).read_text()), 2.0)

    # What the README's first command serves starts on CI's two cores; the GPU layouts do not.
    assert on_two_cores("default.yaml") is None and on_two_cores("cpu.yaml") is None
    rag = on_two_cores("rag-stack.yaml")
    assert rag is not None and "reserve 7 cores" in rag and "classify-images/model 1 x 2" in rag
