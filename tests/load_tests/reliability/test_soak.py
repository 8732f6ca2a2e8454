"""load_tests.reliability.soak: its verdict, chunks and JSON (no Ray, no GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from load_tests.reliability import soak

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
    assert soak.default_warmup_s(1800.0) == 180.0
    assert soak.default_warmup_s(120.0) == 30.0


def test_warmup_cut_counts_from_each_replicas_first_row() -> None:
    rows = [row(t, 1, 100) for t in (0.0, 10.0, 29.9, 30.0, 40.0)]
    rows += [row(t, 2, 100) for t in (50.0, 79.0, 80.0)]  # a replacement: its own warm-up
    cut = soak.after_warmup(rows, 30.0)
    assert [r["t_s"] for r in cut[1]] == [30.0, 40.0]
    assert [r["t_s"] for r in cut[2]] == [80.0]


def test_slope_is_bytes_per_minute_least_squares() -> None:
    assert soak.slope_per_min([(0.0, 0), (60.0, 1000), (120.0, 2000)]) == pytest.approx(1000.0)
    # (0,0) (30,0) (60,300): slope 5 bytes/s -> 300/min
    assert soak.slope_per_min([(0.0, 0), (30.0, 0), (60.0, 300)]) == pytest.approx(300.0)
    assert soak.slope_per_min([(5.0, 7)]) is None
    assert soak.slope_per_min([(5.0, 7), (5.0, 9)]) is None  # no time spread


def test_metric_stats_spread_needs_two_values_and_skips_nulls() -> None:
    rows = [row(0.0, 1, 500, None), row(60.0, 1, 800, 10), row(120.0, 1, 650, None)]
    assert soak.metric_stats(rows, "rss") == {
        "rss_min_bytes": 500,
        "rss_max_bytes": 800,
        "rss_spread_bytes": 300,
        "rss_slope_bytes_per_min": 75,
    }
    assert soak.metric_stats(rows, "nvml") == {
        "nvml_min_bytes": 10,
        "nvml_max_bytes": 10,
        "nvml_spread_bytes": None,
        "nvml_slope_bytes_per_min": None,
    }


def test_flat_when_every_spread_is_within_the_bound_after_warmup() -> None:
    # Replica 1 grows 500 MiB during warm-up only; replica 2 wobbles 50 MiB all along.
    rows = [row(0.0, 1, 0), row(10.0, 1, 500 * MIB)]
    rows += [row(t, 1, 500 * MIB + (t == 60.0) * 90 * MIB, 2 << 30) for t in (40.0, 60.0, 80.0)]
    rows += [row(t, 2, 1 << 30, (2 << 30) + (t % 20 == 0) * 50 * MIB) for t in range(0, 90, 10)]
    v = soak.verdict(rows, warmup_s=30.0)
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
    v = soak.verdict([row(0.0, 1, 0), row(0.0, 2, 0, 0), *rows], warmup_s=30.0)
    assert v["flat"] is False
    assert v["max_spread_bytes"] == 96 * MIB
    assert soak.verdict(rows, warmup_s=0.0, flat_bytes=101 * MIB)["flat"] is True


def test_nothing_to_judge_is_none_and_lists_the_pids() -> None:
    v = soak.verdict([row(0.0, 1, 10), row(40.0, 1, 10)], warmup_s=30.0)
    assert v["flat"] is None
    assert v["not_judged_pids"] == [1]
    assert soak.verdict([], warmup_s=30.0)["flat"] is None


def test_replacements_by_pid() -> None:
    rows = [row(t, 1, 0) for t in (0.0, 5.0)] + [row(t, 2, 0) for t in (0.0, 5.0, 10.0)]
    rows += [row(t, 3, 0) for t in (7.0, 10.0)]
    assert soak.replacements(rows) == {
        "replaced": True,
        "appeared": [{"pid": 3, "first_t_s": 7.0}],
        "gone": [{"pid": 1, "last_t_s": 5.0}],
    }


def test_chunk_stats_counts_and_percentiles() -> None:
    outcomes = [(200, "application/json", 0.01 * i) for i in range(1, 101)]
    outcomes += [(503, "application/json", 0.001), ("ReadTimeout(x)", "", 60.0)]
    c = soak.chunk_stats(outcomes, start_s=30.04, duration_s=30.0, wall_s=30.51)
    assert (c["sent"], c["ok"], c["failed"], c["lost"]) == (102, 100, 1, 1)
    assert (c["accepted_p50_s"], c["accepted_p99_s"]) == (0.51, 1.0)
    assert (c["start_s"], c["wall_s"]) == (30.0, 30.5)


def test_latest_nvml_takes_the_newest_sample_per_pid_in_the_window() -> None:
    samples = [
        {"t_unix_s": 1.0, "source": "nvml", "pid": 7, "used_bytes": 1},
        {"t_unix_s": 2.0, "source": "nvml", "pid": 7, "used_bytes": 2},
        {"t_unix_s": 2.0, "source": "nvml", "pid": 8, "used_bytes": None},
        {"t_unix_s": 3.0, "source": "nvml", "pid": 9, "used_bytes": 9},
    ]
    assert soak.latest_nvml(samples, since_unix_s=1.5) == {7: 2, 9: 9}
    assert soak.latest_nvml(samples, since_unix_s=4.0) == {}


def test_write_is_valid_json_with_one_line_per_sample(tmp_path: Path) -> None:
    path = tmp_path / "soak.json"
    doc = {"device": "cpu", "samples": [row(0.0, 1, 5), row(5.0, 1, 6)]}
    soak.write(path, doc)
    assert json.loads(path.read_text()) == doc
    assert sum('"pid"' in line for line in path.read_text().splitlines()) == 2
    soak.write(path, {"samples": []})
    assert json.loads(path.read_text()) == {"samples": []}
