"""load_tests.reliability.soak: its chunks and JSON no Ray, no GPU (verdict: test_slope.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from load_tests.reliability import soak
from tests.load_tests.reliability.test_slope import row  # one sample row for both


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


def test_slope_mode_defaults_to_an_hour_after_a_600_s_warmup() -> None:
    a = soak.parse_args(["--device", "cpu", "--mode", "slope"])
    assert (a.duration_s, a.warmup_s, a.slope_target_mib_per_h) == (3600.0, 600.0, 5.0)
    a = soak.parse_args(["--device", "cpu", "--mode", "slope", "--duration-s", "1800"])
    assert (a.duration_s, a.warmup_s) == (1800.0, 600.0)


def test_flat_mode_keeps_its_defaults() -> None:
    a = soak.parse_args(["--device", "cpu"])
    assert (a.mode, a.duration_s, a.warmup_s) == ("flat", 1800.0, 180.0)
    assert soak.parse_args(["--duration-s", "120"]).warmup_s == 30.0
    assert soak.extra_env(a) == {}


def test_replica_env_adds_env_vars_and_refuses_a_bare_word(capsys) -> None:
    a = soak.parse_args(["--replica-env", "MALLOC_ARENA_MAX=2", "--replica-env", "X=a=b"])
    assert soak.extra_env(a) == {"MALLOC_ARENA_MAX": "2", "X": "a=b"}
    with pytest.raises(SystemExit):
        soak.parse_args(["--replica-env", "MALLOC_ARENA_MAX"])
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_encoder_layers_point_the_app_at_a_model_of_that_depth() -> None:
    import json
    from pathlib import Path

    assert "model_path" not in soak.soak_args(soak.parse_args(["--device", "cpu"]))
    args = soak.soak_args(soak.parse_args(["--device", "cpu", "--encoder-layers", "0"]))
    assert args["load_format"] == "dummy" and args["device"] == "cpu"
    config = json.loads((Path(args["model_path"]) / "config.json").read_text())
    assert config["num_hidden_layers"] == 0 and config["hidden_size"] == 384
    with pytest.raises(SystemExit):
        soak.parse_args(["--encoder-layers", "-1"])


def test_rss_parts_and_smaps_read_this_process() -> None:
    import os

    parts = soak.rss_parts(os.getpid())
    assert parts["rss_anon_bytes"] > 0 and parts["rss_file_bytes"] > 0
    maps = soak.smaps_rss(os.getpid())
    assert any(name.endswith(".so") or ".so." in name for name in maps), sorted(maps)[:5]
    assert sum(maps.values()) >= parts["rss_anon_bytes"]
    assert soak.rss_parts(-1) == {} and soak.smaps_rss(-1) == {}


def test_smaps_growth_lists_the_largest_changes_first() -> None:
    first = {"[heap]": 100, "/lib/libcublasLt.so.13": 1000, "[anon]": 50, "same": 7}
    last = {"[heap]": 90, "/lib/libcublasLt.so.13": 5000, "[anon]": 80, "same": 7, "new": 20}
    got = soak.smaps_growth(first, last, top=3)
    assert got == [
        ["/lib/libcublasLt.so.13", 1000, 5000, 4000],
        ["[anon]", 50, 80, 30],
        ["new", 0, 20, 20],
    ]


def test_the_peak_is_measured_after_tracing_starts_when_frames_are_traced() -> None:
    assert soak.tracing_wait_s(soak.parse_args([])) == 0.0
    malloc_only = ["--tracemalloc-dir", "tm", "--tracemalloc-frames", "0"]
    assert soak.tracing_wait_s(soak.parse_args(malloc_only)) == 0.0
    traced = ["--tracemalloc-dir", "tm", "--tracemalloc-start-s", "150"]
    assert soak.tracing_wait_s(soak.parse_args(traced)) == 155.0


def test_compare_env_splits_the_replicas_and_keeps_its_env_apart(capsys) -> None:
    a = soak.parse_args(["--replicas", "5", "--compare-env", "MALLOC_ARENA_MAX=2"])
    assert soak.compare_env(a) == {"MALLOC_ARENA_MAX": "2"}
    assert soak.extra_env(a) == {}  # the first application's replicas do not get it
    assert soak.variants(a) == {soak.COMPARE_APP: {"MALLOC_ARENA_MAX": "2"}}
    assert soak.split_replicas(5, [soak.COMPARE_APP]) == {soak.APP: 2, soak.COMPARE_APP: 3}
    assert soak.split_replicas(4) == {soak.APP: 4}
    with pytest.raises(SystemExit):
        soak.parse_args(["--replicas", "1", "--compare-env", "MALLOC_ARENA_MAX=2"])
    assert "at least one per application (2)" in capsys.readouterr().err


def test_each_variant_is_one_more_application_with_its_own_env(capsys) -> None:
    argv = ["--replicas", "6", "--replica-num-gpus", "0.16", "--compare-env", "MALLOC_ARENA_MAX=2"]
    a = soak.parse_args([*argv, "--variant", "MALLOC_ARENA_MAX=4,X=a=b", "--variant", "Y=1"])
    assert soak.variants(a) == {
        soak.COMPARE_APP: {"MALLOC_ARENA_MAX": "2"},
        "variant1": {"MALLOC_ARENA_MAX": "4", "X": "a=b"},
        "variant2": {"Y": "1"},
    }
    assert a.replica_num_gpus == 0.16
    counts = soak.split_replicas(7, ["compare", "variant1", "variant2"])
    assert counts == {soak.APP: 1, "compare": 2, "variant1": 2, "variant2": 2}
    cpu = ["--device", "cpu", "--replica-num-gpus", "0.5"]
    for bad in (["--variant", "MALLOC_ARENA_MAX=4,X"], ["--replica-num-gpus", "0"], cpu):
        with pytest.raises(SystemExit):
            soak.parse_args(bad)
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_both_applications_are_offered_a_share_of_the_lower_mean_peak() -> None:
    peaks = {soak.APP: [100.0, 80.0], soak.COMPARE_APP: [95.0, 95.0]}
    assert soak.lowest_peak(peaks) == 90.0
    assert soak.lowest_peak({soak.APP: [42.0]}) == 42.0


def test_rows_are_judged_per_application_as_well() -> None:
    rows = [
        {**row(t, pid, 100_000_000 + k * t * 10_000), "application": app}
        for pid, (app, k) in {1: (soak.APP, 0), 2: (soak.COMPARE_APP, 1)}.items()
        for t in range(0, 700, 50)
    ]
    apps = soak.by_application(rows)
    assert sorted(apps) == sorted([soak.APP, soak.COMPARE_APP])
    assert {r["pid"] for r in apps[soak.COMPARE_APP]} == {2}
    flat = soak.verdict(apps[soak.APP], 100.0)
    grows = soak.verdict(apps[soak.COMPARE_APP], 100.0)
    assert flat["slope_ok"] is True
    assert grows["slope_ok"] is False  # 10 kB/s is 34 MiB/h


def test_several_applications_peaks_are_measured_all_loaded_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """They share the host: a peak measured alone would offer each the whole of it."""
    import time

    from load_tests.reliability import soak

    windows: list[tuple[str, float, float]] = []

    def fake_capacity(target: object, seconds: float, body: object, clients: int) -> float:
        t0 = time.monotonic()
        time.sleep(0.05)
        windows.append((str(target), t0, time.monotonic()))
        return 100.0 if str(target) == "a" else 80.0

    monkeypatch.setattr(soak, "capacity", fake_capacity)
    peaks = soak.measure_peaks({"a": "a", "b": "b"}, 1.0, {}, 4)  # type: ignore[dict-item]
    assert peaks == {"a": [100.0] * soak.PEAK_ROUNDS, "b": [80.0] * soak.PEAK_ROUNDS}
    assert len(windows) == 2 * (1 + soak.PEAK_ROUNDS)  # a window not counted, then the rounds
    for name, t0, t1 in windows:  # every window overlaps one of the other application's
        assert any(o != name and s0 < t1 and t0 < s1 for o, s0, s1 in windows), windows
    assert soak.lowest_peak(peaks) == 80.0
    assert soak.measure_peaks({"a": "a"}, 1.0, {}, 4) == {"a": [100.0]}  # type: ignore[dict-item]
