"""The retrieval stack on one GPU (``load_tests.benchmarks.stack``): each family's p99 alone and
with its neighbours, its throughput beside its in-process ceiling, the budget watch."""

from __future__ import annotations

from typing import Any

from benchmarks.tables.common import BLOCK, Ctx, Renderer, fmt_ms, fmt_rate, fmt_x, load, table

STACK = "stack/stack.json"  # the CPU dry run (--quick)
STACK_H200 = "stack/stack_h200_daef6d9.json"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _ceiling(row: dict[str, Any]) -> str:
    best = row.get("ceiling_items_per_s")
    if best is None:
        return "-"
    return f"{fmt_rate(best)} (batch {row.get('ceiling_batch')})"


def r_stack(ctx: Ctx, name: str = STACK) -> str:
    d = load(ctx.results / name)
    s, v, watch = d["settings"], d["verdict"], d["budget_watch"]
    body = [
        [
            f"{r['adapter']} `{r['route']}`",
            str(r["items_per_request"]),
            fmt_ms(r["p99_alone_ms"]),
            fmt_ms(r["p99_mixed_ms"]),
            fmt_x(r["p99_ratio"]) + ("" if r["p99_ok"] else " (over)"),
            fmt_rate(r["items_per_s_alone"]),
            fmt_rate(r["items_per_s_mixed"]),
            _ceiling(r),
            f"{_share(r['alone_of_ceiling'])} / {_share(r['mixed_of_ceiling'])}",
            str(r["errors"]),
        ]
        for r in d["families"]
    ]
    header = [
        "family and route",
        "items/request",
        "p99 alone",
        "p99 with neighbours",
        f"ratio (at most {v['p99_ratio_max']:g}x)",
        "items/s alone",
        "items/s with neighbours",
        "in-process ceiling, items/s",
        "of ceiling (alone / with)",
        "errors",
    ]
    meta = d["meta"]
    device = meta.get("gpu_name") or "CPU"
    commit = meta.get("code_commit") or meta.get("commit") or "?"
    kind = "a CPU dry run (`--quick`): it checks the tool, not the GPU" if s["quick"] else device
    lines = [
        table(header, body),
        "",
        f"{ctx.link(name)}: {kind}; code `{str(commit)[:7]}`; wrk with "
        f"{s['connections']} connections per route for {s['duration_s']:g} s each run; "
        f"budget violations {watch['budget_violations']} in "
        f"{watch['nvml_samples_judged']:,} NVML samples judged; criteria "
        + ("met" if v["all_ok"] else "not met")
        + (f"; {'; '.join(d['notes'])}" if d.get("notes") else "")
        + ".",
    ]
    return "\n".join(lines)


def r_stack_h200(ctx: Ctx) -> str:
    return r_stack(ctx, STACK_H200)


RENDERERS: dict[str, tuple[str, Renderer]] = {
    "stack": (BLOCK, r_stack),
    "stack-h200": (BLOCK, r_stack_h200),
}
