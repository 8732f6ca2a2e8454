"""serve_app.config.shares (through deploy.check_deploy_config): the GPU shares on one GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from serve_app.config.deploy import check_deploy_config, load_deploy_config
from serve_app.config.shares import UNITS, most_replicas, packs

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def app(name: str, share: float, **dep: Any) -> dict[str, Any]:
    labels = dep.pop("label_selector", None)
    opts: dict[str, Any] = {"num_cpus": 1, "num_gpus": share}
    if labels:
        opts["label_selector"] = labels
    return {
        "name": name,
        "route_prefix": f"/{name}",
        "import_path": "serve_app.app:build_app",
        "args": {"adapter": "embeddings"},
        "deployments": [{"name": "model", "ray_actor_options": opts, **dep}],
    }


def doc(*apps: dict[str, Any]) -> dict[str, Any]:
    return {"applications": list(apps)}


def test_shares_up_to_one_pass_in_rays_own_unit() -> None:
    assert check_deploy_config(doc(app("a", 0.08, num_replicas=12))) == []  # 0.96
    assert check_deploy_config(doc(app("a", 0.2, num_replicas=2), app("b", 0.6))) == []  # 1.0
    assert check_deploy_config(doc(app("a", 0.1, num_replicas=10))) == []  # not 1.0000000002


def test_shares_over_one_name_each_deployment_the_sum_and_the_fix() -> None:
    (err,) = check_deploy_config(doc(app("emb", 0.3, num_replicas=2), app("rr", 0.5)))
    assert err.startswith("GPU shares: the replicas on one GPU ask for 1.1 in all")
    assert "applications[0].deployments[0] (emb/model) 2 x 0.3 (num_replicas) = 0.6" in err
    assert "applications[1].deployments[0] (rr/model) 1 x 0.5 (one replica) = 0.5" in err
    assert "lower ray_actor_options.num_gpus or the replica counts" in err


def test_autoscaling_counts_at_max_replicas() -> None:
    auto = {"min_replicas": 1, "max_replicas": 5}
    (err,) = check_deploy_config(doc(app("a", 0.25, autoscaling_config=auto)))
    assert "5 x 0.25 (autoscaling max_replicas) = 1.25" in err
    auto["max_replicas"] = 4
    assert check_deploy_config(doc(app("a", 0.25, autoscaling_config=auto))) == []


def test_most_replicas() -> None:
    assert most_replicas({}) == (1, "one replica")
    assert most_replicas({"num_replicas": 3}) == (3, "num_replicas")
    assert most_replicas({"num_replicas": "auto"})[0] == 100  # Serve's default max_replicas
    assert most_replicas({"num_replicas": "auto", "autoscaling_config": {"max_replicas": 2}}) == (
        2,
        "autoscaling max_replicas",
    )
    assert most_replicas({"autoscaling_config": {"min_replicas": 1}})[0] == 1  # Serve: 1


def test_fractions_land_whole_on_one_gpu() -> None:
    # 3 x 0.6 = 1.8 < 2 GPUs, yet each GPU holds one 0.6 only
    assert not packs([6000, 6000, 6000], 2)
    assert packs([6000, 4000, 6000, 4000], 2)
    assert packs([4000] * 3, 2) and not packs([4000] * 3, 1)
    assert packs([UNITS, UNITS], 2) and not packs([UNITS, 1], 1)
    three = doc(app("a", 0.6, num_replicas=3))
    (err,) = check_deploy_config(three, gpus=2)
    assert "on 2 GPUs (each share whole on one GPU) ask for 1.8" in err
    assert check_deploy_config(three, gpus=3) == []


def test_pinned_deployments_share_their_own_gpu() -> None:
    pins = [{"serve-app/gpu": "GPU-a"}, {"serve-app/gpu": "GPU-b"}]
    per_gpu = [app(f"g{i}", 0.25, num_replicas=4, label_selector=p) for i, p in enumerate(pins)]
    assert check_deploy_config(doc(*per_gpu)) == []  # 2.0 in all, 1.0 on each GPU
    over = app("g2", 0.25, label_selector=pins[1])
    (err,) = check_deploy_config(doc(*per_gpu, over))
    assert "GPU GPU-b (label_selector serve-app/gpu) ask for 1.25" in err
    assert "g0/model" not in err


def test_more_than_one_gpu_per_replica_is_its_own_error() -> None:
    errors = check_deploy_config(doc(app("a", 1.5)))
    assert len(errors) == 1 and "more than one GPU" in errors[0]


def test_rag_stack_passes_check() -> None:
    assert check_deploy_config(load_deploy_config(CONFIGS / "rag-stack.yaml")) == []


def test_rag_stack_shares_fit_one_gpu() -> None:
    from serve_app.config.shares import asks

    groups = asks(load_deploy_config(CONFIGS / "rag-stack.yaml"))
    assert list(groups) == [None]
    assert sum(a.share_units * a.replicas for a in groups[None]) == 7000  # 0.7 of the GPU


def test_serve_app_check_takes_the_gpu_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from serve_app.ops.cli import main

    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump(doc(app("a", 0.6, num_replicas=3))))
    assert main(["check", str(path)]) == 2
    assert "ask for 1.8 in all" in capsys.readouterr().err
    assert main(["check", str(path), "--gpus", "2"]) == 2
    assert main(["check", str(path), "--gpus", "3"]) == 0
