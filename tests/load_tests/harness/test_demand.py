"""load_tests.harness.demand: the open-loop rate a scaling test needs, and its phase counts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from load_tests.harness.demand import DemandError, phase_counts, plan_demand
from load_tests.harness.openloop import STATUS_CODES

# tests/gpu/test_controller_gpu.py's settings
SETTINGS: dict[str, Any] = {
    "want_replicas": 4,
    "target_ongoing_requests": 1,
    "downscale_threshold": 0.8,
    "factor": 3.5,
    "min_factor": 3.25,
    "max_rate_per_s": 12_000.0,
    "in_flight_s": 0.5,
    "min_in_flight": 128,
    "max_in_flight": 1024,
}


@pytest.mark.parametrize("r1", [150.0, 1200.0, 2000.0, 3400.0])
def test_rate_needs_four_replicas_whatever_one_carries(r1: float) -> None:
    plan = plan_demand(r1, **SETTINGS)
    assert plan.rate_per_s == pytest.approx(3.5 * r1)
    # 3 replicas carry at most 3 x r1: the backlog grows; 4 could carry 4 x r1
    assert 3 * r1 < plan.rate_per_s < 4 * r1
    assert plan.backlog_growth_per_s == pytest.approx(0.5 * r1)
    # Little's law at 4: at least rate / r1 requests in the replicas, above the scale-down line
    assert plan.min_load_at_want == pytest.approx(3.5)
    assert plan.utilisation_at_want == pytest.approx(0.875)
    assert plan.up_above_load == 3 and plan.down_below_load == pytest.approx(2.4)
    assert plan.min_load_at_want > plan.down_below_load
    assert 128 <= plan.in_flight_cap <= 1024
    assert plan.in_flight_cap == min(1024, max(128, math.ceil(r1 * 0.5)))
    assert "Little's law" in plan.reasoning and f"{plan.rate_per_s:.0f}/s" in plan.reasoning
    assert plan.as_dict()["reasoning"] == plan.reasoning


def test_bound_on_the_rate_is_taken_while_it_stays_over_three_replicas() -> None:
    plan = plan_demand(3600.0, **SETTINGS)  # 3.5 x = 12,600 > 12,000
    assert plan.rate_per_s == 12_000.0
    assert plan.factor == pytest.approx(12_000 / 3600)
    with pytest.raises(DemandError, match="client is bounded"):
        plan_demand(4000.0, **SETTINGS)  # 12,000 is only 3.0 x: 3 replicas could carry it


def test_target_too_high_for_the_load_to_hold_four_is_refused() -> None:
    # target 2 (the closed loop's): L >= 3.5 is not above 2 x 3 x 0.8 = 4.8
    with pytest.raises(DemandError, match="lower target_ongoing_requests"):
        plan_demand(1000.0, **{**SETTINGS, "target_ongoing_requests": 2})


@pytest.mark.parametrize("r1", [0.0, -1.0, float("nan"), float("inf")])
def test_no_measured_rate_is_refused(r1: float) -> None:
    with pytest.raises(DemandError, match="nothing to plan"):
        plan_demand(r1, **SETTINGS)


def test_factors_outside_the_band_are_refused() -> None:
    with pytest.raises(DemandError, match="factors"):
        plan_demand(1000.0, **{**SETTINGS, "factor": 4.0})
    with pytest.raises(DemandError, match="factors"):
        plan_demand(1000.0, **{**SETTINGS, "min_factor": 3.0})


def _rows(times: list[float], lat: list[float], status: list[int]) -> np.ndarray:
    return np.array([times, lat, [0.0] * len(times), status], dtype=np.float64)


def test_phase_counts_split_by_scheduled_time() -> None:
    dropped, timeout = STATUS_CODES["dropped"], STATUS_CODES["timeout"]
    a = _rows(
        [0.1, 0.5, 1.2, 1.5, 2.6],
        [0.01, 0.02, 0.03, float("nan"), 0.05],
        [200] * 3 + [dropped, 200],
    )
    b = _rows([0.2, 1.1, 2.9], [0.04, 0.5, float("nan")], [200, 503, timeout])
    phases = [
        {"name": "load", "t_s": 1.0},
        {"name": "grab", "t_s": 2.0},
        {"name": "end", "t_s": 3.0},
    ]
    # the workers started 0.5 s into the phases' clock: a row at 0.1 is at 0.6 (before "load")
    out = phase_counts([a, b], 0.5, phases, end_s=3.5)
    by = {p["name"]: p for p in out}
    # load [1.0, 2.0): 0.5+0.5=1.0, 0.5+1.2=1.7 (a), 0.5+1.1=1.6 (b)
    assert by["load"]["scheduled"] == 3 and by["load"]["ok"] == 2 and by["load"]["failed"] == 1
    assert by["load"]["failed_by"] == {"503": 1}
    assert by["load"]["scheduled_per_s"] == 3.0
    # grab [2.0, 3.0): 2.0 (a, dropped)
    assert by["grab"]["scheduled"] == 1 and by["grab"]["dropped"] == 1 and by["grab"]["sent"] == 0
    assert by["grab"]["p99_ms"] is None
    # end [3.0, 3.5): 3.1 (a, ok), 3.4 (b, timeout)
    assert by["end"]["scheduled"] == 2 and by["end"]["ok"] == 1
    assert by["end"]["failed_by"] == {"timeout": 1}
    assert by["end"]["span_s"] == 0.5
    assert by["load"]["p50_ms"] == pytest.approx(np.percentile([20.0, 30.0], 50))
    total = sum(p["scheduled"] for p in out)
    assert total == 6  # 0.6 and 0.7 fall before the first phase


def test_phase_counts_without_records() -> None:
    out = phase_counts([], 0.0, [{"name": "load", "t_s": 0.0}], end_s=1.0)
    assert out[0]["scheduled"] == 0 and out[0]["p50_ms"] is None
