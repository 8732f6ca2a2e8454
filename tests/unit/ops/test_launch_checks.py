"""ops.launch.run's checks before Ray starts: key variables that yield no key, test doubles in a
deploy file, and the warnings it prints (Ray, Serve and the deploy faked; nothing starts)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from serve_app import env
from serve_app.errors import ConfigError
from serve_app.ops import haproxy, launch
from serve_app.ops.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
HOOKS = {"runtime_env": {"env_vars": {env.FAULT_HOOKS_VAR: "1"}}}


@pytest.fixture
def doc() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    loaded["http_options"]["port"] = free_port()
    return loaded


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """run() with everything after its checks faked; the list records what was reached."""
    reached: list[str] = []
    monkeypatch.setattr(os, "environ", dict(os.environ))
    for var in (env.API_KEYS_VAR, env.API_KEYS_FILE_VAR, env.ALLOW_TEST_DOUBLES_VAR):
        os.environ.pop(var, None)
    for var in env.TEST_DOUBLE_VARS:
        os.environ.pop(var, None)
    monkeypatch.setattr(launch, "gpu_count", lambda: 0)
    monkeypatch.setattr(launch, "start_ray", lambda *a, **k: reached.append("start_ray"))
    monkeypatch.setattr(launch, "deploy", lambda doc: reached.append("deploy") or [])
    monkeypatch.setattr(launch.ray_compat, "node_cpus", lambda: 2.0)
    monkeypatch.setattr(launch, "wait_ready", lambda url, timeout_s: reached.append("ready"))
    yield reached
    haproxy.release_private_files()


def test_replicas_this_host_cannot_hold_stop_run_before_ray(
    no_cluster: list[str], doc: dict[str, Any]
) -> None:
    dep = doc["applications"][0]["deployments"][0]
    dep["num_replicas"] = 3  # one core each, on a host of two
    with pytest.raises(ConfigError) as info:
        launch.run(doc)
    assert "embeddings/model 3 x 1" in info.value.message
    assert "this host gives Ray 2" in info.value.message
    assert no_cluster == []
    dep["ray_actor_options"]["num_cpus"] = 0.5  # what the error says to do
    launch.run(doc)
    assert no_cluster == ["start_ray", "deploy", "ready"]


def test_an_empty_key_file_stops_run_before_ray(
    no_cluster: list[str], doc: dict[str, Any], tmp_path: Path
) -> None:
    empty = tmp_path / "keys.txt"
    empty.write_text("# to be filled\n")
    os.environ[env.API_KEYS_FILE_VAR] = str(empty)
    with pytest.raises(ConfigError, match="SERVE_APP_API_KEYS_FILE=.* holds no key"):
        launch.run(doc)
    assert no_cluster == []


def test_a_readable_key_file_is_warned_about(
    no_cluster: list[str], doc: dict[str, Any], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("alpha\n")
    keys.chmod(0o644)
    os.environ[env.API_KEYS_FILE_VAR] = str(keys)
    started = launch.run(doc)
    assert no_cluster == ["start_ray", "deploy", "ready"]
    assert any("readable by other users" in w for w in started.warnings)


def test_fault_hooks_in_a_deploy_file_need_the_test_flag_and_are_warned_about(
    no_cluster: list[str], doc: dict[str, Any]
) -> None:
    hooked = copy.deepcopy(doc)
    hooked["applications"][0]["deployments"][0]["ray_actor_options"].update(HOOKS)
    with pytest.raises(ConfigError, match="SERVE_APP_FAULT_HOOKS: a test double"):
        launch.run(copy.deepcopy(hooked))
    assert no_cluster == []
    os.environ[env.ALLOW_TEST_DOUBLES_VAR] = "1"
    started = launch.run(copy.deepcopy(hooked))
    assert no_cluster == ["start_ray", "deploy", "ready"]
    (warning,) = [w for w in started.warnings if "TEST DOUBLES ARE ON" in w]
    assert "ray_actor_options.runtime_env.env_vars.SERVE_APP_FAULT_HOOKS" in warning


def test_fault_hooks_in_runs_own_environment_are_warned_about(
    no_cluster: list[str], doc: dict[str, Any]
) -> None:
    assert not [w for w in launch.run(copy.deepcopy(doc)).warnings if "TEST DOUBLES" in w]
    os.environ[env.FAULT_HOOKS_VAR] = "1"
    started = launch.run(doc)
    (warning,) = [w for w in started.warnings if "TEST DOUBLES ARE ON" in w]
    assert "SERVE_APP_FAULT_HOOKS in this environment" in warning
