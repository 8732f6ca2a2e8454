"""load_tests.benchmarks.startup.rows, the start-up bench's pure part: configs, rows, the
policy's decisions read from its log lines, the first answer of each new replica, and the
summary against issue #11's targets. No Ray, no HTTP."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from load_tests.benchmarks.startup import rows
from serve_app.config.deploy import check_deploy_config

ROOT = Path(__file__).resolve().parents[4]
GIB = 1 << 30


def config(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "configs" / name).read_text())
    return doc


def report(rid: str, pool: int | None = None, total_s: float = 4.0) -> dict[str, Any]:
    return {
        "replica_id": rid,
        "gpu_mode": "cuda" if pool is not None else "cpu",
        "startup_phases_s": {"process": 1.0, "weights": 0.5, "total": total_s},
        "first_request_s": total_s + 0.25,
        "calibration_source": "cache",
        "cuda_graphs": 3,
        "cuda_graph_pool_bytes": pool,
        "budget_bytes": 123,  # not a row field: left out
    }


def local_line(epoch_s: float, text: str) -> str:
    """A Serve controller log line stamped ``epoch_s`` the way Ray writes it (local time)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_s))
    return f"INFO {stamp},{int(round(epoch_s % 1 * 1000)):03d} controller 4242 -- {text}\n"


# ---- configs -------------------------------------------------------------------------------


def test_cold_config_gpu_is_gpu_shared_with_dummy_weights_and_the_run_cache(
    tmp_path: Path,
) -> None:
    base = config("gpu-shared.yaml")
    doc = rows.cold_config(base, "cuda", 4, tmp_path / "cache")
    app = doc["applications"][0]
    dep = app["deployments"][0]
    assert dep["num_replicas"] == 4
    assert dep["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0.25}
    assert app["args"]["load_format"] == "dummy"
    assert app["args"]["dtype"] == "float16"
    assert app["args"]["memory"]["calibration_cache_dir"] == str(tmp_path / "cache")
    assert app["args"]["memory"]["calibrate"] is True  # gpu-shared.yaml's own setting kept
    assert doc["http_options"]["host"] == "127.0.0.1"
    assert base["applications"][0]["args"].get("load_format") is None  # not mutated
    assert check_deploy_config(doc) == []


def test_cold_config_cpu_has_two_half_cpu_replicas_with_real_weights(tmp_path: Path) -> None:
    doc = rows.cold_config(config("cpu.yaml"), "cpu", 2, tmp_path)
    dep = doc["applications"][0]["deployments"][0]
    assert dep["num_replicas"] == 2
    assert dep["ray_actor_options"]["num_cpus"] == 0.5
    assert "load_format" not in doc["applications"][0]["args"]
    assert check_deploy_config(doc) == []


def test_autoscaling_config_is_controller_yaml_with_short_cooldowns() -> None:
    doc = config("controller.yaml")
    got = rows.autoscaling_config(doc, 3)
    assert (got["min_replicas"], got["max_replicas"]) == (1, 3)
    kwargs = got["policy"]["policy_kwargs"]
    assert got["policy"]["policy_function"] == "serve_app.autoscale:HeadroomPolicy"
    assert kwargs["upscale_cooldown_s"] == 1
    assert kwargs["downscale_cooldown_s"] == 3
    assert kwargs["shed_cooldown_s"] == 1
    assert kwargs["safety_margin_bytes"] == 2 * GIB  # controller.yaml's
    assert got["metrics_interval_s"] == 0.25
    assert got["look_back_period_s"] == 2
    original = doc["applications"][0]["deployments"][0]["autoscaling_config"]
    assert original["policy"]["policy_kwargs"]["upscale_cooldown_s"] == 30  # not mutated
    from serve_app.control.settings import config_errors

    assert config_errors(kwargs) == []


# ---- rows ----------------------------------------------------------------------------------


def test_make_row_keeps_report_fields_and_the_largest_pool() -> None:
    row = rows.make_row(
        "cold_4x0.25_minilm",
        2,
        [report("a", 100), report("b", 300), report("c", None)],
        cold_ready_s=9.5,
        all_serving_s=None,
        note=None,
    )
    assert row["setup"] == "cold_4x0.25_minilm" and row["repeat"] == 2
    assert row["cold_ready_s"] == 9.5
    assert "all_serving_s" in row and row["all_serving_s"] is None  # a clock that never stopped
    assert "note" not in row
    assert row["graph_pool_bytes"] == 300
    assert [r["replica_id"] for r in row["replicas"]] == ["a", "b", "c"]
    assert set(row["replicas"][0]) == set(rows.REPORT_FIELDS)
    assert row["replicas"][0]["startup_phases_s"]["total"] == 4.0


def test_make_row_without_pools_has_null_graph_pool() -> None:
    row = rows.make_row("replacement", 0, [report("a")], replacement_s=3.0, note="x")
    assert row["graph_pool_bytes"] is None
    assert row["note"] == "x"


def test_first_answers_one_per_new_replica_in_end_time_order() -> None:
    results = [
        (10.0, 0.5, 200, "application/json", "old"),
        (10.0, 3.0, 200, "application/json", "b"),  # ends 13.0
        (11.0, 0.5, 200, "application/json", "a"),  # ends 11.5
        (12.0, 0.2, 200, "application/json", "a"),  # a later answer of a
        (10.5, 0.1, 503, "application/json", "c"),  # not an answer
        (10.6, 0.1, "ConnectError(x)", "", ""),
        (12.5, 0.1, 200, "application/json", "c"),  # ends 12.6
    ]
    assert rows.first_answers(results, {"old"}) == [(11.5, "a"), (12.6, "c"), (13.0, "b")]
    assert rows.first_answers([], set()) == []


# ---- decisions -----------------------------------------------------------------------------


def test_parse_decisions_reads_scale_ups_of_one_deployment_in_epoch_seconds() -> None:
    t = 1_790_000_000.25
    lines = [
        local_line(t - 5, "serve_app autoscale app/model: 1 -> 1 (hold_in_band): load 0.0"),
        local_line(t - 4, "serve_app autoscale app/model: 1 -> 2 (scale_up): before since_s"),
        local_line(t, "serve_app autoscale app/model: 1 -> 2 (scale_up): load 8.0 > 2.0 x 1"),
        local_line(t + 0.1, "serve_app autoscale app/model: 2 -> 2 (hold_pending): 1 of 2"),
        local_line(t + 6.5, "serve_app autoscale other/model: 1 -> 2 (scale_up): another"),
        local_line(t + 7.125, "serve_app autoscale app/model: 2 -> 4 (scale_up): load 16"),
        local_line(t + 20, "serve_app autoscale app/model: 4 -> 1 (scale_down): load 0.0"),
        "a line that is not a decision\n",
    ]
    ups = rows.parse_decisions(lines, "app/model", since_s=t - 1)
    assert [(before, after, reason) for _, before, after, reason in ups] == [
        (1, 2, "scale_up"),
        (2, 4, "scale_up"),
    ]
    assert ups[0][0] == pytest.approx(t, abs=1e-3)
    assert ups[1][0] == pytest.approx(t + 7.125, abs=1e-3)


def test_parse_decisions_reads_ray_controller_log_format() -> None:
    line = (
        "INFO 2026-12-01 02:39:16,481 controller 26492 -- serve_app autoscale "
        "startup-decision/model: 1 -> 2 (scale_up): load 8.0 > 2.0 x 1; gpu:0c20 has 79.00 "
        "GiB free for 1 x 20.00 GiB + margin 2.00 GiB\n"
    )
    ((at_s, before, after, reason),) = rows.parse_decisions([line], "startup-decision/model", 0)
    assert (before, after, reason) == (1, 2, "scale_up")
    expected = time.mktime(time.strptime("2026-12-01 02:39:16", "%Y-%m-%d %H:%M:%S")) + 0.481
    assert at_s == pytest.approx(expected, abs=1e-6)


def test_expand_ups_one_entry_per_added_replica() -> None:
    ups = [(1.0, 1, 2, "scale_up"), (5.0, 2, 4, "scale_up")]
    assert rows.expand_ups(ups) == [(1.0, 1, 2), (5.0, 2, 4), (5.0, 2, 4)]


# ---- summary -------------------------------------------------------------------------------


def test_stats() -> None:
    assert rows.stats([]) == {"n": 0, "median": None, "min": None, "max": None}
    assert rows.stats([3.0, 1.0, 2.0, 10.0]) == {"n": 4, "median": 2.5, "min": 1.0, "max": 10.0}


def test_summary_medians_targets_and_missing() -> None:
    pool_ok = int(0.25 * GIB)
    data = [
        rows.make_row("decision", i, [report(f"d{i}", pool_ok)], decision_to_serving_s=s)
        for i, s in enumerate([4.0, 6.0, 4.5, 4.8, 5.5])
    ]
    data.append(rows.make_row("replacement", 0, [], replacement_s=None, replacement_up_s=2.0))
    data.append(rows.make_row("replacement", 1, [report("r1", pool_ok)], replacement_s=12.0))
    cold_reports = [report(f"c{i}", pool_ok, total_s=6.0) for i in range(4)]
    data.append(rows.make_row("cold_4x0.25_minilm", 0, cold_reports, cold_ready_s=14.0))
    s = rows.summarize(data)

    d = s["decision_to_serving_s"]
    assert (d["n"], d["median"], d["min"], d["max"]) == (5, 4.8, 4.0, 6.0)
    assert (d["target"], d["met_by"], d["met"], d["enough_samples"]) == (5.0, "median", True, True)
    r = s["replacement_s"]
    assert (r["n"], r["median"], r["met"], r["missing"], r["enough_samples"]) == (
        1,
        12.0,
        False,
        1,
        False,
    )
    c = s["cold_ready_s"]
    assert (c["n"], c["met"]) == (1, True)
    g = s["graph_pool_bytes"]
    assert g["n"] == 10  # every replica once: 5 decision, 1 replacement, 4 cold
    assert (g["met_by"], g["met"], g["max"]) == ("max", True, pool_ok)
    assert s["informational"]["replacement_up_s"]["median"] == 2.0
    assert s["informational"]["all_serving_s"]["n"] == 0
    # Over every replica: 6 at 4.0 s (5 decision, 1 replacement), 4 cold at 6.0 s.
    assert s["phases_median_s"]["total"] == 4.0
    assert s["phases_median_s"]["first_request"] == 4.25
    assert s["phases_median_s"]["process"] == 1.0


def test_summary_graph_pool_is_missed_by_one_replica_over_target() -> None:
    over = int(0.3 * GIB) + 1
    data = [rows.make_row("cold", 0, [report("a", 1000), report("b", over), report("c", 2000)])]
    g = rows.summarize(data)["graph_pool_bytes"]
    assert g["median"] == 2000 and g["met"] is False  # median within, one replica over


def test_summary_without_rows_meets_nothing() -> None:
    s = rows.summarize([])
    for name in rows.TARGETS:
        assert s[name]["n"] == 0 and s[name]["met"] is None and not s[name]["enough_samples"]
    assert s["phases_median_s"] == {}


def test_cpu_rows_have_no_graph_pool_samples() -> None:
    data = [rows.make_row("replacement", 0, [report("a", None)], replacement_s=8.0)]
    g = rows.summarize(data)["graph_pool_bytes"]
    assert g["n"] == 0 and g["met"] is None
