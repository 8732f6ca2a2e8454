"""launch.py's reliability settings: HAProxy's server timeout from the apps' request timeouts,
and the environment start_ray fills in without overriding the user's own values."""

from __future__ import annotations

import os

import pytest

from serve_app.ops import launch


def test_timeout_server_is_the_request_timeout_plus_a_margin() -> None:
    assert launch.haproxy_timeout_server_s(30.0) == "35"
    assert launch.haproxy_timeout_server_s(10.0) == "15"
    assert launch.haproxy_timeout_server_s(2.5) == "8"  # whole seconds, rounded up


def test_longest_request_timeout_of_the_config() -> None:
    doc = {
        "applications": [
            {"name": "a", "args": {"request_timeout_s": 12}},
            {"name": "b", "args": {}},  # the default, 30 s
            {"name": "c"},
        ]
    }
    assert launch.longest_request_timeout_s(doc) == 30.0
    doc["applications"][0]["args"]["request_timeout_s"] = 120
    assert launch.longest_request_timeout_s(doc) == 120.0
    assert launch.longest_request_timeout_s({}) == 30.0


def test_reliability_env_names_every_setting() -> None:
    env = launch.reliability_env(10.0)
    assert env["RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"] == "15"
    assert env["RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER"] == "2s"
    assert env["RAY_SERVE_FORCE_STOP_UNHEALTHY_REPLICAS"] == "1"
    assert "response-timeout" in env["RAY_SERVE_HAPROXY_RETRY_ON"]


def test_start_ray_keeps_the_users_own_values(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    monkeypatch.setattr(os, "environ", dict(os.environ))
    os.environ["RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER"] = "1s"
    os.environ.pop("RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S", None)
    monkeypatch.setattr(ray, "init", lambda **kwargs: None)
    launch.start_ray(num_gpus=0, haproxy=True, request_timeout_s=60.0)
    assert os.environ["RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER"] == "1s"
    assert os.environ["RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"] == "65"
