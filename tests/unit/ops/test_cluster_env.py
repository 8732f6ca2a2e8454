"""ops.cluster_env: HAProxy's server timeout from the apps' request timeouts, and every variable
of the reliability environment, the retry-on value with its second line."""

from __future__ import annotations

from serve_app.ops import cluster_env


def test_timeout_server_is_the_request_timeout_plus_a_margin() -> None:
    assert cluster_env.haproxy_timeout_server_s(30.0) == "35"
    assert cluster_env.haproxy_timeout_server_s(10.0) == "15"
    assert cluster_env.haproxy_timeout_server_s(2.5) == "8"  # whole seconds, rounded up


def test_longest_request_timeout_of_the_config() -> None:
    doc = {
        "applications": [
            {"name": "a", "args": {"request_timeout_s": 12}},
            {"name": "b", "args": {}},  # the default, 30 s
            {"name": "c"},
        ]
    }
    assert cluster_env.longest_request_timeout_s(doc) == 30.0
    doc["applications"][0]["args"]["request_timeout_s"] = 120
    assert cluster_env.longest_request_timeout_s(doc) == 120.0
    assert cluster_env.longest_request_timeout_s({}) == 30.0


def test_reliability_env_names_every_setting() -> None:
    env = cluster_env.reliability_env(10.0)
    assert env["RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"] == "15"
    assert env["RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER"] == "2s"
    assert env["RAY_SERVE_FORCE_STOP_UNHEALTHY_REPLICAS"] == "1"
    assert "response-timeout" in env["RAY_SERVE_HAPROXY_RETRY_ON"]


def test_http_buffer_request_and_the_request_timeout_ride_on_the_retry_on_value() -> None:
    value = cluster_env.HAPROXY_RETRY_DEFAULTS["RAY_SERVE_HAPROXY_RETRY_ON"]
    assert value.split("\n    ") == [
        "conn-failure empty-response response-timeout",
        "option http-buffer-request",
        "timeout http-request 10s",
    ]
    assert cluster_env.cluster_env()["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
