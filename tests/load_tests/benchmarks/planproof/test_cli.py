"""load_tests.benchmarks.planproof.cli without Ray: the settings, the client's cores, and the
--quick dry run's planning half (the config rewritten for the CPU, planned by serve_app.plan's
write_plan from the CPU measurements file, and its naive config), which serve-app check takes."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from load_tests.benchmarks.planproof.cli import (
    QUICK_MEASUREMENTS,
    build_parser,
    client_cores_for,
    plan_config,
    settings,
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
