"""A/B runs of ``scripts/gpu_throughput_ab.sh`` on one H200: run 9 (2026-12-01, ``475a289``
against ``97e0303``) and run Q (2026-12-04, ``33838cf``'s CUDA graphs to batch 256 against
``5789635``'s to 64), each in ABBA order."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from benchmarks.tables.common import (
    BLOCK,
    INLINE,
    Ctx,
    Renderer,
    Row,
    fmt_ms,
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


RUN_Q = f"{TP_DIR}/Q_minilm_r12_ab_graphs256_33838cf_vs_5789635"
RUN_Q_SIDES = ("1_head", "2_base", "3_base", "4_head")  # in the order they ran
RUN_Q_NOISY = "3_base"  # its server used 11.6 cores under wrk against 12.7 to 13.8 in the others


@dataclass(frozen=True)
class Side:
    folder: str
    code: str  # meta.json's code_commit: SERVE_APP_CODE_COMMIT, or BASE_COMMIT for the base
    wrk: Row
    open_loop: Row
    graphs: list[int]  # CUDA graphs per replica (server_reports.json), as the replicas ended


def _run_q(ctx: Ctx) -> list[Side]:
    out = []
    for folder in RUN_Q_SIDES:
        d = ctx.results / RUN_Q / folder
        rows = [r for r in load(d / "throughput.json") if r.get("setup") == "serve_app"]
        reports = [rep for reps in load(d / "server_reports.json").values() for rep in reps]
        out.append(
            Side(
                folder,
                str(load(d / "meta.json")["code_commit"]),
                next(r for r in rows if r["client"] == "wrk"),
                next(r for r in rows if r["client"] != "wrk"),
                sorted({int(rep["cuda_graphs"]) for rep in reports}),
            )
        )
    return out


def r_ab_run_q(ctx: Ctx) -> str:
    body = []
    for i, s in enumerate(_run_q(ctx), start=1):
        w, o = s.wrk, s.open_loop
        behind = "open-loop client fell behind its schedule" in o["flags"]
        body.append(
            [
                str(i),
                f"`{s.code}` ({ctx.link(f'{RUN_Q}/{s.folder}/', s.folder)})",
                " / ".join(str(g) for g in s.graphs),
                f"{w['deploy_s']:.1f} s",
                f"{fmt_rate(w['requests_per_s'])} ({fmt_rate(w['items_per_s'])})",
                fmt_ms(w["p99_ms"]),
                f"{float(w['server_cpu_s_per_1000_requests']):.3f}",
                f"{float(w['server_cores_busy']):.1f}",
                f"{fmt_rate(o['requests_per_s'])}" + (" (fell behind)" if behind else ""),
                fmt_ms(o["p99_ms"]),
                f"{w['errors']} / {o['errors']}",
                f"{w['budget_violations']} / {o['budget_violations']}",
            ]
        )
    header = ["order", "code", "CUDA graphs per replica", "serving after the deploy"]
    header += ["wrk req/s (texts/s)", "wrk p99", "server CPU s / 1,000 req (wrk)"]
    header += ["server cores busy (wrk)", "open-loop req/s (80% of wrk's)", "open-loop p99"]
    return table(header + ["errors (wrk / open-loop)", "over budget (wrk / open-loop)"], body)


def _q_means(ctx: Ctx, key: str, skip: str | None = None) -> dict[str, float]:
    by_code: dict[str, list[float]] = {}
    for s in _run_q(ctx):
        if s.folder != skip:
            by_code.setdefault(s.code, []).append(float(s.wrk[key]))
    return {c: statistics.fmean(v) for c, v in by_code.items()}


def _q_ab(ctx: Ctx, key: str, digits: int) -> str:
    sides = _run_q(ctx)
    head, base = sides[0].code, sides[1].code

    def num(v: float) -> str:
        return fmt_rate(v) if digits == 0 else f"{v:.{digits}f}"

    every, trimmed = _q_means(ctx, key), _q_means(ctx, key, RUN_Q_NOISY)
    return (
        f"{num(every[head])} against {num(every[base])} "
        f"({fmt_pct(every[head] / every[base])}); without base run 3, "
        f"{num(trimmed[head])} against {num(trimmed[base])} "
        f"({fmt_pct(trimmed[head] / trimmed[base])})"
    )


def r_ab_run_q_wrk(ctx: Ctx) -> str:
    """The mean of each code's wrk requests/s, with and without the noisy base run."""
    return _q_ab(ctx, "requests_per_s", 0)


def r_ab_run_q_cpu(ctx: Ctx) -> str:
    """The mean of each code's server CPU seconds per 1,000 requests under wrk."""
    return _q_ab(ctx, "server_cpu_s_per_1000_requests", 3)


RENDERERS: dict[str, tuple[str, Renderer]] = {
    "ab-run-q": (BLOCK, r_ab_run_q),
    "ab-run-q-wrk": (INLINE, r_ab_run_q_wrk),
    "ab-run-q-cpu": (INLINE, r_ab_run_q_cpu),
    "ab-run9": (BLOCK, r_ab_run9),
    "ab-run9-first": (INLINE, r_ab_run9_first),
    "ab-run9-later": (INLINE, r_ab_run9_later),
}
