"""The H200 runs of 2026-12-05 at ``55966c2`` (one lease, server and clients on the same 16
cores): run R (run O's command), the open-loop sweep at one text a request (runs S, U, T, with
run R's point at 80%) and the first seconds after ``/readyz`` (six starts, ABBA); beside them,
the CPU host's A/B of Ray's per-request HAProxy metrics on and off."""

from __future__ import annotations

from benchmarks.tables.common import (
    BLOCK,
    INLINE,
    Ctx,
    Renderer,
    Row,
    fmt_ms,
    fmt_rate,
    fmt_x,
    load,
    table,
)
from benchmarks.tables.throughput import TP_DIR, _run_as_rendered, one_row, run

RUN_R = "R_minilm_r12_16cores_shared_55966c2"
# The open-loop sweep at one text a request, in the order of the offered fraction.
RUNS_SWEEP = (
    "S_minilm_r12_x1_openloop60_55966c2",
    "U_minilm_r12_x1_openloop70_55966c2",
    "T_minilm_r12_x1_openloop80_55966c2",
    RUN_R,
)
FIRST_SECONDS = "first_seconds/h200_55966c2/first_warm_delay.json"


def _row(name: str, ctx: Ctx, setup: str, client: str, ipr: int = 1) -> Row:
    return one_row(run(ctx, name), setup, client, ipr)


def r_run_r(ctx: Ctx) -> str:
    return _run_as_rendered(ctx, RUN_R)


def r_run_r_vs_noop(ctx: Ctx) -> str:
    """Run R, one text a request, wrk: serve_app against the no-op, req/s and CPU per request."""
    serve, noop = _row(RUN_R, ctx, "serve_app", "wrk"), _row(RUN_R, ctx, "ray_serve_noop", "wrk")
    cpu = "server_cpu_s_per_1000_requests"
    rate = float(serve["requests_per_s"]) / float(noop["requests_per_s"])
    per = float(serve[cpu]) / float(noop[cpu])
    return (
        f"{fmt_rate(serve['requests_per_s'])} against {fmt_rate(noop['requests_per_s'])} req/s "
        f"({fmt_x(rate)}), at {float(serve[cpu]):.3f} against {float(noop[cpu]):.3f} CPU s per "
        f"1,000 requests ({fmt_x(per)})"
    )


def _open(row: Row, peak: Row) -> list[str]:
    frac = float(row["offered_per_s"]) / float(peak["requests_per_s"])
    kept = "no" if any("fell behind" in f for f in row.get("flags") or []) else "yes"
    return [
        fmt_rate(peak["requests_per_s"]),
        f"{fmt_rate(row['offered_per_s'])} ({frac:.0%})",
        fmt_rate(row["requests_per_s"]),
        fmt_ms(row["p50_ms"]),
        f"**{fmt_ms(row['p99_ms'])}**",
        kept,
    ]


def r_openloop_sweep(ctx: Ctx) -> str:
    """serve_app and the no-op at one text a request: each run's wrk peak, then Poisson arrivals
    at a fraction of it, p99 from the scheduled send."""
    body = []
    for name in RUNS_SWEEP:
        for setup in ("serve_app", "ray_serve_noop"):
            wrk, ol = _row(name, ctx, setup, "wrk"), _row(name, ctx, setup, "open-loop")
            label = "serve_app" if setup == "serve_app" else "Ray Serve no-op"
            over = "-" if setup != "serve_app" else str(int(ol["budget_violations"]))
            body.append(
                [ctx.link(f"{TP_DIR}/{name}/throughput.json", f"run {name[0]}"), label]
                + _open(ol, wrk)
                + [str(int(ol["errors"])), over]
            )
    header = ["run", "server", "wrk peak req/s", "offered req/s (of the peak)", "answered req/s"]
    header += ["p50", "p99", "client kept its schedule", "errors", "NVML samples over budget"]
    return table(header, body)


def r_first_seconds(ctx: Ctx) -> str:
    """Each start: time to ``/readyz``, the three windows' req/s and p99, the ratio the target
    judges, Ray's daemons' CPU in the first window and HAProxy processes started in it."""
    doc = load(ctx.results / FIRST_SECONDS)
    b_args = ", ".join(f"`{k}: {v}`" for k, v in doc["args"]["ab_arg"])
    body = []
    for r in doc["rows"]:
        w, watch = r["windows"], r["budget_watch"]
        arm = "default (warm workers asked for 60 s in)" if r["arm"] == "A" else b_args
        body.append(
            [
                str(r["repeat"] + 1),
                arm,
                f"{r['ready_s']:.1f} s",
                " / ".join(fmt_rate(x["requests_per_s"]) for x in w),
                " / ".join(f"{x['p99_ms']:.1f}" for x in w),
                fmt_ms(w[0]["max_ms"]),
                f"**{r['verdict']['p99_ratio']:.2f}**",
                f"{w[0]['server_cpu']['server_cpu_s_by_kind']['ray-daemons']:.1f}",
                str(w[0]["server_cpu"]["server_processes_started"]),
                f"{watch['budget_violations']} of {watch['nvml_samples_judged']}",
            ]
        )
    header = ["start", "arm", "`/readyz` after", "req/s in 0-10 / 10-20 / 20-30 s", "p99 (ms)"]
    header += ["max in 0-10 s", "first p99 / last", "Ray's daemons, CPU s in 0-10 s"]
    header += ["processes started in 0-10 s", "NVML samples over budget"]
    return table(header, body)


def r_first_seconds_ceiling(ctx: Ctx) -> str:
    doc = load(ctx.results / FIRST_SECONDS)
    busiest = max(x["requests_per_s"] for r in doc["rows"] for x in r["windows"])
    ceil = float(doc["client_ceiling"]["requests_per_s"])
    return f"{fmt_rate(ceil)} requests/s, {ceil / busiest:.1f} times the busiest window"


# The CPU host, RAY_SERVE_HAPROXY_METRICS_ENABLED=1 (m1) or 0 (m0), in the order run.
HAPROXY_METRICS_AB = "profile/haproxy_metrics_cpu_ab_0c36abf"
HAPROXY_METRICS_RUNS = ("1_m1", "2_m0", "3_m0", "4_m1")


def r_haproxy_metrics_ab(ctx: Ctx) -> str:
    """Ray's Serve control processes' and all server processes' CPU per 1,000 no-op requests
    (wrk rows), with Ray's HAProxy request metrics on and off."""
    per: dict[str, list[tuple[float, float]]] = {"m1": [], "m0": []}
    for name in HAPROXY_METRICS_RUNS:
        rows = load(ctx.results / HAPROXY_METRICS_AB / name / "throughput.json")
        (row,) = [x for x in rows if x.get("setup") == "ray_serve_noop" and x["client"] == "wrk"]
        kinds = row["server_cpu_s_per_1000_requests_by_kind"]
        per[name[-2:]].append(
            (float(kinds["ray-serve-control"]), float(row["server_cpu_s_per_1000_requests"]))
        )

    def span(arm: str, i: int) -> str:
        lo, hi = sorted(v[i] for v in per[arm])
        return f"{lo:.3f} and {hi:.3f}"

    return (
        f"Ray's Serve control processes took {span('m1', 0)} CPU s per 1,000 requests with the "
        f"metrics on and {span('m0', 0)} with them off; all server processes {span('m1', 1)} "
        f"on, {span('m0', 1)} off"
    )


RENDERERS: dict[str, tuple[str, Renderer]] = {
    "throughput-run-r": (BLOCK, r_run_r),
    "throughput-run-r-vs-noop": (INLINE, r_run_r_vs_noop),
    "openloop-sweep": (BLOCK, r_openloop_sweep),
    "first-seconds-55966c2": (BLOCK, r_first_seconds),
    "first-seconds-55966c2-ceiling": (INLINE, r_first_seconds_ceiling),
    "haproxy-metrics-cpu-ab": (INLINE, r_haproxy_metrics_ab),
}
