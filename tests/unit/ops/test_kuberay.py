"""deploy/kuberay/rayservice.yaml: its Serve config passes `serve-app check`, matches
configs/gpu-shared.yaml, and every Ray container gets the variables `serve-app run` sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from serve_app.config.deploy import check_deploy_config
from serve_app.ops import cluster_env

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = ROOT / "deploy" / "kuberay" / "rayservice.yaml"


def rayservice() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayService", doc.get("kind")
    return doc


def serve_config() -> dict[str, Any]:
    embedded = rayservice()["spec"]["serveConfigV2"]
    assert isinstance(embedded, str)  # KubeRay takes the Serve config as a YAML string
    doc: dict[str, Any] = yaml.safe_load(embedded)
    return doc


def containers() -> list[dict[str, Any]]:
    cluster = rayservice()["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_embedded_serve_config_passes_check() -> None:
    assert check_deploy_config(serve_config()) == []


def test_embedded_applications_are_gpu_shared_yaml() -> None:
    reference = yaml.safe_load((ROOT / "configs" / "gpu-shared.yaml").read_text())
    doc = serve_config()
    assert doc["applications"] == reference["applications"]
    # On a cluster the proxy listens where KubeRay's serve Service can reach it, on every node.
    assert doc["http_options"] == {"host": "0.0.0.0", "port": 8000}
    assert doc["proxy_location"] == "EveryNode"


def test_every_container_has_the_variables_serve_app_run_sets() -> None:
    wanted = cluster_env.cluster_env()
    assert wanted["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert set(cluster_env.HAPROXY_RETRY_DEFAULTS) <= set(wanted)
    found = containers()
    assert len(found) == 2, [c["name"] for c in found]
    for container in found:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {k: env.get(k) for k in wanted} == wanted, container["name"]


def test_a_gpu_worker_group_with_one_gpu_per_pod() -> None:
    cluster = rayservice()["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == "2.60.0"
    assert cluster["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    (gpu,) = [g for g in cluster["workerGroupSpecs"] if g["groupName"] == "gpu"]
    assert gpu["rayStartParams"]["num-gpus"] == "1"
    (container,) = gpu["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # The replicas the config asks for fit on the group's GPUs at its minimum size.
    need = sum(
        d["num_replicas"] * d["ray_actor_options"]["num_gpus"]
        for app in serve_config()["applications"]
        for d in app["deployments"]
    )
    assert need <= gpu["minReplicas"] * 1


def test_the_head_preloads_what_serve_app_run_would() -> None:
    from serve_app.startup import warmpool

    head = rayservice()["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]
    wanted = warmpool.system_config(*warmpool.app_settings(serve_config()))
    assert wanted and json.loads(head["system-config"]) == wanted
