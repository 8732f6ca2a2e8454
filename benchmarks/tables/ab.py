"""Run 9 (2026-12-01): ``475a289`` against ``97e0303`` in ABBA order on one H200."""

from __future__ import annotations

import statistics

from benchmarks.tables.common import (
    BLOCK,
    INLINE,
    Ctx,
    Renderer,
    Row,
    fmt_pct,
    fmt_rate,
    load,
    table,
)
from benchmarks.tables.throughput import TP_DIR

RUN9 = f"{TP_DIR}/I_minilm_r8_ab_97e0303_vs_head/run9_abba_475a289"
# (folder, code) in the order they ran; the code is named in the run's README.md.
RUN9_SIDES: tuple[tuple[str, str], ...] = (
    ("1_head", "475a289"),
    ("2_base", "97e0303"),
    ("3_base", "97e0303"),
    ("4_head", "475a289"),
)


def _run9(ctx: Ctx) -> list[tuple[str, str, Row, Row]]:
    out = []
    for side, code in RUN9_SIDES:
        rows = load(ctx.results / RUN9 / side / "throughput.json")
        w = next(r for r in rows if r.get("setup") == "serve_app" and r["client"] == "wrk")
        o = next(r for r in rows if r.get("setup") == "serve_app" and r["client"] != "wrk")
        out.append((side, code, w, o))
    return out


def _run9_means(ctx: Ctx) -> dict[str, dict[str, float]]:
    """Per code: the mean of every side's first wrk try (the first 8 s after serving) and of
    the later tries (9 to 27 s after serving)."""
    first: dict[str, list[float]] = {}
    later: dict[str, list[float]] = {}
    for _, code, w, _ in _run9(ctx):
        tries = [float(t["requests_per_s"]) for t in w["tries"]]
        first.setdefault(code, []).append(tries[0])
        later.setdefault(code, []).extend(tries[1:])
    return {
        c: {"first": statistics.fmean(first[c]), "later": statistics.fmean(later[c])} for c in first
    }


def r_ab_run9(ctx: Ctx) -> str:
    body = []
    for i, (side, code, w, o) in enumerate(_run9(ctx), start=1):
        tries = [fmt_rate(t["requests_per_s"]) for t in w["tries"]]
        body.append(
            [str(i), f"`{code}` ({ctx.link(f'{RUN9}/{side}/', side)})", f"{w['deploy_s']:.1f} s"]
            + tries
            + [fmt_rate(o["requests_per_s"]), f"{w['errors']} / {o['errors']}"]
        )
    header = ["order", "code", "serving after the deploy", "wrk try 1 req/s", "try 2", "try 3"]
    return table(header + ["open-loop req/s", "errors (wrk / open-loop)"], body)


def _ab(ctx: Ctx, key: str) -> str:
    m = _run9_means(ctx)
    new, old = m["475a289"][key], m["97e0303"][key]
    return f"{fmt_rate(new)}/s against {fmt_rate(old)}/s ({fmt_pct(new / old)})"


def r_ab_run9_first(ctx: Ctx) -> str:
    return _ab(ctx, "first")


def r_ab_run9_later(ctx: Ctx) -> str:
    return _ab(ctx, "later")


RENDERERS: dict[str, tuple[str, Renderer]] = {
    "ab-run9": (BLOCK, r_ab_run9),
    "ab-run9-first": (INLINE, r_ab_run9_first),
    "ab-run9-later": (INLINE, r_ab_run9_later),
}
