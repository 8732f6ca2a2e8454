"""load_tests.harness.openloop: the summary of the open-loop workers' records of one rate point,
and a job that runs until told to stop (against a local HTTP server)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from load_tests.harness.openloop import (
    STATUS_CODES,
    OpenLoopPool,
    read_progress,
    summarise_openloop,
)


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
    jitter = a.copy()
    jitter[2] = [0.001, 0.012]  # 12 ms late: a loaded machine's scheduling, under a looser bound
    assert summarise_openloop([jitter], [{}], 10.0, 1.0, 0.0)["client_keeps_up"] is False
    loose = summarise_openloop([jitter], [{}], 10.0, 1.0, 0.0, max_send_lag_p99_ms=25.0)
    assert loose["client_keeps_up"] is True and loose["max_send_lag_p99_ms"] == 25.0
    assert summarise_openloop([late], [{}], 10.0, 1.0, 0.0, 25.0)["client_keeps_up"] is False


class _Handler(BaseHTTPRequestHandler):
    """200 on /ok, 503 with a body elsewhere; keeps connections alive as HAProxy does."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/slow":
            time.sleep(3.0)
        code, body = (200, b"{}") if self.path in ("/ok", "/slow") else (503, b"overloaded, retry")
        self.send_response(code)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def short_job(pool: OpenLoopPool, url: str, body: Path, **overrides: float) -> list[Path]:
    """A half-second job at 50/s over 4 connections (``overrides`` change any of it)."""
    job = {"rate_per_s": 50.0, "duration_s": 0.5, "warmup_s": 0.0, "connections": 4}
    job.update(timeout_s=5.0, max_in_flight=16)
    job.update(overrides)
    return pool.submit(url, {}, body, **job)


def test_a_job_runs_until_told_to_stop_and_reports_progress(server: str, tmp_path: Path) -> None:
    """The controller GPU test's use: a long schedule, live counts, a stop file."""
    body = tmp_path / "body.json"
    body.write_text("{}")
    pool = OpenLoopPool(sorted(os.sched_getaffinity(0))[:1], 1, tmp_path)
    try:
        stop = tmp_path / "stop"
        progress = pool.submit(
            f"{server}/ok",
            {},
            body,
            rate_per_s=200.0,
            duration_s=60.0,
            warmup_s=0.0,
            connections=8,
            timeout_s=30.0,
            max_in_flight=64,
            stop_path=stop,
            drain_s=30.0,  # a loaded CI host once left 16 unanswered after a 3 s drain
        )
        deadline = time.monotonic() + 10.0
        while read_progress(progress)["ok"] < 40 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert read_progress(progress)["ok"] >= 40, read_progress(progress)
        stop.write_text("stop")
        started = time.monotonic()
        summary = pool.collect()
        assert time.monotonic() - started < 10.0  # not the 60 s schedule
        result = pool.last_results[0]
        assert result["stopped_at_s"] is not None and result["stopped_at_s"] < 15.0
        rows = pool.last_arrays[0]
        assert rows.shape[0] == 4 and 40 <= rows.shape[1] < 200 * 15  # cut at the stop
        final = read_progress(progress)
        assert final["sent"] == final["ok"] == rows.shape[1] and final["in_flight"] == 0
        assert final["failed"] == 0 and final["dropped"] == 0
        assert summary["errors"] == 0 and summary["duration_s"] < 15.0
        assert summary["start_at_unix"] > 0

        short_job(pool, f"{server}/busy", body)
        summary = pool.collect()
        samples = pool.last_results[0]["error_samples"]
        assert summary["error_counts"].get("status", 0) >= 5
        assert len(samples) == 5 and all(s.startswith("503: ") for s in samples), samples
        assert "overloaded" in samples[0]
    finally:
        pool.close()


def test_unanswered_after_the_drain_count_as_failed(server: str, tmp_path: Path) -> None:
    """Cut at the drain's end, they are timeouts in the records and failed in the progress."""
    body = tmp_path / "body.json"
    body.write_text("{}")
    pool = OpenLoopPool(sorted(os.sched_getaffinity(0))[:1], 1, tmp_path)
    try:
        progress = short_job(
            pool,
            f"{server}/slow",
            body,
            rate_per_s=20.0,
            connections=16,
            timeout_s=30.0,
            drain_s=0.5,
        )
        summary = pool.collect()
        rows = pool.last_arrays[0]
        final = read_progress(progress)
        assert final["sent"] == rows.shape[1] >= 5 and final["ok"] == 0
        assert final["failed"] == final["sent"] and final["in_flight"] == 0
        assert summary["error_counts"] == {"timeout": rows.shape[1]}
    finally:
        pool.close()
