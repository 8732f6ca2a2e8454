"""ops.launch without a cluster: the warning for serving beyond loopback without keys or with
Ray listening beyond it, and what start_ray gives ray.init and the environment (ray.init
faked)."""

from __future__ import annotations

import os

import pytest
import ray

from serve_app.ops import launch
from serve_app.ops.listeners import Listener


@pytest.fixture(autouse=True)
def _rays_loopback_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """start_ray flips Ray's ENABLE_RAY_CLUSTER in this process: put it back after each test."""
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)


@pytest.mark.parametrize(
    ("host", "keys", "warns"),
    [
        ("127.0.0.1", False, False),
        ("127.0.0.2", False, False),
        ("localhost", False, False),
        ("::1", False, False),
        ("0.0.0.0", False, True),
        ("10.1.2.3", False, True),
        ("gpu-host.example", False, True),
        ("0.0.0.0", True, False),
    ],
)
def test_serving_beyond_loopback_without_keys_warns(host: str, keys: bool, warns: bool) -> None:
    warning = launch.exposure_warning(host, keys)
    assert (warning is not None) == warns
    if warning:
        assert warning.startswith("WARNING") and "SERVE_APP_API_KEYS" in warning


def test_ray_listening_beyond_loopback_is_noted_and_a_warning_without_its_token() -> None:
    grpc = Listener("::", 41041, 7, "ray::ServeReplica:embeddings:model")
    assert launch.exposure_warning("127.0.0.1", False, ray_listeners=[grpc]) is None
    note = launch.ray_exposure_note([grpc])
    assert note is not None and "[::]:41041 (ray::ServeReplica:embeddings:model)" in note
    assert "needs Ray's token" in note and "firewall" in note
    assert "Replicas that start later" in note  # the list is read once, at start-up
    assert launch.ray_exposure_note([]) is None
    open_ = launch.exposure_warning("127.0.0.1", True, ray_auth_enabled=False, ray_listeners=[grpc])
    assert open_ is not None and open_.startswith("WARNING") and "authentication is OFF" in open_
    assert "41041" in open_
    both = launch.exposure_warning("0.0.0.0", False, ray_auth_enabled=False, ray_listeners=[grpc])
    assert both is not None and "SERVE_APP_API_KEYS" in both and "41041" in both


def test_start_ray_keeps_the_dashboard_off_and_ray_on_loopback_with_its_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray._private import ray_constants

    seen: dict[str, object] = {}
    monkeypatch.setattr(os, "environ", dict(os.environ))  # start_ray sets variables
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    auth = launch.start_ray(num_gpus=0, haproxy=True)
    assert seen["include_dashboard"] is False
    assert seen["_node_ip_address"] == "127.0.0.1"
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # Ray keeps it on loopback
    assert ray_constants.ENABLE_RAY_CLUSTER is False
    assert os.environ["RAY_AUTH_MODE"] == "token" and auth.enabled
    assert launch.http_address({}) == ("127.0.0.1", 8000)  # serve-app run's default bind


def test_start_ray_refuses_disabled_auth_before_ray_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from serve_app.errors import StartupError

    monkeypatch.setattr(os, "environ", dict(os.environ))
    os.environ["RAY_AUTH_MODE"] = "disabled"
    monkeypatch.setattr(ray, "init", lambda **kwargs: pytest.fail("Ray started"))
    with pytest.raises(StartupError, match="--insecure-no-ray-auth"):
        launch.start_ray(num_gpus=0, haproxy=True)


def test_start_ray_keeps_the_users_own_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", dict(os.environ))
    os.environ["RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER"] = "1s"
    os.environ.pop("RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S", None)
    monkeypatch.setattr(ray, "init", lambda **kwargs: None)
    launch.start_ray(num_gpus=0, haproxy=True, request_timeout_s=60.0)
    assert os.environ["RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER"] == "1s"
    assert os.environ["RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"] == "65"


def test_start_ray_passes_rays_system_config_and_leaves_haproxy_off_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, object] = {}
    monkeypatch.setattr(os, "environ", dict(os.environ))
    os.environ.pop("RAY_SERVE_ENABLE_HA_PROXY", None)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    preload = {"preload_python_modules": ["torch", "serve_app.preloaded"]}
    launch.start_ray(num_gpus=0, haproxy=False, system_config=preload)
    assert seen["_system_config"] == preload
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ
    launch.start_ray(num_gpus=0, haproxy=False, system_config={})
    assert seen["_system_config"] is None


def test_cpu_fallback_drops_each_gpu_share_says_so_and_leaves_the_input_alone():
    doc = {
        "applications": [
            {
                "name": "embeddings",
                "deployments": [{"name": "model", "ray_actor_options": {"num_gpus": 0.25}}],
            },
            {"deployments": [{"name": "cpu_only", "ray_actor_options": {"num_cpus": 1}}]},
        ]
    }
    out, notes = launch.cpu_fallback(doc)
    assert out["applications"][0]["deployments"][0]["ray_actor_options"]["num_gpus"] == 0
    assert doc["applications"][0]["deployments"][0]["ray_actor_options"]["num_gpus"] == 0.25
    assert notes == [
        "no GPU: deployment embeddings/model asks for num_gpus=0.25; running it on the CPU instead"
    ]
