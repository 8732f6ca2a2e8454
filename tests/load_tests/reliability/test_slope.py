"""load_tests.reliability.slope: the soak's verdict, pure (spreads, slopes, replacements)."""

from __future__ import annotations

import pytest

from load_tests.reliability import slope

MIB = 1 << 20


def row(t_s: float, pid: int, rss: int, nvml: int | None = None, reserved: int = 0) -> dict:
    return {
        "t_s": t_s,
        "pid": pid,
        "rss_bytes": rss,
        "nvml_bytes": nvml,
        "reserved_bytes": reserved,
    }


def test_default_warmup_is_a_tenth_of_the_duration_at_least_30_s() -> None:
    assert slope.default_warmup_s(1800.0) == 180.0
    assert slope.default_warmup_s(120.0) == 30.0


def test_warmup_cut_counts_from_each_replicas_first_row() -> None:
    rows = [row(t, 1, 100) for t in (0.0, 10.0, 29.9, 30.0, 40.0)]
    rows += [row(t, 2, 100) for t in (50.0, 79.0, 80.0)]  # a replacement: its own warm-up
    cut = slope.after_warmup(rows, 30.0)
    assert [r["t_s"] for r in cut[1]] == [30.0, 40.0]
    assert [r["t_s"] for r in cut[2]] == [80.0]


def test_slope_is_bytes_per_minute_least_squares() -> None:
    assert slope.slope_per_min([(0.0, 0), (60.0, 1000), (120.0, 2000)]) == pytest.approx(1000.0)
    # (0,0) (30,0) (60,300): slope 5 bytes/s -> 300/min
    assert slope.slope_per_min([(0.0, 0), (30.0, 0), (60.0, 300)]) == pytest.approx(300.0)
    assert slope.slope_per_min([(5.0, 7)]) is None
    assert slope.slope_per_min([(5.0, 7), (5.0, 9)]) is None  # no time spread


def test_metric_stats_spread_needs_two_values_and_skips_nulls() -> None:
    rows = [row(0.0, 1, 500, None), row(60.0, 1, 800, 10), row(120.0, 1, 650, None)]
    assert slope.metric_stats(rows, "rss") == {
        "rss_min_bytes": 500,
        "rss_max_bytes": 800,
        "rss_spread_bytes": 300,
        "rss_slope_bytes_per_min": 75,
        "rss_slope_mib_per_h": round(75 * 60 / MIB, 3),
        # residuals -75, 150, -75 around the line; sum of (t - mean t)^2 = 7200
        "rss_slope_stderr_mib_per_h": slope.mib_per_h((33750 / 7200) ** 0.5),
    }
    assert slope.metric_stats(rows, "nvml") == {
        "nvml_min_bytes": 10,
        "nvml_max_bytes": 10,
        "nvml_spread_bytes": None,
        "nvml_slope_bytes_per_min": None,
        "nvml_slope_mib_per_h": None,
        "nvml_slope_stderr_mib_per_h": None,
    }


def test_flat_when_every_spread_is_within_the_bound_after_warmup() -> None:
    # Replica 1 grows 500 MiB during warm-up only; replica 2 wobbles 50 MiB all along.
    rows = [row(0.0, 1, 0), row(10.0, 1, 500 * MIB)]
    rows += [row(t, 1, 500 * MIB + (t == 60.0) * 90 * MIB, 2 << 30) for t in (40.0, 60.0, 80.0)]
    rows += [row(t, 2, 1 << 30, (2 << 30) + (t % 20 == 0) * 50 * MIB) for t in range(0, 90, 10)]
    v = slope.verdict(rows, warmup_s=30.0)
    assert v["flat"] is True
    assert v["flat_bytes"] == 100_000_000
    assert v["max_spread_bytes"] == 90 * MIB
    assert v["replaced"] is False
    by_pid = {e["pid"]: e for e in v["replicas"]}
    assert by_pid[1]["samples_judged"] == 3
    assert by_pid[1]["rss_spread_bytes"] == 90 * MIB
    assert by_pid[1]["rss_slope_bytes_per_min"] == 0
    assert by_pid[2]["nvml_spread_bytes"] == 50 * MIB


def test_not_flat_when_one_spread_passes_100_mb_decimal() -> None:
    # 96 MiB = 100.66 MB: within 100 MiB, but not within the 100 MB.
    rows = [row(t, 1, 1 << 30) for t in (40.0, 50.0)]
    rows += [row(40.0, 2, 0, 0), row(50.0, 2, 0, 96 * MIB)]
    v = slope.verdict([row(0.0, 1, 0), row(0.0, 2, 0, 0), *rows], warmup_s=30.0)
    assert v["flat"] is False
    assert v["max_spread_bytes"] == 96 * MIB
    assert slope.verdict(rows, warmup_s=0.0, flat_bytes=101 * MIB)["flat"] is True


def test_nothing_to_judge_is_none_and_lists_the_pids() -> None:
    v = slope.verdict([row(0.0, 1, 10), row(40.0, 1, 10)], warmup_s=30.0)
    assert v["flat"] is None
    assert v["not_judged_pids"] == [1]
    assert slope.verdict([], warmup_s=30.0)["flat"] is None


def test_replacements_by_pid() -> None:
    rows = [row(t, 1, 0) for t in (0.0, 5.0)] + [row(t, 2, 0) for t in (0.0, 5.0, 10.0)]
    rows += [row(t, 3, 0) for t in (7.0, 10.0)]
    assert slope.replacements(rows) == {
        "replaced": True,
        "appeared": [{"pid": 3, "first_t_s": 7.0}],
        "gone": [{"pid": 1, "last_t_s": 5.0}],
    }


def test_slope_in_mib_per_hour_with_no_error_on_a_straight_line() -> None:
    rows = [row(t, 1, 200 * MIB + int(t / 3600 * 5 * MIB)) for t in range(0, 3601, 60)]
    stats = slope.metric_stats(rows, "rss")
    assert stats["rss_slope_mib_per_h"] == pytest.approx(5.0, abs=0.001)
    assert stats["rss_slope_stderr_mib_per_h"] == pytest.approx(0.0, abs=0.001)


def test_stderr_needs_three_points_and_grows_with_noise() -> None:
    assert slope.fit([(0.0, 0), (10.0, 10)]) == (pytest.approx(1.0), None)
    quiet = slope.fit([(float(t), t + (t % 20 == 0)) for t in range(0, 100, 10)])
    noisy = slope.fit([(float(t), t + 50 * (t % 20 == 0)) for t in range(0, 100, 10)])
    assert quiet is not None and noisy is not None
    assert quiet[1] is not None and noisy[1] is not None
    assert 0 < quiet[1] < noisy[1]
    assert slope.fit([(1.0, 1), (1.0, 2), (1.0, 3)]) is None


def test_slope_ok_judges_every_metric_of_every_replica_after_its_warmup() -> None:
    # Replica 1: 300 MiB during its 600 s warm-up, then 2 MiB/h; replica 2 flat RSS but its
    # reserved bytes grow 6 MiB/h: over the 5 MiB/h target.
    rows = [row(0.0, 1, 0), row(300.0, 1, 300 * MIB)]
    rows += [row(t, 1, 300 * MIB + int(t / 3600 * 2 * MIB)) for t in range(600, 3601, 60)]
    grow = [row(t, 2, 100 * MIB, reserved=int(t / 3600 * 6 * MIB)) for t in range(0, 3601, 60)]
    v = slope.verdict(rows, warmup_s=600.0)
    assert v["slope_ok"] is True
    assert v["max_slope_mib_per_h"] == pytest.approx(2.0, abs=0.01)
    assert v["replicas"][0]["judged_s"] == 3000.0
    v = slope.verdict(rows + grow, warmup_s=600.0)
    assert v["slope_ok"] is False
    assert v["max_slope_mib_per_h"] == pytest.approx(6.0, abs=0.01)
    assert slope.verdict(rows + grow, 600.0, slope_target_mib_per_h=6.5)["slope_ok"] is True
    assert v["flat"] is True  # 300 MiB during warm-up is not judged, 5 MiB after it within 100 MB


def test_slope_ok_is_none_with_nothing_to_judge() -> None:
    v = slope.verdict([row(0.0, 1, 10), row(40.0, 1, 10)], warmup_s=600.0)
    assert (v["slope_ok"], v["max_slope_mib_per_h"]) == (None, None)
