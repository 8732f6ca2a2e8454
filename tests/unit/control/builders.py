"""Serve ``AutoscalingContext``s built from Ray's own classes (no cluster), carrying the metrics
replicas report (control.stats), for the policy's and the ledger's tests."""

from __future__ import annotations

from typing import Any

from ray.serve._private.common import DeploymentID, ReplicaID, TimeStampedValue
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from serve_app.control.readings import GpuReading, NodeReadings
from serve_app.control.stats import stats_from_readings

GIB = 1 << 30
NOW = 50_000.0
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
KWARGS = {"upscale_cooldown_s": 30.0, "downscale_cooldown_s": 60.0, "max_reading_age_s": 10.0}


def readings(free: int, *, at: float = NOW, total: int = 80 * GIB) -> NodeReadings:
    gpu = GpuReading(UUID0, total, free, total - free, at)
    return NodeReadings("node-a", (gpu,), None, at, ray_gpu_available=0.5, ray_gpu_at_s=at)


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
