"""The headroom controller's settings (``autoscaling_config.policy.policy_kwargs``), validated
into ``ControllerConfig``, and the checks ``serve-app check`` runs on them: each problem one line
that names the field and the fix, and a ``max_reading_age_s`` that readings would outgrow on
their way to the policy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from serve_app.control.readings import SAMPLE_PERIOD_S
from serve_app.startup import ray_compat

__all__ = [
    "ControllerConfig",
    "config_errors",
    "reading_delay_errors",
    "reading_delay_s",
]

_GIB = 1 << 30

_FIXES: dict[str, str] = {
    "target_ongoing_requests": "set the requests one replica should carry, e.g. 2",
    "safety_margin_bytes": "set the bytes to keep free on every GPU, e.g. 2147483648 (2 GiB)",
    "footprint_margin_fraction": "set the share added to a measured peak, e.g. 0.1",
    "upscale_cooldown_s": "set seconds between changes before a scale-up, e.g. 30",
    "downscale_cooldown_s": "set seconds between changes before a scale-down, e.g. 300",
    "shed_cooldown_s": "set seconds between memory-pressure sheds, e.g. 10",
    "max_reading_age_s": "set the oldest GPU reading to trust, above the replica metrics "
    "push interval (autoscaling_config.metrics_interval_s), e.g. 30",
    "max_clock_skew_s": "set how far node clocks may disagree, e.g. 5",
    "downscale_threshold": "set a value in (0, 1), e.g. 0.8",
    "max_step_up": "set the most replicas one scale-up adds, e.g. 1",
}


class ControllerConfig(BaseModel):
    """The controller's settings, from ``autoscaling_config.policy.policy_kwargs``.

    ``min_replicas``/``max_replicas`` are not here: they are Ray's own autoscaling_config fields
    and reach the planner through ``PlannerInputs``. ``target_ongoing_requests`` defaults to the
    deployment's ``autoscaling_config.target_ongoing_requests`` when left out of policy_kwargs.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_ongoing_requests: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    safety_margin_bytes: int = Field(default=2 * _GIB, ge=0)
    footprint_margin_fraction: float = Field(default=0.10, ge=0, le=10, allow_inf_nan=False)
    upscale_cooldown_s: float = Field(default=30.0, ge=0, allow_inf_nan=False)
    downscale_cooldown_s: float = Field(default=300.0, ge=0, allow_inf_nan=False)
    shed_cooldown_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    max_reading_age_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    max_clock_skew_s: float = Field(default=5.0, ge=0, allow_inf_nan=False)
    downscale_threshold: float = Field(default=0.8, gt=0, lt=1, allow_inf_nan=False)
    max_step_up: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _shed_not_slower_than_upscale(self) -> ControllerConfig:
        if self.shed_cooldown_s > self.upscale_cooldown_s:
            raise ValueError(
                f"shed_cooldown_s ({self.shed_cooldown_s}) is longer than upscale_cooldown_s "
                f"({self.upscale_cooldown_s}); memory pressure must be answered at least as fast "
                "as load: lower shed_cooldown_s"
            )
        return self

    @property
    def flip_interval_s(self) -> float:
        """The least time between two direction changes."""
        return min(self.upscale_cooldown_s, self.downscale_cooldown_s)


def config_errors(raw: Mapping[str, Any]) -> list[str]:
    """Validate policy_kwargs; one line per problem: ``field: what (got value); fix``."""
    try:
        ControllerConfig.model_validate(dict(raw))
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "policy_kwargs"
            fix = _FIXES.get(field, "remove it; known fields: " + ", ".join(sorted(_FIXES)))
            if not err["loc"]:
                lines.append(f"{field}: {err['msg']}")
            else:
                lines.append(f"{field}: {err['msg']} (got {err.get('input')!r}); {fix}")
        return lines
    return []


def reading_delay_s(autoscaling_config: Mapping[str, Any]) -> float:
    """The longest wait, in seconds, from a node monitor's NVML reading to the policy deciding
    on it (RPC times aside): the replica's next record, its next push, one control loop
    (Ray Serve's periods: ray_compat)."""
    push_s = float(
        autoscaling_config.get("metrics_interval_s") or ray_compat.DEFAULT_METRICS_INTERVAL_S
    )
    look_back_s = float(
        autoscaling_config.get("look_back_period_s") or ray_compat.DEFAULT_LOOK_BACK_PERIOD_S
    )
    record_s = min(look_back_s * ray_compat.METRIC_RECORD_INTERVAL_FACTOR, push_s)
    return record_s + push_s + ray_compat.CONTROL_LOOP_INTERVAL_S


def reading_delay_errors(autoscaling_config: Mapping[str, Any]) -> list[str]:
    """A ``max_reading_age_s`` that the newest reading can outgrow on its way (the monitor's
    sample period plus ``reading_delay_s``), which would hold every decision as a bad reading."""
    kwargs = (autoscaling_config.get("policy") or {}).get("policy_kwargs") or {}
    max_age = kwargs.get("max_reading_age_s", ControllerConfig().max_reading_age_s)
    if not isinstance(max_age, (int, float)):
        return []
    oldest = SAMPLE_PERIOD_S + reading_delay_s(autoscaling_config)
    if max_age > oldest:
        return []
    return [
        f"max_reading_age_s: {max_age:g} s is not above the age a reading can reach before "
        f"the policy sees it ({oldest:.2f} s: the monitor's {SAMPLE_PERIOD_S:g} s "
        "sample, the replica's record and push periods, one control loop), so every decision "
        "would hold as a bad reading; raise it or lower autoscaling_config.metrics_interval_s"
    ]
