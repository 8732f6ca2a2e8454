"""ops.node: the `ray start` command line and environment `serve-app node` builds (nothing is
started here; tests/integration/test_two_nodes.py starts its nodes through it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serve_app.errors import StartupError
from serve_app.ops import cli, node
from serve_app.ops.cluster_env import cluster_env

RAY = ["ray"]


def test_a_head_keeps_the_dashboard_on_loopback_and_carries_the_preload_list() -> None:
    preload = {"preload_python_modules": ["torch", "serve_app.preloaded"]}
    cmd = node.ray_start_command(
        RAY, node.NodeSpec(head=True, port=6380, num_gpus=1, system_config=preload)
    )
    assert cmd[:5] == ["ray", "start", "--head", "--port", "6380"]
    assert cmd[cmd.index("--dashboard-host") + 1] == "127.0.0.1"
    assert json.loads(cmd[cmd.index("--system-config") + 1]) == preload
    assert cmd[cmd.index("--num-gpus") + 1] == "1" and "--disable-usage-stats" in cmd
    assert "--address" not in cmd and "--node-ip-address" not in cmd


def test_a_worker_joins_its_head_and_passes_rays_own_options_last() -> None:
    spec = node.NodeSpec(
        head=False,
        address="10.0.0.1:6379",
        node_ip_address="10.0.0.2",
        num_cpus=1.5,
        ray_args=("--block", "--labels", "a=b"),
    )
    cmd = node.ray_start_command(RAY, spec)
    assert cmd[:4] == ["ray", "start", "--address", "10.0.0.1:6379"]
    assert cmd[cmd.index("--node-ip-address") + 1] == "10.0.0.2"
    assert cmd[cmd.index("--num-cpus") + 1] == "1.5"
    assert cmd[-3:] == ["--block", "--labels", "a=b"]
    assert "--head" not in cmd and "--system-config" not in cmd


def test_a_node_is_a_head_or_a_worker() -> None:
    with pytest.raises(ValueError):
        node.NodeSpec(head=True, address="x:1")
    with pytest.raises(ValueError):
        node.NodeSpec(head=False)


def test_the_environment_gets_cluster_env_and_a_token_and_keeps_the_users_values() -> None:
    mine = {"RAY_AUTH_TOKEN": "t", "RAY_SERVE_HAPROXY_RETRIES": "3", "RAY_ADDRESS": "x:1"}
    env, auth, differs = node.node_environ(mine, head=False, request_timeout_s=60.0)
    wanted = cluster_env(60.0)
    assert env["RAY_AUTH_MODE"] == "token" and auth.enabled and "RAY_ADDRESS" not in env
    assert env["RAY_SERVE_HAPROXY_RETRIES"] == "3"  # the user's own value wins...
    assert list(differs) == ["RAY_SERVE_HAPROXY_RETRIES"]  # ...and is named
    assert "'3', serve_app sets '1'" in differs["RAY_SERVE_HAPROXY_RETRIES"]
    assert all(env[k] == v for k, v in wanted.items() if k != "RAY_SERVE_HAPROXY_RETRIES")
    assert env["RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"] == "65"
    assert mine == {"RAY_AUTH_TOKEN": "t", "RAY_SERVE_HAPROXY_RETRIES": "3", "RAY_ADDRESS": "x:1"}


def test_a_worker_without_the_heads_token_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(StartupError, match="head's token"):
        node.node_environ({}, head=False)


def test_env_differences_name_what_is_missing_or_other() -> None:
    got = node.env_differences({"A": "1", "B": "2"}, {"A": "1", "B": "3", "C": "4"})
    assert got == {"B": "'2', serve_app sets '3'", "C": "unset, serve_app sets '4'"}


def test_the_cli_dry_run_prints_the_command_and_where_the_token_is(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", "secret-token-value")
    code = cli.main(
        [
            "node",
            "--head",
            "--port",
            "6390",
            "--config",
            "configs/gpu-shared.yaml",
            "--dry-run",
            "--",
            "--block",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "token authentication on" in out and "the RAY_AUTH_TOKEN variable" in out
    assert "secret-token-value" not in out
    line = next(ln for ln in out.splitlines() if ln.startswith("$ "))
    assert " start --head --port 6390 " in line and line.endswith("--disable-usage-stats --block")
    assert "preload_python_modules" in line  # gpu-shared.yaml's warm workers


def test_the_cli_refuses_disabled_auth_with_the_flag_to_use(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert cli.main(["node", "--head", "--dry-run"]) == 2
    assert "--insecure-no-ray-auth" in capsys.readouterr().err
    assert cli.main(["node", "--head", "--dry-run", "--insecure-no-ray-auth"]) == 0
    assert "token authentication OFF" in capsys.readouterr().out
