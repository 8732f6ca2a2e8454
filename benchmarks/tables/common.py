"""What every table shares: where the results are, the doc a table is rendered into (so that
its links resolve from there), JSON loading and number formatting (which
``load_tests/benchmarks/throughput/render.py`` imports from here: this package runs with the
standard library alone)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
GIB = float(1 << 30)
MB = 1e6
BLOCK, INLINE = "block", "inline"

Row = Mapping[str, Any]


def field(row: Mapping[str, Any] | None, key: str) -> Any:
    """``row[key]``, or None when there is no row (a setup skipped or not measured)."""
    return None if row is None else row[key]


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f} ms"
    return f"{value:.1f} ms" if value >= 1 else f"{value:.2f} ms"


def fmt_x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def fmt_range(values: Iterable[float], digits: int = 1, unit: str = "") -> str:
    vals = sorted(values)
    if not vals:
        return "-"
    lo, hi = f"{vals[0]:.{digits}f}", f"{vals[-1]:.{digits}f}"
    return f"{lo}{unit}" if lo == hi else f"{lo} to {hi}{unit}"


def fmt_pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}%" if abs(ratio - 1) < 0.1 else f"{(ratio - 1) * 100:+.0f}%"


def table(header: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


@dataclass(frozen=True)
class Ctx:
    doc: Path
    results: Path

    def link(self, rel: str, text: str | None = None) -> str:
        """A Markdown link from the doc to ``benchmarks/results/<rel>``."""
        target = os.path.relpath(self.results / rel, self.doc.parent)
        return f"[{text or rel.rsplit('/', 1)[-1] or rel}]({target})"


@cache
def load(path: Path) -> Any:
    return json.loads(path.read_text())


Renderer = Callable[[Ctx], str]
