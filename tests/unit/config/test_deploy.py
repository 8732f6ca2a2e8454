"""config.deploy's guard on test doubles: a deploy file's runtime_env may not switch them on
unless the checker's environment says it is a test (SERVE_APP_ALLOW_TEST_DOUBLES=1)."""

from __future__ import annotations

from typing import Any

import pytest

from serve_app import env
from serve_app.config.deploy import check_deploy_config, doubles_in_runtime_envs, doubles_warning


def _doc(app_env: dict[str, str] | None, dep_env: dict[str, str] | None) -> dict[str, Any]:
    app: dict[str, Any] = {
        "name": "a",
        "route_prefix": "/",
        "import_path": "serve_app.app:build_app",
        "args": {"adapter": "embeddings"},
        "deployments": [{"name": "model", "ray_actor_options": {"num_cpus": 1}}],
    }
    if app_env is not None:
        app["runtime_env"] = {"env_vars": app_env}
    if dep_env is not None:
        app["deployments"][0]["ray_actor_options"]["runtime_env"] = {"env_vars": dep_env}
    return {"applications": [app]}


@pytest.fixture
def checker(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in (env.ALLOW_TEST_DOUBLES_VAR, *env.TEST_DOUBLE_VARS):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


APP = "applications[0].runtime_env.env_vars"
DEP = "applications[0].deployments[0].ray_actor_options.runtime_env.env_vars"


@pytest.mark.parametrize(
    ("app_env", "dep_env", "fields"),
    [
        (None, {env.FAULT_HOOKS_VAR: "1"}, [f"{DEP}.SERVE_APP_FAULT_HOOKS"]),
        ({env.FAULT_HOOKS_VAR: "0"}, None, [f"{APP}.SERVE_APP_FAULT_HOOKS"]),  # any value
        ({env.FAKE_NVML_VAR: "/s.json"}, {"OTHER": "1"}, [f"{APP}.SERVE_APP_FAKE_NVML"]),
        (
            {env.FAKE_NVML_VAR: "/s.json"},
            {env.FAULT_HOOKS_VAR: "1", env.FAKE_NVML_VAR: "/t.json"},
            [
                f"{APP}.SERVE_APP_FAKE_NVML",
                f"{DEP}.SERVE_APP_FAKE_NVML",
                f"{DEP}.SERVE_APP_FAULT_HOOKS",
            ],
        ),
    ],
)
def test_test_doubles_in_a_runtime_env_are_refused_by_field(
    checker: pytest.MonkeyPatch,
    app_env: dict[str, str] | None,
    dep_env: dict[str, str] | None,
    fields: list[str],
) -> None:
    doc = _doc(app_env, dep_env)
    assert sorted(doubles_in_runtime_envs(doc)) == sorted(fields)
    errors = check_deploy_config(doc)
    assert sorted(e.split(": ", 1)[0] for e in errors) == sorted(fields)
    assert all("SERVE_APP_ALLOW_TEST_DOUBLES=1" in e and "remove it" in e for e in errors)
    warning = doubles_warning(doc)
    assert warning is not None and all(f in warning for f in fields)


def test_the_test_flag_lets_them_through_and_a_clean_file_passes(
    checker: pytest.MonkeyPatch,
) -> None:
    hooked = _doc(None, {env.FAULT_HOOKS_VAR: "1"})
    clean = _doc({"OTHER": "1"}, {"OTHER": "1"})
    assert check_deploy_config(clean) == [] and doubles_warning(clean) is None
    checker.setenv(env.ALLOW_TEST_DOUBLES_VAR, "yes")  # only "1" counts
    assert check_deploy_config(hooked) != []
    checker.setenv(env.ALLOW_TEST_DOUBLES_VAR, "1")
    assert check_deploy_config(hooked) == []
    assert doubles_warning(hooked) is not None  # accepted, still warned about


def test_doubles_in_the_checkers_own_environment_are_warned_about(
    checker: pytest.MonkeyPatch,
) -> None:
    clean = _doc(None, None)
    checker.setenv(env.FAKE_NVML_VAR, "/s.json")
    warning = doubles_warning(clean)
    assert warning is not None and "SERVE_APP_FAKE_NVML in this environment" in warning
