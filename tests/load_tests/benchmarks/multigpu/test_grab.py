"""load_tests.benchmarks.multigpu.grab: configs/controller.yaml pinned once per GPU."""

from __future__ import annotations

from load_tests.benchmarks.multigpu.common import FAKE_GPUS
from load_tests.benchmarks.multigpu.grab import POLICY_OVERRIDES, grab_config

GIB = 1 << 30
A, B = FAKE_GPUS


def test_grab_config_pins_controller_yaml_once_per_gpu() -> None:
    from serve_app.config.deploy import check_deploy_config

    doc = grab_config([A, B], 8123, 4, "cuda")
    assert check_deploy_config(doc) == []
    assert [(a["name"], a["route_prefix"]) for a in doc["applications"]] == [
        ("gpu0", "/gpu0"),
        ("gpu1", "/gpu1"),
    ]
    for app, uuid in zip(doc["applications"], (A, B), strict=True):
        assert (app["args"]["load_format"], app["args"]["dtype"]) == ("dummy", "float16")
        dep = app["deployments"][0]
        assert dep["ray_actor_options"] == {
            "num_cpus": 1,
            "num_gpus": 0.25,
            "label_selector": {"serve-app/gpu": uuid},
        }
        auto = dep["autoscaling_config"]
        assert (auto["min_replicas"], auto["max_replicas"]) == (1, 4)
        kwargs = auto["policy"]["policy_kwargs"]
        assert kwargs["safety_margin_bytes"] == 2 * GIB  # the file's margin is kept
        assert {k: kwargs[k] for k in POLICY_OVERRIDES} == POLICY_OVERRIDES
    cpu = grab_config([A, B], 8123, 2, "cpu")["applications"][1]["deployments"][0]
    assert cpu["ray_actor_options"]["num_cpus"] == 0.25
