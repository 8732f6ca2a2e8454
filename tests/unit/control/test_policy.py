"""The Serve policy on hand-built AutoscalingContexts (real Ray classes, no cluster), loaded
the way the Serve controller loads it."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from ray.serve._private.autoscaling_state import _resolve_policy_callable
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingPolicy

from serve_app.control import ledger
from serve_app.control import policy as autoscale
from serve_app.control.planner import Reason
from serve_app.control.policy import HeadroomPolicy, inputs_from_context
from serve_app.control.readings import gpu_key, gpu_label
from serve_app.control.settings import ControllerConfig, config_errors
from tests.unit.control.builders import GIB, KWARGS, NOW, UUID0, context, replica_stats

REFRESHED: list[Any] = []  # decisions whose gauges were set again, not counted (changed=False)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Any:
    ledger._LEDGER.entries.clear()
    exported: list[tuple[str, str, Any]] = []
    REFRESHED.clear()

    class FakeGauges:
        def export(self, app: str, deployment: str, decision: Any, changed: bool = True) -> None:
            if changed:
                exported.append((app, deployment, decision))
            else:
                REFRESHED.append(decision)

    monkeypatch.setattr(autoscale, "_Gauges", FakeGauges)
    yield exported
    ledger._LEDGER.entries.clear()


def test_inputs_from_context_uses_the_newest_points() -> None:
    inputs = inputs_from_context(context(), ControllerConfig())
    label = gpu_label(gpu_key(UUID0))
    assert inputs.running_replicas == 2 and inputs.ongoing_requests == 3.0
    assert [g.uuid for g in inputs.gpus] == [label]
    assert inputs.gpus[0].free_bytes == 40 * GIB and inputs.gpus[0].timestamp_s == NOW
    assert [r.gpu_uuid for r in inputs.replicas] == [label, label]
    assert inputs.replicas[0].budget_bytes == 8 * GIB
    assert inputs.ray_gpu_available == 0.5
    assert (inputs.min_replicas, inputs.max_replicas) == (1, 4)


def test_policy_scales_up_logs_once_and_exports(_clean: list[Any]) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    autoscale.logger.addHandler(handler)
    autoscale.logger.setLevel(logging.INFO)
    try:
        policy = HeadroomPolicy(**KWARGS)
        target, state = policy(context(load=5.0, policy_state={"mine": 1}))
        assert target == 3
        assert state == {"mine": 1, "serve_app_target": 3, "serve_app_reason": "scale_up"}
        policy(context(load=5.0))  # same decision: no new log line or export
    finally:
        autoscale.logger.removeHandler(handler)
    assert len(records) == 1 and "app/model: 2 -> 3 (scale_up)" in records[0].getMessage()
    assert [(a, d, x.reason) for a, d, x in _clean] == [("app", "model", Reason.SCALE_UP)]


def test_policy_sets_its_gauges_again_between_decisions(
    monkeypatch: pytest.MonkeyPatch, _clean: list[Any]
) -> None:
    # Ray's metrics agent drops a gauge not set for two export intervals (policy.GAUGE_REFRESH_S)
    clock = [100.0]
    monkeypatch.setattr(autoscale.time, "monotonic", lambda: clock[0])
    policy = HeadroomPolicy(**KWARGS)
    policy(context(load=5.0))
    clock[0] += autoscale.GAUGE_REFRESH_S / 2
    policy(context(load=5.0))  # too soon: nothing
    assert REFRESHED == []
    clock[0] += autoscale.GAUGE_REFRESH_S
    policy(context(load=5.0))  # the same decision, set again but not counted again
    assert [d.reason for d in REFRESHED] == [Reason.SCALE_UP]
    assert len(_clean) == 1


def test_policy_holds_on_stale_or_missing_readings() -> None:
    policy = HeadroomPolicy(**KWARGS)
    stale = [replica_stats(40 * GIB, at=NOW - 11)] * 2
    assert policy(context(load=9.0, stats=stale))[0] == 2
    assert policy(context(load=9.0, stats=[replica_stats(40 * GIB)]))[0] == 2  # 1 of 2 reported
    assert policy(context(load=9.0, stats=[{}, {}]))[0] == 2


def test_policy_sheds_when_another_process_takes_memory() -> None:
    policy = HeadroomPolicy(**KWARGS)
    squeezed = [replica_stats(1 * GIB)] * 3
    assert policy(context(current=3, stats=squeezed))[0] == 2


def test_target_ongoing_requests_comes_from_autoscaling_config_unless_set() -> None:
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=1)
    assert HeadroomPolicy().config_for(context(config=cfg)).target_ongoing_requests == 1.0
    explicit = HeadroomPolicy(target_ongoing_requests=5)
    assert explicit.config_for(context(config=cfg)).target_ongoing_requests == 5.0


def test_two_deployments_cannot_spend_the_same_free_bytes() -> None:
    # 17 GiB free fits one 8 GiB replica + 2 GiB margin, not two
    squeezed = [replica_stats(17 * GIB)] * 2
    first = HeadroomPolicy(**KWARGS)(context(name="a", load=5.0, stats=squeezed))
    second = HeadroomPolicy(**KWARGS)(context(name="b", load=5.0, stats=squeezed))
    assert (first[0], second[0]) == (3, 2)
    assert second[1]["serve_app_reason"] == "hold_no_headroom"


def test_policy_failure_holds_instead_of_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(autoscale, "plan", boom)
    assert HeadroomPolicy()(context(load=9.0, policy_state={"k": 1})) == (2, {"k": 1})


def test_bad_policy_kwargs_fail_at_construction_with_the_field() -> None:
    with pytest.raises(ValueError, match="safety_margin_bytes"):
        HeadroomPolicy(safety_margin_bytes=-5)
    assert config_errors({"upscale_cooldown_s": "soon"})[0].startswith("upscale_cooldown_s:")


def test_through_rays_own_policy_loading_and_wrapping() -> None:
    """Load the policy the way the Serve controller does: import path + policy_kwargs, cloudpickle
    by value, instantiate the class once, wrap with Ray's bounds/delay/factor logic."""
    spec = AutoscalingPolicy(
        policy_function="serve_app.autoscale:HeadroomPolicy", policy_kwargs=KWARGS
    )
    policy = _apply_autoscaling_config(_resolve_policy_callable(spec))
    cfg = AutoscalingConfig(
        min_replicas=1,
        max_replicas=4,
        target_ongoing_requests=2,
        upscale_delay_s=0,
        downscale_delay_s=0,
        policy=spec,
    )
    target, state = policy(context(load=5.0, config=cfg))
    assert target == 3 and state["serve_app_reason"] == "scale_up"
    # with Ray's default upscale_delay_s (30 s) the same decision would wait: document it
    slow = AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=2, policy=spec)
    assert policy(context(load=5.0, config=slow))[0] == 2


def test_plain_function_policy_uses_defaults() -> None:
    target, state = autoscale.headroom_policy(context(load=5.0))
    assert target == 3 and state["serve_app_reason"] == "scale_up"


def test_reservation_settles_when_replicas_run_and_then_expires() -> None:
    policy = HeadroomPolicy(**KWARGS)
    policy(context(name="a", load=5.0))
    entry = ledger._LEDGER.entries["app/a"]
    assert entry.settled_at_s is None and entry.bytes == 8 * GIB
    policy(context(name="a", current=2, target=3, load=5.0))  # still starting
    assert ledger._LEDGER.entries["app/a"].settled_at_s is None
    policy(context(name="a", current=3, load=5.0, stats=[replica_stats(30 * GIB)] * 3, last_up=NOW))
    assert ledger._LEDGER.entries["app/a"].settled_at_s == NOW
    later = context(name="a", current=3, load=5.0, stats=[replica_stats(30 * GIB)] * 3)
    later.current_time = NOW + 16  # past max_reading_age_s + max_clock_skew_s
    policy(later)
    assert "app/a" not in ledger._LEDGER.entries
