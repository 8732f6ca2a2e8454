"""The README's table of headline figures, each linked to its JSON."""

from __future__ import annotations

from benchmarks.tables.ab import RUN_Q
from benchmarks.tables.common import (
    BLOCK,
    Ctx,
    Renderer,
    Row,
    fmt_ms,
    fmt_rate,
    fmt_x,
    load,
    table,
)
from benchmarks.tables.latest_h200 import FIRST_SECONDS, RUN_R, RUNS_SWEEP
from benchmarks.tables.reliability import GPU_FAULT_RUNS
from benchmarks.tables.startup import startup_json
from benchmarks.tables.throughput import (
    RUN_O,
    RUN_P_MPS,
    RUN_P_TS,
    TP_DIR,
    Run,
    one_row,
    pairs,
    run,
)

RUN_J = "J_minilm_r12_peers_16cores_shared"  # the last run with LitServe's rows
RUN_N = "N_minilm_r12_mixed_16cores_shared_109778c"  # real text lengths
RUN_Q_HEADS = ("1_head", "4_head")  # run Q's runs of run O's code (33838cf)


def _wrk(r: Run, setup: str, ipr: int) -> Row:
    return one_row(r, setup, "wrk", ipr)


def _served(r: Run, ipr: int) -> str:
    """Errors and NVML budget violations over a run's serve_app rows at ``ipr`` (both clients)."""
    rows = r.served(ipr=ipr)
    errors = sum(int(x["errors"]) for x in rows)
    over = sum(int(x["budget_violations"]) for x in rows)
    samples = sum(int(x["nvml_samples"]) for x in rows)
    return f"{errors} errors, {over} of {samples:,} NVML samples over budget"


def _ratio(a: Row, b: Row, key: str = "requests_per_s") -> str:
    return fmt_x(float(a[key]) / float(b[key]))


def _cores(spec: str) -> int:
    """How many cores a ``taskset`` list such as ``0,16-29`` names."""
    n = 0
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def _link(ctx: Ctx, name: str, text: str) -> str:
    return ctx.link(f"{TP_DIR}/{name}/throughput.json", text)


def _q_head_texts(ctx: Ctx) -> list[float]:
    """Texts/s with wrk in run Q's two runs of run O's code, on run O's lease (an A/B)."""
    rates = []
    for folder in RUN_Q_HEADS:
        rows = load(ctx.results / RUN_Q / folder / "throughput.json")
        row = next(r for r in rows if r.get("setup") == "serve_app" and r["client"] == "wrk")
        assert row["inputs_per_request"] == 16, row
        rates.append(float(row["items_per_s"]))
    return rates


def _first_seconds(ctx: Ctx) -> list[str]:
    doc = load(ctx.results / FIRST_SECONDS)
    ratios = [float(r["verdict"]["p99_ratio"]) for r in doc["rows"]]
    ok = sum(1 for r in doc["rows"] if r["verdict"]["ok"])
    return [
        "the first 10 s after `/readyz` turns 200 (4 x 0.25, wrk with 64 connections)",
        f"p99 {min(ratios):.2f} to {max(ratios):.2f} times the steady state's; "
        f"{ok} of {len(ratios)} starts within 2x",
        ctx.link(FIRST_SECONDS),
    ]


def _throughput_rows(ctx: Ctx) -> list[list[str]]:
    r_, j, n = run(ctx, RUN_R), run(ctx, RUN_J), run(ctx, RUN_N)
    r16, r1 = _wrk(r_, "serve_app", 16), _wrk(r_, "serve_app", 1)
    noop, batch = _wrk(r_, "ray_serve_noop", 1), _wrk(r_, "ray_serve_batch", 1)
    ol16, ol1 = one_row(r_, "serve_app", "open-loop", 16), one_row(r_, "serve_app", "open-loop", 1)
    s_, u_ = run(ctx, RUNS_SWEEP[0]), run(ctx, RUNS_SWEEP[1])
    s1, u1 = one_row(s_, "serve_app", "open-loop", 1), one_row(u_, "serve_app", "open-loop", 1)
    cpu = "server_cpu_s_per_1000_requests"
    j1, j16 = _wrk(j, "serve_app", 1), _wrk(j, "serve_app", 16)
    lit1, lit16 = _wrk(j, "litserve", 1), _wrk(j, "litserve", 16)
    n16 = _wrk(n, "serve_app", 16)
    p_ts, p_mps = run(ctx, RUN_P_TS), run(ctx, RUN_P_MPS)
    ts, mps = p_ts.served(ipr=1, client="wrk")[0], p_mps.served(ipr=1, client="wrk")[0]
    o16 = _wrk(run(ctx, RUN_O), "serve_app", 16)
    earlier = [fmt_rate(o16["items_per_s"])] + [fmt_rate(x) for x in _q_head_texts(ctx)]
    return [
        [
            "MiniLM, 16 short texts a request, 12 x 0.08 (run R)",
            f"{fmt_rate(r16['items_per_s'])} texts/s with wrk; {_served(r_, 16)}. On earlier "
            f"leases: {earlier[0]} (run O), {' and '.join(earlier[1:])} (run Q)",
            _link(ctx, RUN_R, "run R")
            + ", "
            + _link(ctx, RUN_O, "run O")
            + ", "
            + ctx.link(f"{RUN_Q}/", "run Q"),
        ],
        [
            "MiniLM, one short text a request, the same run",
            f"{fmt_rate(r1['requests_per_s'])} req/s: {_ratio(r1, noop)} plain Ray Serve's no-op "
            f"and {_ratio(r1, batch)} Ray Serve with `@serve.batch`; CPU per request "
            f"{_ratio(r1, noop, cpu)} the no-op's",
            _link(ctx, RUN_R, "run R"),
        ],
        [
            "MiniLM, open loop (Poisson arrivals) at 80% of wrk's peak, the same run",
            f"p99 {fmt_ms(ol16['p99_ms'])} at 16 texts a request "
            f"({fmt_rate(ol16['items_per_s'])} texts/s); {fmt_ms(ol1['p99_ms'])} at one text "
            f"({fmt_rate(ol1['requests_per_s'])} req/s), and {fmt_ms(u1['p99_ms'])} at 70% "
            f"({fmt_rate(u1['requests_per_s'])} req/s, run U), {fmt_ms(s1['p99_ms'])} at 60% "
            f"({fmt_rate(s1['requests_per_s'])} req/s, run S)",
            _link(ctx, RUN_R, "run R")
            + ", "
            + _link(ctx, RUNS_SWEEP[1], "run U")
            + ", "
            + _link(ctx, RUNS_SWEEP[0], "run S"),
        ],
        _first_seconds(ctx),
        [
            "MiniLM against LitServe 0.2.19, the same layout and clients (run J)",
            f"{_ratio(j1, lit1)} LitServe's req/s at one text, "
            f"{_ratio(j16, lit16, 'items_per_s')} its texts/s at 16",
            _link(ctx, RUN_J, "run J"),
        ],
        [
            "MiniLM, real text lengths (queries and passages), 16 a request (run N)",
            f"{fmt_x(float(n16['vs_ceiling_tokens']))} the model's own tokens/s on the same texts",
            _link(ctx, RUN_N, "run N"),
        ],
        [
            "ResNet-50, one JPEG a request, 16 x 0.06 (run P)",
            f"{fmt_rate(mps['items_per_s'])} images/s under MPS mode, "
            f"{fmt_rate(ts['items_per_s'])} time-sliced",
            _link(ctx, RUN_P_MPS, "MPS") + ", " + _link(ctx, RUN_P_TS, "time-sliced"),
        ],
    ]


def r_readme_headline(ctx: Ctx) -> str:
    b = run(ctx, "B_minilm_r8_r12_r16")
    w, ol = next((w, o) for w, o in pairs(b, "minilm", 1) if w["replicas"] == 12)
    assert ol is not None, "run B's 12-replica open-loop row"
    s = startup_json(ctx)["summary"]
    kill = load(ctx.results / GPU_FAULT_RUNS[1])["rows"]
    k20 = next(r for r in kill if r["fault"] == "kill20")
    over = next(r for r in kill if r["fault"] == "overload_3x")
    rows = _throughput_rows(ctx) + [
        [
            "MiniLM, one short text a request, 12 x 0.08, server on 16 cores and clients on "
            f"{_cores(b.meta['cores']['client'])} of their own (run B)",
            f"p99 {fmt_ms(ol['p99_ms'])} open-loop at {fmt_rate(ol['requests_per_s'])} req/s "
            f"({float(ol['offered_per_s']) / float(w['requests_per_s']):.0%} of wrk's "
            f"{fmt_rate(w['requests_per_s'])})",
            _link(ctx, b.name, "run B"),
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
    header = ["what (one H200; server and clients on the same 16 cores unless said)", "measured"]
    return table([*header, "evidence"], rows)


RENDERERS: dict[str, tuple[str, Renderer]] = {
    "readme-headline": (BLOCK, r_readme_headline),
}
