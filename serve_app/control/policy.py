"""The Ray Serve autoscaling policy that feeds the planner (the controller side).

``HeadroomPolicy`` (a class, so Ray passes it ``policy_kwargs``) runs in the Serve controller ten
times a second. It reads the replicas' latest metrics (control.stats) from the
``AutoscalingContext``, builds ``PlannerInputs``, calls ``planner.plan`` and returns the target.
It never calls NVML and never waits on Ray: the decision goes to the log (when it changes), to
two Prometheus gauges, and to the monitor actor with a fire-and-forget ``.remote()``.
Recommended deployment config::

    autoscaling_config:
      min_replicas: 1
      max_replicas: 4
      target_ongoing_requests: 2
      upscale_delay_s: 0        # the policy's own cooldowns apply; Ray's delays would add to them
      downscale_delay_s: 0      # and would also delay shedding under memory pressure
      look_back_period_s: 5     # the load figure's window
      metrics_interval_s: 0.25  # Ray pushes replica stats this often (10 s by default)
      policy:
        policy_function: serve_app.autoscale:HeadroomPolicy
        policy_kwargs: {safety_margin_bytes: 2147483648, upscale_cooldown_s: 30,
                        downscale_cooldown_s: 300, max_reading_age_s: 30}

With ``metrics_interval_s: 0.25`` a reading reaches the policy within 0.6 s
(``settings.reading_delay_s``; docs/controller.md).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from serve_app.control import monitor
from serve_app.control.ledger import shared_ledger, update_ledger
from serve_app.control.planner import (
    Decision,
    GpuHeadroom,
    PlannerInputs,
    Reason,
    ReplicaMemory,
    Reservation,
    plan,
)
from serve_app.control.readings import gpu_label
from serve_app.control.settings import ControllerConfig, config_errors
from serve_app.control.stats import (
    GPU_METRIC,
    METRIC_BUDGET_BYTES,
    METRIC_GPU_FRACTION,
    METRIC_GPU_KEY,
    METRIC_NVML_OK,
    METRIC_PEAK_BYTES,
    METRIC_RAY_GPU_AVAILABLE,
    REPLICA_METRICS,
    gpu_metric_name,
)

if TYPE_CHECKING:
    from ray.serve.config import AutoscalingContext

__all__ = [
    "STATE_REASON",
    "STATE_TARGET",
    "HeadroomPolicy",
    "headroom_policy",
    "inputs_from_context",
]

# Ray logs the controller under "ray.serve"; decisions belong next to Serve's own scaling lines.
logger = logging.getLogger("ray.serve")

STATE_TARGET = "serve_app_target"
# Ray 2.60's metrics agent drops a gauge not set again within two export intervals (2 s; its
# OpenTelemetryMetricRecorder's gauge TTL): the decision's gauges are set again this often.
GAUGE_REFRESH_S = 1.0
STATE_REASON = "serve_app_reason"

PolicyResult = tuple[int, dict[str, Any]]  # the target, and Ray's policy_state for next time
_K = TypeVar("_K")


class _Point(Protocol):
    """One point of a replica's metric series (Ray's TimeStampedValue)."""

    @property
    def timestamp(self) -> float: ...

    @property
    def value(self) -> float: ...


def _latest(
    series_by_replica: Mapping[_K, Sequence[_Point]] | None, replica: _K
) -> tuple[float, float]:
    """(timestamp, value) of a replica's newest point; (-inf, nan) when it has none."""
    series = (series_by_replica or {}).get(replica)
    if not series:
        return -math.inf, math.nan
    point = max(series, key=lambda p: p.timestamp)
    return float(point.timestamp), float(point.value)


def inputs_from_context(
    ctx: AutoscalingContext, config: ControllerConfig, reservations: tuple[Reservation, ...] = ()
) -> PlannerInputs:
    """Build the planner's inputs from a Serve ``AutoscalingContext``.

    Uses each running replica's newest raw metric point (the aggregated metrics are means over
    ``look_back_period_s``, which would blur a sudden drop in free memory and a reading's age).
    """
    raw = ctx.raw_metrics or {}
    replicas: list[ReplicaMemory] = []
    gpus: dict[str, GpuHeadroom] = {}
    ray_gpu: tuple[float, float | None] = (-math.inf, None)
    for rid in ctx.running_replicas:
        values = {k: _latest(raw.get(k), rid)[1] for k in REPLICA_METRICS}
        if any(math.isnan(values[k]) for k in REPLICA_METRICS):
            continue  # has not reported yet: the planner holds on fewer reports than replicas
        key = int(values[METRIC_GPU_KEY])
        fraction = values[METRIC_GPU_FRACTION]
        nvml_ok = values[METRIC_NVML_OK] >= 1.0
        uses_gpu = key != 0 or fraction > 0
        replicas.append(
            ReplicaMemory(
                replica_id=str(getattr(rid, "unique_id", rid)),
                gpu_uuid=gpu_label(key) if uses_gpu and key and nvml_ok else None,
                gpu_fraction=fraction,
                budget_bytes=int(values[METRIC_BUDGET_BYTES]),
                peak_bytes=int(values[METRIC_PEAK_BYTES]),
            )
        )
        if not (uses_gpu and nvml_ok):
            continue
        for name, series in raw.items():
            match = GPU_METRIC.match(name)
            if match is None or match.group(2) != "timestamp_s":
                continue
            _, ts = _latest(series, rid)
            label = f"gpu:{match.group(1)}"
            if math.isnan(ts) or (label in gpus and gpus[label].timestamp_s >= ts):
                continue
            total = _latest(raw.get(gpu_metric_name(int(match.group(1), 16), "total_bytes")), rid)
            free = _latest(raw.get(gpu_metric_name(int(match.group(1), 16), "free_bytes")), rid)
            if math.isnan(total[1]) or math.isnan(free[1]):
                continue
            gpus[label] = GpuHeadroom(label, int(total[1]), int(free[1]), ts)
        ray_ts, ray_value = _latest(raw.get(METRIC_RAY_GPU_AVAILABLE), rid)
        if ray_value >= 0 and ray_ts > ray_gpu[0]:
            ray_gpu = (ray_ts, ray_value)
    return PlannerInputs(
        running_replicas=ctx.current_num_replicas,
        target_replicas=ctx.target_num_replicas,
        min_replicas=ctx.capacity_adjusted_min_replicas,
        max_replicas=ctx.capacity_adjusted_max_replicas,
        ongoing_requests=float(ctx.total_num_requests),
        replicas=tuple(replicas),
        gpus=tuple(gpus[k] for k in sorted(gpus)),
        ray_gpu_available=ray_gpu[1],
        last_scale_up_s=ctx.last_scale_up_time,
        last_scale_down_s=ctx.last_scale_down_time,
        reservations=reservations,
    )


class _Gauges:
    """The decision as Prometheus gauges; created on first use, never at import."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Gauge

        tags = ("application", "deployment")
        self.target = Gauge(
            "serve_app_autoscale_target_replicas",
            description="Replica count the serve_app headroom policy decided.",
            tag_keys=tags,
        )
        self.reason = Gauge(
            "serve_app_autoscale_reason",
            description="1 for the reason of the last decision, 0 for the others.",
            tag_keys=(*tags, "reason"),
        )
        self.decisions = Counter(
            "serve_app_autoscale_decisions_total",
            description="Decisions that changed the target or its reason, by direction and reason.",
            tag_keys=(*tags, "decision", "reason"),
        )

    def export(self, app: str, deployment: str, decision: Decision, changed: bool = True) -> None:
        tags = {"application": app, "deployment": deployment}
        self.target.set(decision.target_replicas, tags=tags)
        for reason in Reason:
            self.reason.set(1.0 if reason is decision.reason else 0.0, {**tags, "reason": reason})
        if changed:
            self.decisions.inc(
                tags={**tags, "decision": str(decision.direction), "reason": str(decision.reason)}
            )


class HeadroomPolicy:
    """Ray Serve custom autoscaling policy: scale with load inside each GPU's free memory.

    Ray instantiates it once per deployment with ``policy_kwargs`` (validated into a
    ``ControllerConfig``) and calls it with an ``AutoscalingContext`` every control-loop tick.
    """

    def __init__(self, **policy_kwargs: Any) -> None:
        problems = config_errors(policy_kwargs)
        if problems:
            raise ValueError("invalid serve_app policy_kwargs:\n  " + "\n  ".join(problems))
        self._kwargs = dict(policy_kwargs)
        self._config = ControllerConfig.model_validate(self._kwargs)
        self._last: tuple[int, Reason] | None = None
        self._gauges: _Gauges | None = None
        self._metrics_broken = False
        self._exported_at_s = -math.inf  # time.monotonic() of the gauges' last export
        self._monitor: monitor.MonitorHandle | None = None
        self._monitor_retry_at_s = 0.0

    def config_for(self, ctx: AutoscalingContext) -> ControllerConfig:
        """The settings, taking target_ongoing_requests from autoscaling_config unless set."""
        if "target_ongoing_requests" in self._kwargs or ctx.config is None:
            return self._config
        target = ctx.config.get_target_ongoing_requests()
        if target is None or target == self._config.target_ongoing_requests:
            return self._config
        self._config = self._config.model_copy(update={"target_ongoing_requests": float(target)})
        return self._config

    def __call__(self, ctx: AutoscalingContext) -> PolicyResult:
        try:
            return self._decide(ctx)
        except Exception:  # never take the controller loop down: hold the current target
            logger.exception("serve_app headroom policy failed; holding the current target")
            return ctx.target_num_replicas, dict(ctx.policy_state)

    def _decide(self, ctx: AutoscalingContext) -> PolicyResult:
        config = self.config_for(ctx)
        now_s = ctx.current_time if ctx.current_time is not None else time.time()
        deployment = f"{ctx.app_name}/{ctx.deployment_name}"
        ledger = shared_ledger()
        with ledger.lock:
            reservations = tuple(ledger.entries.values())
        inputs = inputs_from_context(ctx, config, reservations)
        decision = plan(inputs, config, now_s)
        with ledger.lock:
            update_ledger(ledger, deployment, inputs, decision, config, now_s)

        key = (decision.target_replicas, decision.reason)
        if key != self._last:
            self._last = key
            logger.info(
                "serve_app autoscale %s: %d -> %d (%s): %s",
                deployment,
                inputs.target_replicas,
                decision.target_replicas,
                decision.reason,
                decision.detail,
            )
            self._export(ctx, decision)
            self._push(deployment, inputs, decision, now_s)
        elif time.monotonic() - self._exported_at_s >= GAUGE_REFRESH_S:
            self._export(ctx, decision, changed=False)
        state = dict(ctx.policy_state)
        state[STATE_TARGET] = decision.target_replicas
        state[STATE_REASON] = str(decision.reason)
        return decision.target_replicas, state

    def _export(self, ctx: AutoscalingContext, decision: Decision, changed: bool = True) -> None:
        if self._metrics_broken:
            return
        self._exported_at_s = time.monotonic()
        try:
            if self._gauges is None:
                self._gauges = _Gauges()
            self._gauges.export(str(ctx.app_name), str(ctx.deployment_name), decision, changed)
        except Exception:
            self._metrics_broken = True
            logger.warning("serve_app autoscale metrics disabled", exc_info=True)

    def _push(
        self, deployment: str, inputs: PlannerInputs, decision: Decision, now_s: float
    ) -> None:
        """Hand the decision to this node's monitor for ``serve-app status``; never waits."""
        record = monitor.DecisionRecord(
            deployment=deployment,
            target_replicas=decision.target_replicas,
            current_replicas=inputs.target_replicas,
            direction=str(decision.direction),
            reason=str(decision.reason),
            detail=decision.detail,
            timestamp_s=now_s,
        )
        try:
            import ray

            if not ray.is_initialized():
                return
            if self._monitor is None:
                if now_s < self._monitor_retry_at_s:
                    return
                self._monitor_retry_at_s = now_s + 30.0
                self._monitor = monitor.get_or_create_monitor()
            self._monitor.record_decision.remote(record)
        except Exception:
            self._monitor = None
            logger.debug("could not push the decision to the GPU monitor", exc_info=True)


def headroom_policy(ctx: AutoscalingContext) -> PolicyResult:
    """``HeadroomPolicy`` with default settings, for ``policy_function`` without kwargs (Ray
    passes ``policy_kwargs`` only to class policies)."""
    policy = _default_policies.get(str(ctx.deployment_id))
    if policy is None:
        policy = _default_policies.setdefault(str(ctx.deployment_id), HeadroomPolicy())
    return policy(ctx)


_default_policies: dict[str, HeadroomPolicy] = {}
