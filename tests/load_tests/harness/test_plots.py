"""load_tests.harness.plots: matplotlib is optional (the extra ``plots``): without it the plot
code says how to install it; with it the controller timeline becomes a PNG."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from load_tests.harness import plots

TIMELINE = {
    "schema_version": 1,
    "margin_bytes": 2 << 30,
    "replica_gpus": ["GPU-a"],
    "phases": [{"name": "load", "t_s": 0.0}, {"name": "grab", "t_s": 1.0}],
    "samples": [
        {
            "t_s": float(t),
            "replicas_running": 2 - (t > 1),
            "controller_target": 2 - (t > 1),
            "gpu_free_bytes": {"GPU-a": (40 - 30 * (t > 1)) << 30},
            "offered_rps": 100.0,
            "errors_per_s": 0.0,
        }
        for t in range(4)
    ],
}


def test_without_matplotlib_plots_say_how_to_install_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    with pytest.raises(plots.PlotsUnavailable, match=r"pip install -e '\.\[plots\]'"):
        plots.pyplot()
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(TIMELINE))
    assert plots.main([str(path)]) == 2
    assert "optional extra 'plots'" in capsys.readouterr().err
    assert not path.with_suffix(".png").exists()


def test_the_timeline_is_drawn_to_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the extra 'plots' is not installed")
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(TIMELINE))
    assert plots.main([str(path)]) == 0
    png = path.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_a_file_that_is_not_a_timeline_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a controller timeline"):
        plots.load_timeline(path)
