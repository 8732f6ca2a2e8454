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
