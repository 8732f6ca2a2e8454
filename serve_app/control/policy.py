"""The Ray Serve autoscaling policy that feeds the planner, and the replica side that feeds it.

Replica side: a replica's ``record_autoscaling_stats`` returns
``await replica_autoscaling_stats(...)``: its own memory figures plus its node monitor's latest
GPU readings, flattened into float metrics (names in ``METRIC_*`` and ``gpu_metric_name``).

Controller side: ``HeadroomPolicy`` (a class, so Ray passes it ``policy_kwargs``) runs in the Serve
controller ten times a second. It reads the replicas' latest metrics from the context, builds
``PlannerInputs``, calls ``planner.plan`` and returns the target. It never calls NVML and never
waits on Ray: the decision goes to the log (when it changes), to two Prometheus gauges, and to
the monitor actor with a fire-and-forget ``.remote()``. Recommended deployment config::

    autoscaling_config:
      min_replicas: 1
      max_replicas: 4
      target_ongoing_requests: 2
      upscale_delay_s: 0        # the policy's own cooldowns apply; Ray's delays would add to them
      downscale_delay_s: 0      # and would also delay shedding under memory pressure
      look_back_period_s: 5     # the load figure's window
      policy:
        policy_function: serve_app.autoscale:HeadroomPolicy
        policy_kwargs: {safety_margin_bytes: 2147483648, upscale_cooldown_s: 30,
                        downscale_cooldown_s: 300, max_reading_age_s: 30}

and ``autoscaling_config.metrics_interval_s: 0.25`` (Ray 2.60 pushes replica stats at that
interval, 10 s by default, and records them at most that far apart) so that a reading reaches the
policy within 0.6 s (``reading_delay_s``; docs/controller.md).
"""

from __future__ import annotations

import importlib
import logging
import math
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from serve_app.control import monitor
from serve_app.control.planner import (
    ControllerConfig,
    Decision,
    Direction,
    GpuHeadroom,
    PlannerInputs,
    Reason,
    ReplicaMemory,
    Reservation,
    config_errors,
    footprint_bytes,
    plan,
)

__all__ = [
    "METRIC_BUDGET_BYTES",
    "METRIC_GPU_FRACTION",
    "METRIC_GPU_KEY",
    "METRIC_NVML_OK",
    "METRIC_NVML_PROCESS_BYTES",
    "METRIC_PEAK_BYTES",
    "METRIC_RAY_GPU_AVAILABLE",
    "HeadroomPolicy",
    "gpu_metric_name",
    "headroom_policy",
    "inputs_from_context",
    "reading_delay_s",
    "reading_delay_errors",
    "replica_autoscaling_stats",
    "stats_from_readings",
    "validate_policy_kwargs",
]

# Ray logs the controller under "ray.serve"; decisions belong next to Serve's own scaling lines.
logger = logging.getLogger("ray.serve")

METRIC_BUDGET_BYTES = "serve_app_budget_bytes"
METRIC_PEAK_BYTES = "serve_app_peak_bytes"
METRIC_NVML_PROCESS_BYTES = "serve_app_nvml_process_bytes"  # -1: NVML does not list the PID
METRIC_GPU_FRACTION = "serve_app_gpu_fraction"  # num_gpus; 0 for a CPU replica
METRIC_GPU_KEY = "serve_app_gpu_key"  # monitor.gpu_key(uuid) of the replica's GPU; 0: none
METRIC_NVML_OK = "serve_app_nvml_ok"  # 1: the node monitor answered with readings; 0: not
METRIC_RAY_GPU_AVAILABLE = "serve_app_ray_gpu_available"  # -1: unknown
_GPU_FIELDS = ("total_bytes", "free_bytes", "timestamp_s")
_GPU_METRIC = re.compile(r"^serve_app_gpu_([0-9a-f]{12})_(total_bytes|free_bytes|timestamp_s)$")

STATE_TARGET = "serve_app_target"
STATE_REASON = "serve_app_reason"


def gpu_metric_name(key: int, field: str) -> str:
    """Metric name of one GPU figure: ``serve_app_gpu_<key hex>_<field>``."""
    return f"serve_app_gpu_{key:012x}_{field}"


# ---------------------------------------------------------------------------------------------
# Replica side
# ---------------------------------------------------------------------------------------------


def stats_from_readings(
    *,
    budget_bytes: int,
    peak_bytes: int,
    gpu_uuid: str | None,
    gpu_fraction: float,
    nvml_process_bytes: int | None,
    readings: monitor.NodeReadings | None,
) -> dict[str, float]:
    """The float metrics one replica reports, from its figures and its node's readings."""
    stats: dict[str, float] = {
        METRIC_BUDGET_BYTES: float(budget_bytes),
        METRIC_PEAK_BYTES: float(peak_bytes),
        METRIC_NVML_PROCESS_BYTES: float(-1 if nvml_process_bytes is None else nvml_process_bytes),
        METRIC_GPU_FRACTION: float(gpu_fraction),
        METRIC_GPU_KEY: float(monitor.gpu_key(gpu_uuid)) if gpu_uuid else 0.0,
        METRIC_NVML_OK: 0.0,
        METRIC_RAY_GPU_AVAILABLE: -1.0,
    }
    if readings is None or readings.error is not None or not readings.gpus:
        return stats
    stats[METRIC_NVML_OK] = 1.0
    if readings.ray_gpu_available is not None:
        stats[METRIC_RAY_GPU_AVAILABLE] = float(readings.ray_gpu_available)
    for gpu in readings.gpus:
        stats[gpu_metric_name(gpu.key, "total_bytes")] = float(gpu.total_bytes)
        stats[gpu_metric_name(gpu.key, "free_bytes")] = float(gpu.free_bytes)
        stats[gpu_metric_name(gpu.key, "timestamp_s")] = float(gpu.timestamp_s)
    return stats


async def replica_autoscaling_stats(
    *,
    budget_bytes: int,
    peak_bytes: int,
    gpu_uuid: str | None,
    gpu_fraction: float,
    nvml_process_bytes: int | None = None,
    timeout_s: float = 1.0,
) -> dict[str, float]:
    """What a replica's ``record_autoscaling_stats`` returns.

    Args:
        budget_bytes: the replica's memory budget (num_gpus x device total); 0 on the CPU.
        peak_bytes: the largest memory the replica has used (torch peak reserved + overhead).
        gpu_uuid: NVML UUID of its GPU (``nvml.uuid_for_torch_device(0)``); ``None`` on the CPU.
        gpu_fraction: its ``num_gpus``; 0 on the CPU.
        nvml_process_bytes: NVML's figure for this PID, ``None`` if NVML does not list it.
        timeout_s: how long to wait for the node monitor (Serve's own limit is 10 s).
    """
    readings = await monitor.latest_readings(timeout_s) if gpu_uuid else None
    return stats_from_readings(
        budget_bytes=budget_bytes,
        peak_bytes=peak_bytes,
        gpu_uuid=gpu_uuid,
        gpu_fraction=gpu_fraction,
        nvml_process_bytes=nvml_process_bytes,
        readings=readings,
    )


# ---------------------------------------------------------------------------------------------
# Controller side
# ---------------------------------------------------------------------------------------------


# Ray Serve 2.60's figures (ray/serve/config.py, ray/serve/_private/constants.py, replica.py):
# the replica records a metrics point every min(look_back_period_s x 0.2, metrics_interval_s)
# and pushes its points to the controller every metrics_interval_s (default 10 s; look-back
# default 30 s); the controller runs every autoscaling policy once per control loop (0.1 s).
RAY_DEFAULT_METRICS_INTERVAL_S = 10.0
RAY_DEFAULT_LOOK_BACK_PERIOD_S = 30.0
RAY_RECORD_INTERVAL_FACTOR = 0.2  # RAY_SERVE_AUTOSCALING_METRIC_RECORD_INTERVAL_FACTOR
RAY_CONTROL_LOOP_INTERVAL_S = 0.1  # RAY_SERVE_CONTROL_LOOP_INTERVAL_S


def reading_delay_s(autoscaling_config: Mapping[str, Any]) -> float:
    """The longest wait, in seconds, from a node monitor's NVML reading to the policy deciding
    on it (RPC times aside): the replica's next record, its next push, one control loop."""
    push_s = float(autoscaling_config.get("metrics_interval_s") or RAY_DEFAULT_METRICS_INTERVAL_S)
    look_back_s = float(
        autoscaling_config.get("look_back_period_s") or RAY_DEFAULT_LOOK_BACK_PERIOD_S
    )
    record_s = min(look_back_s * RAY_RECORD_INTERVAL_FACTOR, push_s)
    return record_s + push_s + RAY_CONTROL_LOOP_INTERVAL_S


def reading_delay_errors(autoscaling_config: Mapping[str, Any]) -> list[str]:
    """A ``max_reading_age_s`` that the newest reading can outgrow on its way (the monitor's
    sample period plus ``reading_delay_s``), which would hold every decision as a bad reading."""
    kwargs = (autoscaling_config.get("policy") or {}).get("policy_kwargs") or {}
    max_age = kwargs.get("max_reading_age_s", ControllerConfig().max_reading_age_s)
    if not isinstance(max_age, (int, float)):
        return []
    oldest = monitor.SAMPLE_PERIOD_S + reading_delay_s(autoscaling_config)
    if max_age > oldest:
        return []
    return [
        f"max_reading_age_s: {max_age:g} s is not above the age a reading can reach before "
        f"the policy sees it ({oldest:.2f} s: the monitor's {monitor.SAMPLE_PERIOD_S:g} s "
        "sample, the replica's record and push periods, one control loop), so every decision "
        "would hold as a bad reading; raise it or lower autoscaling_config.metrics_interval_s"
    ]


def validate_policy_kwargs(raw: Mapping[str, Any]) -> list[str]:
    """Problems with ``policy_kwargs``, one line each starting with the field name."""
    return config_errors(raw)


def _latest(series_by_replica: Mapping[Any, Any] | None, replica: Any) -> tuple[float, float]:
    """(timestamp, value) of a replica's newest point; (-inf, nan) when it has none."""
    series = (series_by_replica or {}).get(replica)
    if not series:
        return -math.inf, math.nan
    point = max(series, key=lambda p: p.timestamp)
    return float(point.timestamp), float(point.value)


def inputs_from_context(
    ctx: Any, config: ControllerConfig, reservations: tuple[Reservation, ...] = ()
) -> PlannerInputs:
    """Build the planner's inputs from a Serve ``AutoscalingContext``.

    Uses each running replica's newest raw metric point (the aggregated metrics are means over
    ``look_back_period_s``, which would blur a sudden drop in free memory and a reading's age).
    """
    raw: Mapping[str, Mapping[Any, Any]] = ctx.raw_metrics or {}
    replicas: list[ReplicaMemory] = []
    gpus: dict[str, GpuHeadroom] = {}
    ray_gpu: tuple[float, float | None] = (-math.inf, None)
    for rid in ctx.running_replicas:
        values = {k: _latest(raw.get(k), rid)[1] for k in _REPLICA_KEYS}
        if any(math.isnan(values[k]) for k in _REPLICA_KEYS):
            continue  # has not reported yet: the planner holds on fewer reports than replicas
        key = int(values[METRIC_GPU_KEY])
        fraction = values[METRIC_GPU_FRACTION]
        nvml_ok = values[METRIC_NVML_OK] >= 1.0
        uses_gpu = key != 0 or fraction > 0
        replicas.append(
            ReplicaMemory(
                replica_id=str(getattr(rid, "unique_id", rid)),
                gpu_uuid=monitor.gpu_label(key) if uses_gpu and key and nvml_ok else None,
                gpu_fraction=fraction,
                budget_bytes=int(values[METRIC_BUDGET_BYTES]),
                peak_bytes=int(values[METRIC_PEAK_BYTES]),
            )
        )
        if not (uses_gpu and nvml_ok):
            continue
        for name, series in raw.items():
            match = _GPU_METRIC.match(name)
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


_REPLICA_KEYS = (
    METRIC_BUDGET_BYTES,
    METRIC_PEAK_BYTES,
    METRIC_GPU_FRACTION,
    METRIC_GPU_KEY,
    METRIC_NVML_OK,
)


class _Ledger:
    """Bytes promised to replicas still starting, shared by every deployment's policy in the
    controller process, so two deployments on one GPU cannot both spend the same free bytes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, Reservation] = {}


_LEDGER = _Ledger()


def _shared_ledger() -> _Ledger:
    # Ray cloudpickles the policy's module *by value*: each deployment's policy gets its own copy
    # of this module's globals. Importing the installed module by name reaches the one ledger
    # that every policy in the controller process shares.
    real = importlib.import_module("serve_app.control.policy")
    ledger: _Ledger = real._LEDGER
    return ledger


class _Gauges:
    """The decision as Prometheus gauges; created on first use, never at import."""

    def __init__(self) -> None:
        from ray.util.metrics import Gauge

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

    def export(self, app: str, deployment: str, decision: Decision) -> None:
        tags = {"application": app, "deployment": deployment}
        self.target.set(decision.target_replicas, tags=tags)
        for reason in Reason:
            self.reason.set(1.0 if reason is decision.reason else 0.0, {**tags, "reason": reason})


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
        self._monitor: Any = None
        self._monitor_retry_at_s = 0.0

    def config_for(self, ctx: Any) -> ControllerConfig:
        """The settings, taking target_ongoing_requests from autoscaling_config unless set."""
        if "target_ongoing_requests" in self._kwargs or ctx.config is None:
            return self._config
        target = ctx.config.get_target_ongoing_requests()
        if target is None or target == self._config.target_ongoing_requests:
            return self._config
        self._config = self._config.model_copy(update={"target_ongoing_requests": float(target)})
        return self._config

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        try:
            return self._decide(ctx)
        except Exception:  # never take the controller loop down: hold the current target
            logger.exception("serve_app headroom policy failed; holding the current target")
            return ctx.target_num_replicas, dict(ctx.policy_state)

    def _decide(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        config = self.config_for(ctx)
        now_s = ctx.current_time if ctx.current_time is not None else time.time()
        deployment = f"{ctx.app_name}/{ctx.deployment_name}"
        ledger = _shared_ledger()
        with ledger.lock:
            reservations = tuple(ledger.entries.values())
        inputs = inputs_from_context(ctx, config, reservations)
        decision = plan(inputs, config, now_s)
        with ledger.lock:
            _update_ledger(ledger, deployment, inputs, decision, config, now_s)

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
        state = dict(ctx.policy_state)
        state[STATE_TARGET] = decision.target_replicas
        state[STATE_REASON] = str(decision.reason)
        return decision.target_replicas, state

    def _export(self, ctx: Any, decision: Decision) -> None:
        if self._metrics_broken:
            return
        try:
            if self._gauges is None:
                self._gauges = _Gauges()
            self._gauges.export(str(ctx.app_name), str(ctx.deployment_name), decision)
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


def _update_ledger(
    ledger: _Ledger,
    deployment: str,
    inputs: PlannerInputs,
    decision: Decision,
    config: ControllerConfig,
    now_s: float,
) -> None:
    """Reserve bytes for replicas a scale-up starts; settle them once they run; forget them once
    readings newer than that have had time to arrive."""
    added = decision.target_replicas - inputs.target_replicas
    gpu_replicas = [r for r in inputs.replicas if r.gpu_fraction > 0 or r.gpu_uuid]
    if decision.direction is Direction.UP and added > 0 and gpu_replicas and inputs.gpus:
        footprint = max(footprint_bytes(r, config) for r in gpu_replicas)
        ledger.entries[deployment] = Reservation(
            deployment, added * footprint, frozenset(g.uuid for g in inputs.gpus), None
        )
    entry = ledger.entries.get(deployment)
    if (
        entry is not None
        and entry.settled_at_s is None
        and decision.direction is not Direction.UP
        and inputs.running_replicas >= inputs.target_replicas
    ):
        ledger.entries[deployment] = Reservation(
            entry.deployment, entry.bytes, entry.gpu_uuids, now_s
        )
    expiry_s = config.max_reading_age_s + config.max_clock_skew_s
    for name, res in list(ledger.entries.items()):
        if res.settled_at_s is not None and now_s - res.settled_at_s > expiry_s:
            del ledger.entries[name]


def headroom_policy(ctx: Any) -> tuple[int, dict[str, Any]]:
    """``HeadroomPolicy`` with default settings, for ``policy_function`` without kwargs (Ray
    passes ``policy_kwargs`` only to class policies)."""
    policy = _default_policies.get(str(ctx.deployment_id))
    if policy is None:
        policy = _default_policies.setdefault(str(ctx.deployment_id), HeadroomPolicy())
    return policy(ctx)


_default_policies: dict[str, HeadroomPolicy] = {}
