"""load_tests.plan_plot draws the plan serve-app plan wrote."""

from __future__ import annotations

from pathlib import Path

from load_tests.plan_plot import main as plot_main
from serve_app.ops.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_plot_of_the_example_plan(tmp_path: Path) -> None:
    example = ROOT / "examples" / "planning" / "rag-stack-measurements.json"
    argv = ["plan", str(ROOT / "configs/rag-stack.yaml"), "--measurements", str(example)]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert plot_main([str(tmp_path / "plan.json")]) == 0
    png = (tmp_path / "plan.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_the_plot_stacks_the_ingress_on_the_cores(tmp_path: Path) -> None:
    import json

    doc = json.loads((ROOT / "examples/planning/rag-stack-measurements.json").read_text())
    for model in doc["models"].values():
        model["ingress_cpu_s_per_request"] = 0.0005
    measurements = tmp_path / "m.json"
    measurements.write_text(json.dumps(doc))
    argv = ["plan", str(ROOT / "configs/rag-stack.yaml"), "--measurements", str(measurements)]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["gpus"][0]["ingress_cores"] > 0
    assert plot_main([str(tmp_path / "plan.json")]) == 0
    assert (tmp_path / "plan.png").read_bytes().startswith(b"\x89PNG")
