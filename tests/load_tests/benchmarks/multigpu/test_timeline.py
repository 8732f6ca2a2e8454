"""load_tests.benchmarks.multigpu.timeline: the grab timeline's PNG is optional; without
matplotlib the document says how to draw it later."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from load_tests.benchmarks.multigpu.timeline import plot


def test_without_matplotlib_the_timeline_notes_how_to_plot_it_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    doc: dict = {"samples": [{"t_s": 0.0}], "notes": []}
    plot(doc, tmp_path / "grab_timeline.png")
    assert "plot" not in doc and not (tmp_path / "grab_timeline.png").exists()
    [note] = doc["notes"]
    assert "pip install -e '.[plots]'" in note
    assert note.endswith(f"python -m load_tests.harness.plots {tmp_path / 'grab_timeline.json'}")
