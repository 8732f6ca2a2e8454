"""The docs' tables and figures match the JSON they cite: benchmarks.render re-renders every
marked block of README.md, docs/*.md and benchmarks/ journals from benchmarks/results/, and a
block that differs fails here with the diff. Fix a failure with `python -m benchmarks.render`
(when the JSON is right) or by correcting the JSON's source, never by editing the block."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import render
from benchmarks.tables.common import Ctx
from benchmarks.tables.throughput import nvml_hz

ROOT = Path(__file__).resolve().parents[2]


def test_every_marked_block_matches_its_json() -> None:
    differ = render.diffs(ROOT)
    assert not differ, "docs differ from their JSON (run python -m benchmarks.render):\n" + "".join(
        differ.values()
    )


def test_every_renderer_is_used_and_every_marker_is_known() -> None:
    assert render.used_names(ROOT) == set(render.RENDERERS)


def test_the_readme_and_docs_carry_rendered_blocks() -> None:
    marked = {
        p.relative_to(ROOT).as_posix() for p in render.docs(ROOT) if "<!-- render:" in p.read_text()
    }
    assert {"README.md", "docs/benchmarks.md", "docs/reliability.md"} <= marked


def test_a_figure_edited_by_hand_is_caught() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    start = text.index("<!-- render:readme-headline -->")
    end = text.index("<!-- /render:readme-headline -->")
    block = text[start:end]
    assert "121,249 texts/s" in block
    edited = text[:start] + block.replace("121,249 texts/s", "131,249 texts/s") + text[end:]
    assert render.render_text(edited, readme) == text


def test_an_unknown_block_name_fails() -> None:
    with pytest.raises(KeyError, match="render:no-such-table"):
        render.render_text(
            "<!-- render:no-such-table --><!-- /render:no-such-table -->", ROOT / "x.md"
        )


def test_inline_blocks_stay_inline_and_tables_get_their_own_lines() -> None:
    doc = ROOT / "docs" / "benchmarks.md"
    inline = render.render_text(
        "a <!-- render:nvml-hz-resnet --><!-- /render:nvml-hz-resnet --> b", doc
    )
    assert inline == "a <!-- render:nvml-hz-resnet -->2.4 to 3.0<!-- /render:nvml-hz-resnet --> b"
    block = render.render_text("<!-- render:startup --><!-- /render:startup -->", doc)
    assert block.startswith("<!-- render:startup -->\n| measure")
    assert block.endswith("\n<!-- /render:startup -->")


def test_nvml_rate_counts_the_whole_window_of_a_row() -> None:
    # Two wrk tries of 8 s and their gaps: 18.3 s of window, not the 8.08 s of one try.
    row = {"replicas": 8, "nvml_samples": 1267, "started_unix_s": 100.0, "ended_unix_s": 118.3}
    row["duration_s"] = 8.08
    assert nvml_hz(row) == pytest.approx(1267 / 8 / 18.3)
    assert nvml_hz({**row, "started_unix_s": None}) is None


def test_links_in_rendered_tables_resolve_from_the_doc() -> None:
    ctx = Ctx(ROOT / "docs" / "benchmarks.md", ROOT / "benchmarks" / "results")
    assert ctx.link("startup.json") == "[startup.json](../benchmarks/results/startup.json)"
    ctx = Ctx(ROOT / "README.md", ROOT / "benchmarks" / "results")
    assert ctx.link("startup.json", "x") == "[x](benchmarks/results/startup.json)"
