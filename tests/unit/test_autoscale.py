"""The Serve policy on hand-built AutoscalingContexts (real Ray classes, no cluster), the
replica-side stats, and the monitor object without Ray."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from ray.serve._private.autoscaling_state import _resolve_policy_callable
from ray.serve._private.common import DeploymentID, ReplicaID, TimeStampedValue
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy

from serve_app.control import monitor
from serve_app.control import policy as autoscale
from serve_app.control.planner import ControllerConfig, Reason
from serve_app.control.policy import (
    METRIC_GPU_KEY,
    HeadroomPolicy,
    inputs_from_context,
    stats_from_readings,
    validate_policy_kwargs,
)
from serve_app.gpu import nvml
from serve_app.testing.nvml import ScriptedSource

GIB = 1 << 30
NOW = 50_000.0
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
KWARGS = {"upscale_cooldown_s": 30.0, "downscale_cooldown_s": 60.0, "max_reading_age_s": 10.0}


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Any:
    autoscale._LEDGER.entries.clear()
    exported: list[tuple[str, str, Any]] = []

    class FakeGauges:
        def export(self, app: str, deployment: str, decision: Any) -> None:
            exported.append((app, deployment, decision))

    monkeypatch.setattr(autoscale, "_Gauges", FakeGauges)
    yield exported
    autoscale._LEDGER.entries.clear()


def readings(free: int, *, at: float = NOW, total: int = 80 * GIB) -> monitor.NodeReadings:
    gpu = monitor.GpuReading(UUID0, total, free, total - free, at)
    return monitor.NodeReadings("node-a", (gpu,), None, at, ray_gpu_available=0.5, ray_gpu_at_s=at)


def replica_stats(free: int, *, at: float = NOW, budget: int = 8 * GIB) -> dict[str, float]:
    return stats_from_readings(
        budget_bytes=budget,
        peak_bytes=4 * GIB,
        gpu_uuid=UUID0,
        gpu_fraction=0.25,
        nvml_process_bytes=None,
        readings=readings(free, at=at),
    )


def context(
    *,
    name: str = "model",
    current: int = 2,
    target: int | None = None,
    load: float = 3.0,
    stats: list[dict[str, float]] | None = None,
    config: AutoscalingConfig | None = None,
    policy_state: dict[str, Any] | None = None,
    last_up: float | None = None,
) -> AutoscalingContext:
    dep = DeploymentID(name=name, app_name="app")
    rids = [ReplicaID(unique_id=f"{name}-r{i}", deployment_id=dep) for i in range(current)]
    stats = stats if stats is not None else [replica_stats(40 * GIB)] * current
    raw: dict[str, dict[ReplicaID, list[TimeStampedValue]]] = {}
    for rid, values in zip(rids, stats, strict=False):
        for key, value in values.items():
            # an older point first: the policy must use the newest one
            raw.setdefault(key, {})[rid] = [
                TimeStampedValue(NOW - 20, -123.0),
                TimeStampedValue(NOW - 1, value),
            ]
    cfg = config or AutoscalingConfig(
        min_replicas=1,
        max_replicas=4,
        target_ongoing_requests=2,
        upscale_delay_s=0,
        downscale_delay_s=0,
    )
    return AutoscalingContext(
        deployment_id=dep,
        deployment_name=name,
        app_name="app",
        current_num_replicas=current,
        target_num_replicas=current if target is None else target,
        running_replicas=rids,
        total_num_requests=load,
        total_queued_requests=0.0,
        aggregated_metrics=None,
        raw_metrics=raw,
        capacity_adjusted_min_replicas=cfg.min_replicas,
        capacity_adjusted_max_replicas=cfg.max_replicas,
        policy_state=policy_state or {},
        last_scale_up_time=last_up,
        last_scale_down_time=None,
        current_time=NOW,
        config=cfg,
    )


def test_replica_stats_are_floats_with_the_documented_keys() -> None:
    stats = replica_stats(40 * GIB)
    assert all(isinstance(v, float) for v in stats.values())
    key = monitor.gpu_key(UUID0)
    assert key < 2**53 and stats[METRIC_GPU_KEY] == float(key)
    assert stats[autoscale.gpu_metric_name(key, "free_bytes")] == float(40 * GIB)
    assert stats[autoscale.METRIC_NVML_OK] == 1.0
    failed = monitor.NodeReadings("n", (), nvml.NvmlError(nvml.NvmlErrorKind.GPU_LOST, "x"), NOW)
    no_gpu = stats_from_readings(
        budget_bytes=1,
        peak_bytes=1,
        gpu_uuid=UUID0,
        gpu_fraction=0.25,
        nvml_process_bytes=5,
        readings=failed,
    )
    assert no_gpu[autoscale.METRIC_NVML_OK] == 0.0
    assert no_gpu[autoscale.METRIC_NVML_PROCESS_BYTES] == 5.0
    assert not any(autoscale._GPU_METRIC.match(k) for k in no_gpu)


def test_replica_autoscaling_stats_on_cpu_needs_no_monitor() -> None:
    stats = asyncio.run(
        autoscale.replica_autoscaling_stats(
            budget_bytes=0, peak_bytes=0, gpu_uuid=None, gpu_fraction=0.0
        )
    )
    assert stats[METRIC_GPU_KEY] == 0.0 and stats[autoscale.METRIC_GPU_FRACTION] == 0.0


def test_inputs_from_context_uses_the_newest_points() -> None:
    inputs = inputs_from_context(context(), ControllerConfig())
    label = monitor.gpu_label(monitor.gpu_key(UUID0))
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
    assert validate_policy_kwargs({"upscale_cooldown_s": "soon"})[0].startswith(
        "upscale_cooldown_s:"
    )


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


def test_monitor_samples_and_keeps_decisions(tmp_path: Path) -> None:
    script = tmp_path / "nvml.json"
    script.write_text(json.dumps({"devices": {UUID0: {"total_bytes": 100, "free_bytes": 60}}}))
    nvml.set_source(ScriptedSource(script, clock=lambda: 7.0))
    try:
        mon = monitor.GpuMonitor("node-a", clock=lambda: 7.0, ray_gpu=lambda: 0.75, start=False)
        sample = mon.sample_once()
    finally:
        nvml.set_source(None)
    assert sample.gpus == (monitor.GpuReading(UUID0, 100, 60, 40, 7.0),)
    assert sample.error is None and sample.ray_gpu_available == 0.75
    assert mon.latest() == sample
    record = monitor.DecisionRecord("app/model", 3, 2, "up", "scale_up", "load", 7.0)
    mon.record_decision(record)
    assert mon.snapshot() == (sample, {"app/model": record}, [])


def test_monitor_reports_nvml_errors_as_data() -> None:
    error = nvml.NvmlError(nvml.NvmlErrorKind.LIBRARY_NOT_FOUND, "no driver")
    sample = monitor.sample_node("node-a", 1.0, read=lambda: error)
    assert sample.gpus == () and sample.error == error


def test_reservation_settles_when_replicas_run_and_then_expires() -> None:
    policy = HeadroomPolicy(**KWARGS)
    policy(context(name="a", load=5.0))
    entry = autoscale._LEDGER.entries["app/a"]
    assert entry.settled_at_s is None and entry.bytes == 8 * GIB
    policy(context(name="a", current=2, target=3, load=5.0))  # still starting
    assert autoscale._LEDGER.entries["app/a"].settled_at_s is None
    policy(context(name="a", current=3, load=5.0, stats=[replica_stats(30 * GIB)] * 3, last_up=NOW))
    assert autoscale._LEDGER.entries["app/a"].settled_at_s == NOW
    later = context(name="a", current=3, load=5.0, stats=[replica_stats(30 * GIB)] * 3)
    later.current_time = NOW + 16  # past max_reading_age_s + max_clock_skew_s
    policy(later)
    assert "app/a" not in autoscale._LEDGER.entries


def test_reading_delay_follows_rays_record_and_push_periods() -> None:
    from serve_app.control.policy import reading_delay_s

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
    from serve_app.control.policy import reading_delay_errors

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
