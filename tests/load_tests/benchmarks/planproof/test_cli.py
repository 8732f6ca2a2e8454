"""load_tests.benchmarks.planproof.cli without Ray: the settings, the client's cores, and the
--quick dry run's planning half (the config rewritten for the CPU, planned by serve_app.plan's
write_plan from the CPU measurements file, and its naive config), which serve-app check takes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from load_tests.benchmarks.planproof.cli import (
    QUICK_MEASUREMENTS,
    build_parser,
    client_cores_for,
    plan_config,
    server_measurements,
    settings,
    spare_cores,
)
from load_tests.benchmarks.planproof.proof import naive_config
from serve_app.config.deploy import check_deploy_config
from serve_app.plan.measurements import load_measurements
from serve_app.plan.write import write_plan


def test_settings_quick_and_full() -> None:
    quick = settings(build_parser().parse_args(["--out", "x", "--quick"]))
    assert quick["measurements"] == str(QUICK_MEASUREMENTS) and quick["duration_s"] == 3.0
    assert quick["config"].endswith("configs/rag-stack.yaml") and quick["client_cores"]
    full = settings(build_parser().parse_args(["--out", "x", "--client-cores", "12-15"]))
    assert full["measurements"].endswith("examples/planning/rag-stack-measurements.json")
    assert full["client_cores"] == [12, 13, 14, 15] and full["items_per_request"] == 16
    assert full["duration_s"] == 30.0 and full["warmup_s"] == 5.0


def test_client_processes_by_rate_dealt_over_the_cores() -> None:
    rates = {"embeddings": 3657.5, "rerank": 300.0, "classify-text": 200.0}
    assert client_cores_for(rates, [12, 13, 14, 15]) == {
        "embeddings": [12, 13, 14, 15],
        "rerank": [12],
        "classify-text": [13],
    }
    assert client_cores_for({"a": 5.0, "b": 3.0}, [0, 1]) == {"a": [0], "b": [1]}


def test_the_driver_works_on_the_cores_no_open_loop_holds() -> None:
    taken = {"embeddings": [10], "rerank": [11], "classify-images": [12, 13]}
    assert spare_cores([10, 11, 12, 13, 14, 15], taken) == [14, 15]
    assert spare_cores([10, 11], taken) == [10, 11]  # none spare: all of the client's


def test_the_quick_plan_and_its_naive_config_pass_the_check(tmp_path: Path) -> None:
    cfg = settings(build_parser().parse_args(["--out", str(tmp_path), "--quick"]))
    path, notes = plan_config(cfg, tmp_path, 8123)
    assert [n.split(":")[0] for n in notes] == ["classify-text", "classify-images"]
    write_plan(str(path), cfg["measurements"], str(tmp_path / "plan"))
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    planned = yaml.safe_load((tmp_path / "plan" / "serve_config.yaml").read_text())
    by = {m["application"]: m for m in plan["models"]}
    assert by["embeddings"]["replicas_per_gpu"] == [2] and by["rerank"]["replicas_per_gpu"] == [1]
    assert by["rerank"]["predicted_throughput_rps"] == 3.0  # its stated load
    for app in planned["applications"]:
        assert app["args"]["device"] == "cpu"
    cpus = {k: m.num_cpus for k, m in load_measurements(cfg["measurements"]).models.items()}
    naive, _ = naive_config(planned, plan, cpus)
    assert [a["deployments"][0]["num_replicas"] for a in naive["applications"]] == [1, 1]
    assert planned["http_options"]["port"] == naive["http_options"]["port"] == 8123
    assert check_deploy_config(planned, gpus=1) == [] and check_deploy_config(naive, gpus=1) == []


def _cores(monkeypatch: pytest.MonkeyPatch, *args: str) -> dict:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    return settings(build_parser().parse_args(["--out", "x", *args]))


def test_the_server_gets_the_cores_the_client_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cores(monkeypatch, "--client-cores", "10-15")
    assert cfg["client_cores"] == [10, 11, 12, 13, 14, 15] and cfg["server_cores"] == list(
        range(10)
    )
    cfg = _cores(monkeypatch, "--server-cores", "0-11")
    assert cfg["server_cores"] == list(range(12)) and cfg["client_cores"] == [12, 13, 14, 15]
    cfg = _cores(monkeypatch)  # neither: the client anywhere, the server not pinned
    assert cfg["client_cores"] == list(range(16)) and cfg["server_cores"] == []
    with pytest.raises(SystemExit, match=r"share \[8, 9\]"):
        _cores(monkeypatch, "--client-cores", "8-15", "--server-cores", "0-9")
    with pytest.raises(SystemExit, match="must each leave the other a core"):
        _cores(monkeypatch, "--client-cores", "0-15")


def test_the_plan_is_made_for_the_servers_cores_and_the_stated_overrides(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    args = ["--client-cores", "10-15", "--reserve-cores", "1", "--max-utilization", "0.6"]
    cfg = _cores(monkeypatch, *args)
    path, notes = server_measurements(cfg, tmp_path)
    m = load_measurements(path)
    assert [g.cores for g in m.gpus] == [10.0]
    assert m.reserve.cores == 1.0 and m.max_utilization == 0.6
    assert len(notes) == 3 and "10 pinned cores" in notes[0]
    # Unpinned and no overrides: the file as given.
    cfg = _cores(monkeypatch)
    path, notes = server_measurements(cfg, tmp_path)
    given = json.loads(Path(cfg["measurements"]).read_text())
    assert json.loads(path.read_text()) == given and notes == []


def test_the_replan_window_must_fit_inside_the_load() -> None:
    ok = _cli("--duration-s", "12", "--replan-window-s", "6")
    assert ok["replan_window_s"] == 6.0
    assert _cli()["replan_window_s"] is None
    with pytest.raises(SystemExit, match="--replan-window-s 8 must be above 0 and leave 5 s"):
        _cli("--duration-s", "12", "--replan-window-s", "8")


def _cli(*args: str) -> dict:
    return settings(build_parser().parse_args(["--out", "x", *args]))
