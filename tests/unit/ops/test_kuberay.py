"""deploy/kuberay/rayservice.yaml: its Serve config passes `serve-app check`, matches
configs/gpu-shared.yaml, every Ray container gets the variables `serve-app run` sets, Ray's
token auth is on, only the HTTP port is open beyond Ray's own pods (the NetworkPolicy), and the
API keys reach only the containers whose replicas read them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from serve_app.config.deploy import check_deploy_config, load_deploy_config
from serve_app.errors import ConfigError
from serve_app.ops import cluster_env
from serve_app.ops.cli import cmd_check

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = ROOT / "deploy" / "kuberay" / "rayservice.yaml"


def documents() -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs) == 2, [d["kind"] for d in docs]
    return by_kind


def rayservice() -> dict[str, Any]:
    doc = documents()["RayService"]
    assert doc["apiVersion"] == "ray.io/v1", doc["apiVersion"]
    return doc


def serve_config() -> dict[str, Any]:
    embedded = rayservice()["spec"]["serveConfigV2"]
    assert isinstance(embedded, str)  # KubeRay takes the Serve config as a YAML string
    doc: dict[str, Any] = yaml.safe_load(embedded)
    return doc


def groups() -> list[dict[str, Any]]:
    cluster = rayservice()["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]


def containers() -> list[dict[str, Any]]:
    return [c for g in groups() for c in g["template"]["spec"]["containers"]]


def test_embedded_serve_config_passes_check() -> None:
    assert check_deploy_config(serve_config()) == []


def test_serve_app_check_reads_the_manifests_serve_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert load_deploy_config(MANIFEST, rayservice=True) == serve_config()
    assert cmd_check(str(MANIFEST)) == 0
    assert capsys.readouterr().out.strip() == f"{MANIFEST}: OK"


def test_a_bad_embedded_config_is_told_with_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    service = next(d for d in docs if d["kind"] == "RayService")
    embedded = yaml.safe_load(service["spec"]["serveConfigV2"])
    embedded["applications"][0]["args"]["max_batch_size"] = 0
    service["spec"]["serveConfigV2"] = yaml.safe_dump(embedded)
    bad = tmp_path / "rayservice.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    assert cmd_check(str(bad)) == 2
    assert "applications[0].args.max_batch_size" in capsys.readouterr().err
    del service["spec"]["serveConfigV2"]
    bad.write_text(yaml.safe_dump_all(docs))
    with pytest.raises(ConfigError, match="no spec.serveConfigV2"):
        load_deploy_config(bad, rayservice=True)
    # serve-app run reads Serve configs only, and says where a manifest is read
    with pytest.raises(ConfigError, match="2 YAML documents.*serve-app check reads"):
        load_deploy_config(bad)


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


def test_rays_token_auth_is_on_and_never_turned_off() -> None:
    cluster = rayservice()["spec"]["rayClusterConfig"]
    # KubeRay then makes the token's Secret and sets RAY_AUTH_MODE/RAY_AUTH_TOKEN everywhere.
    assert cluster["authOptions"] == {"mode": "token"}
    for container in containers():
        names = {e["name"] for e in container["env"]}
        assert not names & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}, container["name"]


def test_no_dashboard_port_is_published() -> None:
    for container in containers():
        ports = {p["containerPort"] for p in container.get("ports", [])}
        assert 8265 not in ports and 52365 not in ports, container["name"]
        assert ports <= {6379, 8000}, container["name"]
    head = rayservice()["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert "dashboard-host" not in head["rayStartParams"]  # KubeRay's pod-network default


def test_the_network_policy_admits_only_http_from_beyond_rays_pods() -> None:
    policy = documents()["NetworkPolicy"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for group in groups():  # it selects every Ray pod of the service
        assert selector.items() <= group["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = policy["spec"]["ingress"]
    own = [r for r in rules if "ports" not in r]
    assert own == [{"from": [{"podSelector": {"matchLabels": selector}}]}]  # Ray's own pods
    anyone = [r for r in rules if "from" not in r]
    assert anyone == [{"ports": [{"protocol": "TCP", "port": 8000}]}]
    assert serve_config()["http_options"]["port"] == 8000
    operator = [r for r in rules if "from" in r and "ports" in r]
    assert len(operator) == 1 and operator[0]["ports"] == [{"protocol": "TCP", "port": 8265}]
    (peer,) = operator[0]["from"]
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kuberay-operator"}


def test_the_api_keys_reach_only_the_containers_whose_replicas_read_them() -> None:
    cluster = rayservice()["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    # Every deployment asks for a GPU share, so no replica can run on the head.
    assert all(
        d["ray_actor_options"]["num_gpus"] > 0
        for app in serve_config()["applications"]
        for d in app["deployments"]
    )
    (head_container,) = head["template"]["spec"]["containers"]
    assert "volumeMounts" not in head_container and "volumes" not in head["template"]["spec"]
    assert all(not e["name"].startswith("SERVE_APP_API_KEYS") for e in head_container["env"])
    for group in cluster["workerGroupSpecs"]:
        spec = group["template"]["spec"]
        (container,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        (mount,) = container["volumeMounts"]
        assert env["SERVE_APP_API_KEYS_FILE"].startswith(mount["mountPath"] + "/")
        assert mount["readOnly"] is True
        (volume,) = spec["volumes"]
        assert volume["name"] == mount["name"]
        assert volume["secret"] == {"secretName": "serve-app-api-keys", "defaultMode": 0o400}
