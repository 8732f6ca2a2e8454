"""serve-app plan: the measurements file, the written config (which serve-app check passes),
the report; on the committed retrieval-stack example."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from serve_app.errors import ConfigError
from serve_app.gpu.budget import GRAPH_MIN_ROOM_BYTES
from serve_app.ops.cli import main
from serve_app.plan.measurements import budget_bytes, load_measurements, to_problem

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "planning" / "rag-stack-measurements.json"
COMMITTED = ROOT / "examples" / "planning" / "rag-stack-plan"
RAG = ROOT / "configs" / "rag-stack.yaml"
H200 = "150109880320"  # CUDA's total of an H200 (NVML's less the driver's reserve)

MIB = 1 << 20


def test_the_written_config_passes_serve_app_check(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    assert main(["plan", str(RAG), "--measurements", str(EXAMPLE), "--out", str(out)]) == 0
    config = out / "serve_config.yaml"
    assert main(["check", str(config), "--gpu-memory", H200]) == 0
    doc = yaml.safe_load(config.read_text())
    plan = json.loads((out / "plan.json").read_text())
    for app, planned in zip(doc["applications"], plan["models"], strict=True):
        dep = app["deployments"][0]
        assert app["name"] == planned["application"]
        assert dep["num_replicas"] == sum(planned["replicas_per_gpu"])
        assert dep["ray_actor_options"]["num_gpus"] == planned["num_gpus"]
        assert app["args"]["memory"]["budget"] == planned["budget_bytes"]
        assert int(planned["num_gpus"] * int(H200)) >= planned["budget_bytes"]
    report = (out / "plan.md").read_text()
    assert "| rerank |" in report and "binds" in report


def test_the_committed_example_plan_is_what_plan_writes_today(tmp_path: Path) -> None:
    assert main(["plan", str(RAG), "--measurements", str(EXAMPLE), "--out", str(tmp_path)]) == 0
    for name in ("serve_config.yaml", "plan.json", "plan.md"):
        committed = (COMMITTED / name).read_text().replace(str(ROOT) + "/", "")
        fresh = (tmp_path / name).read_text().replace(str(ROOT) + "/", "")
        assert fresh == committed, f"re-run serve-app plan into {COMMITTED} ({name} differs)"


def test_every_example_figure_cites_a_committed_file_or_says_assumption() -> None:
    doc = json.loads(EXAMPLE.read_text())
    for name, model in doc["models"].items():
        assert model["sources"], name
        for field, source in model["sources"].items():
            cited = [w for w in source.replace(":", " ").split() if w.startswith("benchmarks/")]
            assert cited or "ASSUMPTION" in source, (name, field)
            for path in cited:
                assert (ROOT / path.rstrip(",;")).is_file(), (name, field, path)


def test_a_budget_is_context_weights_pool_and_the_batch_peak_plus_the_margin() -> None:
    m = load_measurements(EXAMPLE)
    emb = m.models["embeddings"]
    need = 719323136 + 134217728 + 379584512 + 12582912
    # The parts plus the margin, and at least graphs' room (the test below) beside the weights.
    room = math.ceil((719323136 + 134217728) * 1.1) + GRAPH_MIN_ROOM_BYTES
    assert budget_bytes(emb, 32, 0.1) == max(-(-need * 11 // 10), room)
    assert to_problem(m).models[0].candidates[0].budget_bytes == budget_bytes(emb, 32, 0.1)


def test_a_model_measured_with_graphs_gets_the_room_to_capture_them() -> None:
    # Under GRAPH_MIN_ROOM_BYTES beside its weights a replica runs eagerly (startup.capture):
    # a plan must not give it a budget that makes it slower than it was measured.
    m = load_measurements(EXAMPLE)
    small = m.models["embeddings"].model_copy(
        update={
            "context_bytes": 600 * MIB,
            "weights_bytes": 128 * MIB,
            "graph_pool_bytes": 130 * MIB,
        }
    )
    base = math.ceil((600 + 128) * MIB * 1.1)
    assert budget_bytes(small, 32, 0.1) == base + GRAPH_MIN_ROOM_BYTES
    # A pool over half the minimum room needs twice its size (the pool's share of the room).
    big_pool = small.model_copy(update={"graph_pool_bytes": 700 * MIB})
    need = math.ceil(((600 + 128 + 700) * MIB + big_pool.activation_peak_bytes[32]) * 1.1)
    assert budget_bytes(big_pool, 32, 0.1) == max(need, base + 1400 * MIB)
    # Measured eagerly (no pool): only what it measured, plus the margin.
    eager = small.model_copy(update={"graph_pool_bytes": 0})
    peak = eager.activation_peak_bytes[32]
    assert budget_bytes(eager, 32, 0.1) == math.ceil(((600 + 128) * MIB + peak) * 1.1)


def test_an_ingress_cost_is_charged_to_the_cores_and_shown(tmp_path: Path) -> None:
    # The example has no ingress figure: charged nothing, and the report says so.
    assert all(
        a.ingress_cpu_s_per_request == 0 for a in to_problem(load_measurements(EXAMPLE)).models
    )
    assert "charged no cores" in (COMMITTED / "plan.md").read_text()
    doc = json.loads(EXAMPLE.read_text())
    for model in doc["models"].values():
        model["ingress_cpu_s_per_request"] = 0.0005  # an illustration, not a measurement
    costly = tmp_path / "m.json"
    costly.write_text(json.dumps(doc))
    out = tmp_path / "plan"
    assert main(["plan", str(RAG), "--measurements", str(costly), "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    (gpu,) = plan["gpus"]
    served = sum(m["predicted_throughput_rps"] for m in plan["models"])
    assert gpu["ingress_cores"] == pytest.approx(0.0005 * served, rel=1e-4)  # 6 digits written
    assert gpu["cores"] + gpu["ingress_cores"] <= gpu["cores_cap"] + 1e-9
    free = json.loads((COMMITTED / "plan.json").read_text())
    assert plan["objective_rps"] < free["objective_rps"]  # the ingress took replicas' cores
    report = (out / "plan.md").read_text()
    assert f"+ {gpu['ingress_cores']:.2f} of 12 |" in report and "charged no cores" not in report


def test_a_bad_measurements_file_names_the_field(tmp_path: Path) -> None:
    doc = json.loads(EXAMPLE.read_text())
    doc["models"]["rerank"]["p99_target_s"] = -1
    del doc["models"]["embeddings"]["activation_peak_bytes"]["32"]
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        load_measurements(bad)
    assert "models.rerank.p99_target_s" in err.value.message
    assert "batch sizes [32] have no activation_peak_bytes" in err.value.message


def test_a_config_application_without_measurements_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(EXAMPLE.read_text())
    del doc["models"]["classify-text"]
    partial = tmp_path / "m.json"
    partial.write_text(json.dumps(doc))
    argv = ["plan", str(RAG), "--measurements", str(partial), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "in the config, not measured: classify-text" in capsys.readouterr().err


def test_an_impossible_ask_is_refused_with_what_to_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(EXAMPLE.read_text())
    doc["models"]["rerank"]["load_rps"] = 100_000
    heavy = tmp_path / "m.json"
    heavy.write_text(json.dumps(doc))
    argv = ["plan", str(RAG), "--measurements", str(heavy), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "no plan fits" in capsys.readouterr().err
