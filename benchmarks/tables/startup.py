"""Start-up (``startup.json``, merged by hand from two runs), warm workers' memory, and the
encoder A/B."""

from __future__ import annotations

from typing import Any

from benchmarks.tables.common import (
    BLOCK,
    GIB,
    INLINE,
    ROOT,
    Ctx,
    Renderer,
    fmt_range,
    load,
    table,
)

STARTUP_MEASURES = (
    ("decision_to_serving_s", "decision", "the controller's decision to the new replica serving"),
    ("replacement_s", "replacement", "SIGKILL of a replica to its replacement serving"),
    ("cold_ready_s", "cold_4x0.25_minilm", "cold `serve-app run`, 4 x 0.25 MiniLM, to `/readyz`"),
)


def startup_json(ctx: Ctx) -> dict[str, Any]:
    return load(ctx.results / "startup.json")


def _startup_violations(ctx: Ctx, setup: str) -> tuple[int, int]:
    """(violations, NVML samples judged) of the raw file the setup's rows came from."""
    for src in startup_json(ctx)["meta"]["sources"]:
        raw = load(ROOT / src["file"])
        rows = [r for r in raw["rows"] if r.get("setup") == setup]
        if not rows:
            continue
        watch = raw["meta"].get("budget_watch")
        if watch:
            return int(watch["budget_violations"]), int(watch["nvml_samples_judged"])
        watches = [r["budget_watch"] for r in rows if r.get("budget_watch")]
        return (
            sum(int(w["budget_violations"]) for w in watches),
            sum(int(w["nvml_samples_judged"]) for w in watches),
        )
    raise KeyError(f"no source in startup.json holds {setup} rows")


def r_startup(ctx: Ctx) -> str:
    data = startup_json(ctx)
    summary, rows = data["summary"], data["rows"]
    body = []
    for key, setup, what in STARTUP_MEASURES:
        s = summary[key]
        codes = sorted({str(r["code_commit"]) for r in rows if r["setup"] == setup})
        bad, judged = _startup_violations(ctx, setup)
        body.append(
            [
                what,
                str(s["n"]),
                f"{s['median']:.1f} s",
                f"{s['min']:.1f} to {s['max']:.1f} s",
                f"{s['target']:g} s ({'met' if s['met'] else 'missed'})",
                ", ".join(f"`{c}`" for c in codes),
                f"{bad} of {judged:,}",
            ]
        )
    pool = summary["graph_pool_bytes"]
    body.append(
        [
            "CUDA graph pool per replica",
            str(pool["n"]),
            f"{pool['median'] / GIB:.2f} GiB",
            f"max {pool['max'] / GIB:.2f} GiB",
            f"{pool['target'] / GIB:.1f} GiB, by the max ({'met' if pool['met'] else 'missed'})",
            ", ".join(f"`{c}`" for c in sorted({str(r["code_commit"]) for r in rows})),
            "-",
        ]
    )
    header = ["measure (one H200, 16 cores)", "n", "median", "range", "target"]
    header += ["code (`code_commit`, by hand)", "NVML budget violations"]
    heads = []
    for src in data["meta"]["sources"]:
        meta = load(ROOT / src["file"])["meta"]
        dirty = "with uncommitted changes" if meta.get("uncommitted_changes") else "clean"
        heads.append(f"`{str(meta['commit'])[:7]}` ({dirty}) for `{src['code_commit']}`")
    note = (
        "`code_commit` was written by hand when the runs were merged; the benches' own "
        "`meta.commit` names the device copy's HEAD: " + ", ".join(heads) + "."
    )
    return table(header, body) + "\n\n" + note


def r_warm_rss(ctx: Ctx) -> str:
    """Resident memory of a node's idle warm workers, as each replica's keeper reported it."""
    raw = load(ctx.results / "startup" / "startup_h200_475a289.json")
    by_count: dict[int, list[float]] = {}
    for row in raw["rows"]:
        for rep in row.get("replicas") or []:
            ww = rep.get("warm_workers") or {}
            if ww.get("idle") and ww.get("idle_rss_bytes"):
                by_count.setdefault(int(ww["idle"]), []).append(ww["idle_rss_bytes"] / 1e9)
    return (
        "; ".join(
            f"{fmt_range(v, 2)} GB for {n} idle workers (shared libraries counted in each)"
            for n, v in sorted(by_count.items())
        )
        + f" ({ctx.link('startup/startup_h200_475a289.json', 'warm_workers.idle_rss_bytes')})"
    )


ENCODER_AB = "startup/encoder_ab_graphs_h200_475a289.json"


def _encoder(ctx: Ctx, key: str, tokens: int | None = None, min_batch: int = 0) -> str:
    rows = load(ctx.results / ENCODER_AB)["rows"]
    return fmt_range(
        (
            float(r[key])
            for r in rows
            if (tokens is None or r["tokens"] == tokens) and r["batch"] >= min_batch
        ),
        digits=2,
    )


def r_encoder_eager(ctx: Ctx) -> str:
    return _encoder(ctx, "ours_over_transformers")


def r_encoder_graph_16(ctx: Ctx) -> str:
    return _encoder(ctx, "graph_ours_over_transformers", 16)


def r_encoder_graph_128(ctx: Ctx) -> str:
    return _encoder(ctx, "graph_ours_over_transformers", 128)


RENDERERS: dict[str, tuple[str, Renderer]] = {
    "startup": (BLOCK, r_startup),
    "warm-rss": (INLINE, r_warm_rss),
    "encoder-eager": (INLINE, r_encoder_eager),
    "encoder-graph-16": (INLINE, r_encoder_graph_16),
    "encoder-graph-128": (INLINE, r_encoder_graph_128),
}
