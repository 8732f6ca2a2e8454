"""The plan's load loop against a real local HTTP server: spawned aiohttp clients, the window
on the host's monotonic clock, the client's CPU per process."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import pytest

from serve_app.plan import ingress
from serve_app.plan.loop import Target, client_processes, run_window, split


def test_client_processes_take_a_quarter_of_the_cores_within_bounds() -> None:
    assert client_processes(34, cpu_count=16) == 4
    assert client_processes(1, cpu_count=16) == 1  # never more than the requests in flight
    assert client_processes(512, cpu_count=2) == 1
    assert client_processes(512, cpu_count=128) == 8
    assert split(34, 4) == [9, 9, 8, 8] and sum(split(7, 3)) == 7


def _target(url: str, reader: Callable[[], Mapping[int, ingress.ProcCpu]] | None = None) -> Target:
    busy = iter(range(1000))
    return Target(
        url,
        b'{"input": "x"}',
        {"content-type": "application/json"},
        os.getpid(),
        None,
        lambda: float(next(busy)),
        reader,
    )


def test_a_window_counts_answers_latencies_and_the_clients_cpu(server: str) -> None:
    r = run_window(_target(server + "/ok"), 3, warmup_s=0.2, window_s=0.6)
    assert r.requests > 0 and r.errors == 0
    assert r.window_s == pytest.approx(0.6)
    assert 0 < r.p50_s <= r.p99_s < 1.0
    assert r.client_processes == 1 and 0 < r.client_cpu_fraction < 1.5
    assert r.batch_busy_s == 1.0  # the report read once at each edge of the window
    assert r.gpu_busy_s is None and r.replica_nvml_peak_bytes is None  # no GPU given
    assert r.ingress_cpu_s == 0 and r.ingress_processes_by_kind == {}  # no ingress given


def test_the_ingress_processes_cpu_is_read_at_the_windows_edges(server: str) -> None:
    # The HTTP server answering is this process: read as the ingress, it spent CPU seconds.
    here = {os.getpid(): ingress.HAPROXY}
    r = run_window(_target(server + "/spin", lambda: ingress.read(here)), 3, 0.2, 0.6)
    assert r.requests > 0 and r.errors == 0
    assert r.ingress_processes_by_kind == {"haproxy": 1} and r.ingress_processes_lost == 0
    assert r.ingress_cpu_s == r.ingress_cpu_s_by_kind["haproxy"] > 0
    assert r.ingress_cpu_s <= (os.cpu_count() or 1) * (r.window_s + 0.1)  # at most every core
