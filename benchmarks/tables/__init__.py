"""The renderers of the docs' tables and figures, one module per kind of result. Each module's
``RENDERERS`` maps a block's NAME to its kind (a table, or a figure inside a sentence) and the
function that renders it from ``benchmarks/results/``."""

from __future__ import annotations

from benchmarks.tables import (
    ab,
    gpu_tests,
    latest_h200,
    readme,
    reliability,
    stack,
    startup,
    throughput,
)
from benchmarks.tables.common import BLOCK, INLINE, RESULTS, ROOT, Ctx, Renderer

RENDERERS: dict[str, tuple[str, Renderer]] = {}
for _module in (throughput, ab, startup, reliability, gpu_tests, readme, stack, latest_h200):
    assert not set(_module.RENDERERS) & set(RENDERERS), _module.__name__
    RENDERERS.update(_module.RENDERERS)

__all__ = ["BLOCK", "INLINE", "RENDERERS", "RESULTS", "ROOT", "Ctx", "Renderer"]
