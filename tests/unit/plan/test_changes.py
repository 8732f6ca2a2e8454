"""What serve-app plan --from-running says to change: what runs now against the plan, and why;
on the reads of a real server (tests/unit/plan/test_live.py's fixtures)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from serve_app.plan import changes, live
from serve_app.plan.fromrunning import build_measurements
from serve_app.plan.hostprocs import HostFacts
from serve_app.plan.targets import ModelTarget, Targets
from serve_app.plan.write import write_plan
from tests.unit.plan.test_live import PROV, URL, cpu_window, h200_report, h200_window


def replan(tmp_path: Path, **ask: Any) -> list[dict[str, Any]]:
    """Plan the CPU fixture's application with the target ``ask``; the changes."""
    raw = cpu_window()
    name = raw["config"]["applications"][0]["name"]
    (rep,) = raw["last"]["replicas"]
    key = (rep["replica_id"], rep["pid"])
    host = HostFacts({key: 1.0}, {key: 1.5}, {key: 300 << 20}, True, 8 << 30, 2.0)
    targets = Targets.model_validate({"models": {name: {"p99_target_s": 2.0} | ask}})
    texts = (raw["metrics_first"], raw["metrics_last"])
    doc, windows = build_measurements(
        raw["config"], targets, raw["first"], raw["last"], texts, host, url=URL, window_s=4.0
    )
    config, measurements = tmp_path / "config.yaml", tmp_path / "measurements.json"
    config.write_text(yaml.safe_dump(raw["config"]))
    measurements.write_text(json.dumps(doc))
    write_plan(str(config), str(measurements), str(tmp_path / "out"))
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    return changes.diff(raw["config"], plan, doc, windows, raw["last"], None)


def test_a_plan_that_matches_what_runs_is_no_change(tmp_path: Path) -> None:
    (c,) = replan(tmp_path, max_replicas=1)
    assert c["now"]["replicas"] == c["plan"]["replicas"] == 1
    assert c["change"] is False and c["what"] == []
    assert "num_gpus not compared" in c["note"]  # CPU replicas
    text = changes.markdown([c], URL, "config.yaml")
    assert "| No change |" in text and "Change: No change." in text
    assert changes.summary([c]) == f"{c['application']}: no change"


def test_a_plan_for_more_replicas_says_so_and_why(tmp_path: Path) -> None:
    (c,) = replan(tmp_path, min_replicas=3, max_replicas=3)
    assert c["change"] is True and c["what"] == ["replicas 1 -> 3"]
    assert any("the plan on GPU 0 is bound by" in why for why in c["why"])
    assert any("planned by weight" in why for why in c["why"])
    text = changes.markdown([c], URL, "config.yaml")
    assert f"| {c['application']} | 1 -> 3 |" in text and "- planned by weight" in text


def test_a_load_above_what_runs_carries_is_a_missed_target() -> None:
    r = h200_report()
    w = h200_window(r)
    t = live.Traffic(requests=4848, how="counted", p99_s=0.2, p99_how="the metrics' p99")
    target = ModelTarget(p99_target_s=0.1, load_rps=5000)
    model = live.live_model_entry(w, t, live.gpu_memory_live([r]), target, 1.0, PROV)
    w = dataclasses.replace(w, p99_seen_s=t.p99_s)  # as fromrunning keeps it
    now = changes.now_of(w)
    planned = {"predicted_throughput_rps": 5000.0, "predicted_p99_s": 0.09}
    plan = {"gpus": [{"per_model": {"embeddings": {"replicas": 5}}, "binds": ["cores"]}]}
    why = changes.reasons("embeddings", w, now, planned, model, plan)
    # One replica carries about 1,134 req/s: below 5,000.
    assert any("1 replica(s) carry about 1,133.5 req/s" in y for y in why), why
    assert any("p99 200.0 ms in the window, over the target of 100 ms" in y for y in why)
    # A budget of half the H200 (75 GB) against 1.74 GB seen.
    assert any("budget 69.90 GiB is 43.1x the peak seen" in y for y in why), why
    assert "the plan on GPU 0 is bound by: cores" in why
    assert not any("busy" in y for y in why)  # 71% busy: not saturated
    busy = live.AppWindow(**{**w.__dict__, "busy_s": 5.9, "refused": 12})
    why = changes.reasons("embeddings", busy, now, planned, model, plan)
    assert why[0].startswith("12 requests refused") and "at saturation" in why[1]
