"""load_tests.harness.openloop: the summary of the open-loop workers' records of one rate point."""

from __future__ import annotations

import numpy as np
import pytest

from load_tests.harness.openloop import STATUS_CODES, summarise_openloop


def _worker_array(times: list[float], lat: list[float], status: list[int]) -> np.ndarray:
    lag = [0.001] * len(times)
    return np.array([times, lat, lag, status], dtype=np.float64)


def test_summarise_openloop_window_errors_and_percentiles() -> None:
    codes = STATUS_CODES
    a = _worker_array(
        [0.2, 1.0, 1.5, 2.0, 2.5],  # warm-up 0.5 s: the first is not measured
        [0.4, 0.010, 0.020, 0.030, 0.9],  # the last completes after the window's end (3.0 s)
        [200, 200, 200, 503, 200],
    )
    b = _worker_array([1.2, 1.4, 2.9], [0.040, float("nan"), 0.050], [200, codes["timeout"], 200])
    c = _worker_array([0.7], [float("nan")], [codes["dropped"]])
    results = [{"cpu_frac": 0.5, "start_late_s": 0.0}, {"cpu_frac": 0.7, "start_late_s": 0.01}]
    s = summarise_openloop([a, b, c], results, 4.0, duration_s=2.5, warmup_s=0.5)
    assert s["requests"] == 8
    assert s["ok"] == 5  # 1.0, 1.5, 2.5, 1.2, 2.9
    assert s["error_counts"] == {"status": 1, "timeout": 1, "dropped": 1}
    assert s["errors"] == 3
    # 2xx completing inside [0.5, 3.0), warm-up ones too: 0.2+0.4, 1.01, 1.52, 1.24, 2.95
    # (not 2.5+0.9 = 3.4)
    assert s["requests_per_s"] == pytest.approx(5 / 2.5)
    ok_latencies = np.array([0.010, 0.020, 0.9, 0.040, 0.050])
    assert s["p50_ms"] == pytest.approx(float(np.percentile(ok_latencies, 50)) * 1e3)
    assert s["p99_ms"] == pytest.approx(float(np.percentile(ok_latencies, 99)) * 1e3)
    assert s["max_ms"] == pytest.approx(900.0)
    assert s["scheduled_per_s"] == pytest.approx(8 / 2.5)
    assert s["client_cpu_frac_max"] == 0.7
    assert s["client_keeps_up"] is False  # one request dropped at the in-flight cap


def test_summarise_openloop_keeps_up_judges_lag_and_cpu() -> None:
    a = _worker_array([0.1, 0.2], [0.001, 0.001], [200, 200])
    ok = summarise_openloop([a], [{"cpu_frac": 0.2}], 10.0, 1.0, 0.0)
    assert ok["client_keeps_up"] is True and ok["errors"] == 0
    busy = summarise_openloop([a], [{"cpu_frac": 0.99}], 10.0, 1.0, 0.0)
    assert busy["client_keeps_up"] is False
    late = a.copy()
    late[2] = [0.001, 0.050]  # sent 50 ms late
    assert summarise_openloop([late], [{}], 10.0, 1.0, 0.0)["client_keeps_up"] is False
