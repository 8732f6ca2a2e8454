"""The README's table of headline figures, each linked to its JSON."""

from __future__ import annotations

from benchmarks.tables.common import (
    BLOCK,
    Ctx,
    Renderer,
    fmt_ms,
    fmt_rate,
    load,
    table,
)
from benchmarks.tables.reliability import GPU_FAULT_RUNS
from benchmarks.tables.startup import startup_json
from benchmarks.tables.throughput import TP_DIR, pairs, run


def r_readme_headline(ctx: Ctx) -> str:
    b = run(ctx, "B_minilm_r8_r12_r16")
    w, ol = next((w, o) for w, o in pairs(b, "minilm", 1) if w["replicas"] == 12)
    assert ol is not None, "run B's 12-replica open-loop row"
    e, em = run(ctx, "E_resnet_r16"), run(ctx, "E_resnet_r16_mps")
    ew = e.served("resnet50", 1, "wrk")[0]
    emw = em.served("resnet50", 1, "wrk")[0]
    s = startup_json(ctx)["summary"]
    kill = load(ctx.results / GPU_FAULT_RUNS[1])["rows"]
    k20 = next(r for r in kill if r["fault"] == "kill20")
    over = next(r for r in kill if r["fault"] == "overload_3x")
    rows = [
        [
            "MiniLM, one short text per request, 12 x 0.08 of one H200 (run B)",
            f"{fmt_rate(w['requests_per_s'])} req/s with wrk; p99 {fmt_ms(ol['p99_ms'])} "
            f"open-loop at {fmt_rate(ol['requests_per_s'])} req/s",
            ctx.link(f"{TP_DIR}/{b.name}/throughput.json", "run B"),
        ],
        [
            "ResNet-50, one JPEG per request, 16 x 0.06 (run E, one host)",
            f"{fmt_rate(ew['items_per_s'])} images/s time-sliced, "
            f"{fmt_rate(emw['items_per_s'])} under an MPS daemon",
            ctx.link(f"{TP_DIR}/{e.name}/throughput.json", "time-sliced")
            + ", "
            + ctx.link(f"{TP_DIR}/{em.name}/throughput.json", "MPS"),
        ],
        [
            "a scale-up: the controller's decision to the new replica serving",
            f"median {s['decision_to_serving_s']['median']:.1f} s "
            f"(n {s['decision_to_serving_s']['n']})",
            ctx.link("startup.json"),
        ],
        [
            "a SIGKILLed replica to its replacement serving",
            f"median {s['replacement_s']['median']:.1f} s (n {s['replacement_s']['n']})",
            ctx.link("startup.json"),
        ],
        [
            "cold `serve-app run` (4 x 0.25 MiniLM) to `/readyz` 200",
            f"median {s['cold_ready_s']['median']:.1f} s (n {s['cold_ready_s']['n']})",
            ctx.link("startup.json"),
        ],
        [
            f"{k20['detail']['kills']} SIGKILLs of replicas under load (GPU fault run 2)",
            f"{k20['lost']} lost of {k20['sent']:,} requests",
            ctx.link(GPU_FAULT_RUNS[1]),
        ],
        [
            "3x overload (GPU fault run 2)",
            f"{over['lost']} lost; {over['failed']:,} deliberate 503s with `Retry-After`",
            ctx.link(GPU_FAULT_RUNS[1]),
        ],
    ]
    return table(["what (H200)", "measured", "evidence"], rows)


RENDERERS: dict[str, tuple[str, Renderer]] = {
    "readme-headline": (BLOCK, r_readme_headline),
}
