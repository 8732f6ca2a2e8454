"""control.settings: policy_kwargs validated with the field and the fix, the reading delay
through Ray Serve's periods, and ``serve-app check`` on a deploy config with the headroom
controller on (the shipped configs/controller.yaml passes, a bad kwarg names its field path)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from serve_app.config.deploy import check_deploy_config, load_deploy_config
from serve_app.control.settings import config_errors, reading_delay_errors, reading_delay_s
from serve_app.ops.cli import main

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "controller.yaml"
KWARGS_PATH = "applications[0].deployments[0].autoscaling_config.policy.policy_kwargs"

# metrics_interval_s is deprecated in favour of environment variables that Ray 2.60 does not read.
pytestmark = pytest.mark.filterwarnings("ignore:The `metrics_interval_s`:DeprecationWarning")


def controller_doc() -> dict[str, Any]:
    return copy.deepcopy(load_deploy_config(CONFIG))


def policy_kwargs(doc: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = doc["applications"][0]["deployments"][0]["autoscaling_config"][
        "policy"
    ]["policy_kwargs"]
    return kwargs


def test_shipped_controller_config_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    doc = controller_doc()
    assert check_deploy_config(doc) == []
    dep = doc["applications"][0]["deployments"][0]
    assert dep["ray_actor_options"]["num_gpus"] == 0.25
    auto = dep["autoscaling_config"]
    assert (auto["min_replicas"], auto["max_replicas"]) == (1, 4)
    assert (auto["upscale_delay_s"], auto["downscale_delay_s"]) == (0, 0)
    assert auto["policy"]["policy_function"] == "serve_app.autoscale:HeadroomPolicy"
    assert main(["check", str(CONFIG)]) == 0
    assert capsys.readouterr().out == f"{CONFIG}: OK\n"


def test_bad_policy_kwarg_is_reported_with_its_field_path() -> None:
    doc = controller_doc()
    policy_kwargs(doc)["upscale_cooldown_s"] = -1
    assert check_deploy_config(doc) == [
        f"{KWARGS_PATH}.upscale_cooldown_s: Input should be greater than or equal to 0 "
        "(got -1); set seconds between changes before a scale-up, e.g. 30"
    ]


def test_unknown_policy_kwarg_lists_the_known_ones() -> None:
    doc = controller_doc()
    policy_kwargs(doc)["safety_margin_gib"] = 2
    assert check_deploy_config(doc) == [
        f"{KWARGS_PATH}.safety_margin_gib: Extra inputs are not permitted (got 2); remove it; "
        "known fields: downscale_cooldown_s, downscale_threshold, footprint_margin_fraction, "
        "max_clock_skew_s, max_reading_age_s, max_step_up, safety_margin_bytes, "
        "shed_cooldown_s, target_ongoing_requests, upscale_cooldown_s"
    ]


def test_cli_check_prints_the_bad_kwarg_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = CONFIG.read_text().replace("max_reading_age_s: 30", "max_reading_age_s: 0")
    assert text != CONFIG.read_text()
    bad = tmp_path / "controller.yaml"
    bad.write_text(text)
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {KWARGS_PATH}.max_reading_age_s: Input should be greater than 0")
    assert "(got 0); set the oldest GPU reading to trust" in err


def test_cross_field_problem_is_reported_under_policy_kwargs() -> None:
    doc = controller_doc()
    policy_kwargs(doc)["shed_cooldown_s"] = 60  # slower than upscale_cooldown_s (30)
    errors = check_deploy_config(doc)
    assert len(errors) == 1
    # A problem across fields is reported at policy_kwargs itself, its path not doubled.
    assert errors[0].startswith(f"{KWARGS_PATH}: Value error, ")
    assert errors[0].endswith(
        "shed_cooldown_s (60.0) is longer than upscale_cooldown_s (30.0); memory pressure "
        "must be answered at least as fast as load: lower shed_cooldown_s"
    )


def test_policies_outside_serve_app_are_not_checked_here() -> None:
    doc = controller_doc()
    policy = doc["applications"][0]["deployments"][0]["autoscaling_config"]["policy"]
    policy["policy_function"] = "ray.serve.autoscaling_policy:default_autoscaling_policy"
    policy["policy_kwargs"] = {"anything": 1}
    assert check_deploy_config(doc) == []


def test_shipped_config_decides_within_1_s_of_a_reading() -> None:
    auto = controller_doc()["applications"][0]["deployments"][0]["autoscaling_config"]
    assert reading_delay_s(auto) <= 1.0


def test_a_max_reading_age_that_readings_outgrow_is_reported() -> None:
    doc = controller_doc()
    doc["applications"][0]["deployments"][0]["autoscaling_config"]["metrics_interval_s"] = 2
    policy_kwargs(doc)["max_reading_age_s"] = 3
    (msg,) = check_deploy_config(doc)
    assert msg.startswith(f"{KWARGS_PATH}.max_reading_age_s: 3 s is not above the age")


def test_config_errors_name_the_field_and_the_fix() -> None:
    errors = config_errors({"safety_margin_bytes": -1, "downscale_threshold": 1.5, "bogus": 1})
    assert len(errors) == 3
    assert errors[0].startswith("safety_margin_bytes:") and "2147483648" in errors[0]
    assert errors[1].startswith("downscale_threshold:") and "(0, 1)" in errors[1]
    assert errors[2].startswith("bogus:") and "remove it" in errors[2]
    shed = config_errors({"shed_cooldown_s": 60, "upscale_cooldown_s": 30})
    assert len(shed) == 1 and "lower shed_cooldown_s" in shed[0]
    assert config_errors({}) == []


def test_reading_delay_follows_rays_record_and_push_periods() -> None:
    # Ray's defaults: record every min(30 x 0.2, 10) = 6 s, push every 10 s, loop 0.1 s.
    assert reading_delay_s({}) == pytest.approx(16.1)
    # record min(5 x 0.2, 1) = 1, push 1: the settings before the 1 s shed target.
    assert reading_delay_s({"metrics_interval_s": 1, "look_back_period_s": 5}) == (
        pytest.approx(2.1)
    )
    # configs/controller.yaml: record min(1.0, 0.25), push 0.25 -> within 1 s of a reading.
    fast = {"metrics_interval_s": 0.25, "look_back_period_s": 5}
    assert reading_delay_s(fast) == pytest.approx(0.6)
    assert reading_delay_s({"metrics_interval_s": 1, "look_back_period_s": 2}) == (
        pytest.approx(1.5)  # record every 0.4 s
    )


def test_a_max_reading_age_the_readings_outgrow_is_an_error() -> None:
    def config(max_age: float | None, push: float) -> dict[str, Any]:
        kwargs = {} if max_age is None else {"max_reading_age_s": max_age}
        return {
            "metrics_interval_s": push,
            "look_back_period_s": 5,
            "policy": {"policy_kwargs": kwargs},
        }

    assert reading_delay_errors(config(None, 1)) == []  # default 30 s
    assert reading_delay_errors(config(2, 0.25)) == []  # 1 + 0.6 = 1.6 s at most
    (msg,) = reading_delay_errors(config(2, 1))  # 1 + 2.1 = 3.1 s
    assert msg.startswith("max_reading_age_s: 2 s is not above") and "3.10 s" in msg
    assert reading_delay_errors({"metrics_interval_s": 10}) == []  # 17.1 s < 30 s
