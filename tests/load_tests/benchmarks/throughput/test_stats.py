"""load_tests.benchmarks.throughput.stats: the client-ceiling search, GPU shares and CPUs."""

from __future__ import annotations

import pytest

from load_tests.benchmarks.throughput import stats


def test_ceiling_point_passes_against_its_own_schedule() -> None:
    point = {"client_keeps_up": True, "errors": 0, "scheduled_per_s": 90.0}
    assert stats.ceiling_point_passes({**point, "requests_per_s": 88.0})
    assert not stats.ceiling_point_passes({**point, "requests_per_s": 87.0})
    assert not stats.ceiling_point_passes({**point, "requests_per_s": 90.0, "errors": 1})
    assert not stats.ceiling_point_passes({**point, "requests_per_s": 90.0, "client_keeps_up": 0})


def _search(passes_below: float, start: float, max_rate: float, limit: int = 8) -> list[float]:
    history: list[tuple[float, bool]] = []
    while len(history) < limit:
        rate = stats.next_ceiling_rate(history, start, 2.0, max_rate)
        if rate is None:
            break
        history.append((rate, rate < passes_below))
    return [round(r) for r, _ in history]


def test_ceiling_search_climbs_then_bisects_once() -> None:
    assert _search(70000, 25000, 200000) == [25000, 50000, 100000, 70711]


def test_ceiling_search_stops_at_max_rate() -> None:
    assert _search(1e9, 25000, 100000) == [25000, 50000, 100000]


def test_ceiling_search_steps_down_when_the_start_fails() -> None:
    assert _search(20000, 25000, 200000) == [25000, 6250, 12500, 17678]
    assert _search(1000, 25000, 200000) == [25000, 6250, 1562]


def test_client_ceiling_is_the_highest_rate_offered_and_sustained() -> None:
    def point(offered: float, carried: float, keeps_up: bool = True) -> dict[str, object]:
        return {
            "offered_per_s": offered,
            "scheduled_per_s": offered,
            "requests_per_s": carried,
            "errors": 0,
            "client_keeps_up": keeps_up,
        }

    points = [point(25000, 24990), point(50000, 49000), point(100000, 61000, keeps_up=False)]
    got = stats.client_ceiling(points)
    assert got["sustained_per_s"] == 50000 and got["sustained_offered_per_s"] == 50000
    assert got["max_carried_per_s"] == 61000 and got["best_point"] is points[1]
    assert stats.client_ceiling([point(100, 10)])["sustained_per_s"] is None


@pytest.mark.parametrize("n,share", [(1, 1.0), (4, 0.25), (8, 0.12), (12, 0.08), (16, 0.06)])
def test_replica_share_fits_one_gpu(n: int, share: float) -> None:
    assert stats.replica_share(n) == share
    assert n * stats.replica_share(n) <= 1.0


def test_replica_cpus_place_on_the_server_cores() -> None:
    assert stats.replica_cpus(4, 16) == 1.0
    assert stats.replica_cpus(16, 16) == 1.0
    assert stats.replica_cpus(16, 8) == 0.5
    assert stats.replica_cpus(12, 8) == 0.66
    assert 12 * stats.replica_cpus(12, 8) <= 8
