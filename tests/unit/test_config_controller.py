"""``serve-app check`` on a deploy config with the headroom controller on: the shipped
configs/controller.yaml passes, and a bad policy kwarg is reported with its field path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from serve_app.config.deploy import check_deploy_config, load_deploy_config
from serve_app.ops.cli import main

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "controller.yaml"
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
    from serve_app.control.policy import reading_delay_s

    auto = controller_doc()["applications"][0]["deployments"][0]["autoscaling_config"]
    assert reading_delay_s(auto) <= 1.0


def test_a_max_reading_age_that_readings_outgrow_is_reported() -> None:
    doc = controller_doc()
    doc["applications"][0]["deployments"][0]["autoscaling_config"]["metrics_interval_s"] = 2
    policy_kwargs(doc)["max_reading_age_s"] = 3
    (msg,) = check_deploy_config(doc)
    assert msg.startswith(f"{KWARGS_PATH}.max_reading_age_s: 3 s is not above the age")
