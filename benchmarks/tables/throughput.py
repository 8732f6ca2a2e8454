"""The throughput runs of 2026-11-30 (``throughput_runs/[A-H]*``): each run's own
``throughput.json`` and ``meta.json``; the code each ran is the note written by hand into the
merged ``throughput.json``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from benchmarks.tables.common import (
    BLOCK,
    INLINE,
    Ctx,
    Renderer,
    Row,
    field,
    fmt_ms,
    fmt_range,
    fmt_rate,
    fmt_x,
    load,
    table,
)

TP_DIR = "throughput_runs"
# The runs of 2026-11-30 in the order the tables show them. The letter is the device lease.
RUNS_MINILM_1 = ("A_minilm_r4_r12_wait5ms", "B_minilm_r8_r12_r16", "C_minilm_r16_mps")
RUNS_MINILM_16 = ("B_minilm_r8_r12_r16", "C_minilm_r16_mps")
RUNS_RESNET = ("C_resnet_r12_noop_r12_r16", "E_resnet_r16", "E_resnet_r16_mps")
RUNS_MPS_AB = (
    "F_minilm16_r4_r8_r12_timesliced",
    "G_minilm16_r4_r8_timesliced",
    "G_minilm16_r4_r8_mps",
    "H_minilm16_r4_r8_r12_mps",
)
RUNS_ALL = tuple(dict.fromkeys(RUNS_MINILM_1 + RUNS_RESNET + RUNS_MPS_AB))


@dataclass(frozen=True)
class Run:
    name: str
    rows: list[dict[str, Any]]
    meta: dict[str, Any]

    @property
    def letter(self) -> str:
        return self.name[0]

    @property
    def host(self) -> str:
        """The host, told apart by its first GPU's UUID (meta.json's ``host`` is "vm" on all)."""
        return str(self.meta["machine"]["gpus"][0]["uuid"])

    @property
    def mps(self) -> bool:
        return any(r.get("mps") for r in self.served())

    def served(
        self, model: str | None = None, ipr: int | None = None, client: str | None = None
    ) -> list[dict[str, Any]]:
        return [
            r
            for r in self.rows
            if r.get("setup") == "serve_app"
            and r.get("status") == "ok"
            and (model is None or r.get("model") == model)
            and (ipr is None or r.get("inputs_per_request") == ipr)
            and (client is None or r.get("client") == client)
        ]


def run(ctx: Ctx, name: str) -> Run:
    d = ctx.results / TP_DIR / name
    return Run(name, load(d / "throughput.json"), load(d / "meta.json"))


def one_row(r: Run, setup: str, client: str, ipr: int) -> Row:
    """A run's one row of ``setup`` with ``client`` at ``ipr`` inputs a request that measured
    (status ok)."""
    (row,) = [
        x
        for x in r.rows
        if x.get("setup") == setup
        and x["client"] == client
        and x.get("inputs_per_request") == ipr
        and x.get("status") == "ok"
    ]
    return row


def hand_commits(ctx: Ctx) -> dict[str, str]:
    """The code each run was said to run: ``throughput.json``'s ``commit``, written by hand when
    the runs were merged (the runs' own meta.json files record no commit)."""
    return {r["run"]: str(r["commit"]) for r in load(ctx.results / "throughput.json")}


def nvml_hz(row: Row) -> float | None:
    """NVML samples judged per replica per second over the row's whole window (a wrk row spans
    all its tries, not the one ``duration_s`` names)."""
    t0, t1, n = row.get("started_unix_s"), row.get("ended_unix_s"), row.get("nvml_samples")
    if t0 is None or t1 is None or not n or t1 <= t0:
        return None
    return float(n) / float(row["replicas"]) / (float(t1) - float(t0))


def pairs(r: Run, model: str, ipr: int) -> Iterator[tuple[Row, Row | None]]:
    """(wrk row, open-loop row) per replica count, in the run's order."""
    for w in r.served(model, ipr, "wrk"):
        ol = [o for o in r.served(model, ipr, "open-loop") if o["replicas"] == w["replicas"]]
        yield w, (ol[0] if ol else None)


def same_host(ctx: Ctx, r: Run) -> list[Run]:
    return [x for x in (run(ctx, n) for n in RUNS_ALL) if x.host == r.host]


def ceiling(ctx: Ctx, r: Run, model: str) -> float | None:
    """The model's in-process best on the same host (same GPU UUID), when one was measured."""
    for x in same_host(ctx, r):
        for row in x.rows:
            if row.get("setup") == "in_process" and row.get("model") == model:
                return float(row["ceiling_items_per_s"])
    return None


def noop_wrk(ctx: Ctx, r: Run, replicas: int) -> float | None:
    """Plain Ray Serve's no-op at the same replica count on the same host, with wrk."""
    for x in same_host(ctx, r):
        for row in x.rows:
            if (
                row.get("setup") == "ray_serve_noop"
                and row.get("client") == "wrk"
                and row.get("replicas") == replicas
                and row.get("status") == "ok"
            ):
                return float(row["requests_per_s"])
    return None


def run_cell(ctx: Ctx, r: Run) -> str:
    return ctx.link(f"{TP_DIR}/{r.name}/", r.letter)


def layout(row: Row) -> str:
    return f"{row['replicas']} x {row['num_gpus']:g}"


def sharing(row: Row) -> str:
    return "MPS" if row.get("mps") else "time-sliced"


def budget_cell(row: Row | None) -> str:
    if row is None or row.get("budget_violations") is None:
        return "-"
    return f"{row['budget_violations']} of {row['nvml_samples']:,}"


def _hz_text(row: Row | None) -> str:
    hz = nvml_hz(row) if row is not None else None
    return "-" if hz is None else f"{hz:.1f}"


def hz_cell(w: Row, ol: Row | None) -> str:
    return f"{_hz_text(w)} / {_hz_text(ol)}"


def r_throughput_runs(ctx: Ctx) -> str:
    commits = hand_commits(ctx)
    body = []
    for name in RUNS_ALL:
        r = run(ctx, name)
        cores = r.meta.get("cores") or {}
        started = datetime.fromtimestamp(float(r.meta["created_unix_s"]), UTC)
        body.append(
            [
                run_cell(ctx, r),
                f"`{name}`",
                f"`{r.host[:12]}`",
                started.strftime("%Y-%m-%d %H:%M"),
                f"{cores.get('server')} / {cores.get('client')}",
                commits.get(name, "not recorded"),
            ]
        )
    header = ["run", "folder", "host (first GPU's UUID)", "started (UTC)"]
    header += ["server / client cores", "code, as written by hand in throughput.json"]
    return table(header, body)


def r_minilm_1(ctx: Ctx) -> str:
    body = []
    for name in RUNS_MINILM_1:
        r = run(ctx, name)
        for w, ol in pairs(r, "minilm", 1):
            noop = noop_wrk(ctx, r, int(w["replicas"]))
            ratio = float(w["requests_per_s"]) / noop if noop else None
            body.append(
                [
                    run_cell(ctx, r),
                    layout(w),
                    sharing(w),
                    fmt_rate(w["requests_per_s"]),
                    fmt_rate(noop),
                    fmt_x(ratio),
                    fmt_rate(field(ol, "requests_per_s")),
                    fmt_ms(field(ol, "p50_ms")),
                    fmt_ms(field(ol, "p99_ms")),
                    f"{w['errors']} / {ol['errors'] if ol else '-'}",
                    budget_cell(w),
                    hz_cell(w, ol),
                ]
            )
    header = ["run", "replicas x GPU", "GPU sharing", "wrk req/s", "no-op req/s, same host"]
    header += ["serve_app / no-op", "open-loop req/s", "open-loop p50", "open-loop p99"]
    header += ["errors (wrk / open-loop)"]
    header += ["over budget (wrk)", "NVML samples/s per replica (wrk / open-loop)"]
    return table(header, body)


def _items_table(ctx: Ctx, names: Sequence[str], model: str, ipr: int, unit: str) -> str:
    body = []
    for name in names:
        r = run(ctx, name)
        best = ceiling(ctx, r, model)
        for w, ol in pairs(r, model, ipr):
            row = [run_cell(ctx, r), layout(w), sharing(w)]
            if ipr > 1:
                row.append(fmt_rate(w["requests_per_s"]))
            row += [
                fmt_rate(w["items_per_s"]),
                fmt_x(float(w["items_per_s"]) / best if best else None),
                fmt_rate(field(ol, "items_per_s")),
                fmt_ms(field(ol, "p50_ms")),
                fmt_ms(field(ol, "p99_ms")),
                budget_cell(w),
                hz_cell(w, ol),
            ]
            body.append(row)
    header = ["run", "replicas x GPU", "GPU sharing"] + (["wrk req/s"] if ipr > 1 else [])
    header += [f"wrk {unit}/s", "x in-process best, same host", f"open-loop {unit}/s"]
    header += ["open-loop p50", "open-loop p99", "over budget (wrk)"]
    header += ["NVML samples/s per replica (wrk / open-loop)"]
    return table(header, body)


def r_minilm_16(ctx: Ctx) -> str:
    return _items_table(ctx, RUNS_MINILM_16, "minilm", 16, "texts")


def r_resnet(ctx: Ctx) -> str:
    return _items_table(ctx, RUNS_RESNET, "resnet50", 1, "images")


def r_in_process(ctx: Ctx) -> str:
    body = []
    for name in RUNS_ALL:
        r = run(ctx, name)
        for row in r.rows:
            if row.get("setup") == "in_process" and row.get("status") == "ok":
                body.append(
                    [
                        run_cell(ctx, r),
                        str(row["model"]),
                        fmt_rate(row["ceiling_items_per_s"]),
                        str(row["ceiling_batch"]),
                    ]
                )
    return table(["run", "model", "best items/s", "at batch"], body)


def r_client_ceiling(ctx: Ctx) -> str:
    body = []
    for name in RUNS_ALL:
        r = run(ctx, name)
        rows = [x for x in r.rows if x.get("setup") == "client_ceiling"]
        for payload in dict.fromkeys(x.get("payload") for x in rows):
            w = next(x for x in rows if x.get("payload") == payload and x["client"] == "wrk")
            o = next((x for x in rows if x.get("payload") == payload and x is not w), None)
            body.append(
                [
                    run_cell(ctx, r),
                    "no-op" if payload == "noop" else f"`{payload}`",
                    f"{w.get('client_cores')} / {w.get('server_cores')}",
                    fmt_rate(w["requests_per_s"]),
                    fmt_rate(field(o, "requests_per_s")),
                ]
            )
    header = ["run", "payload", "client / server cores", "wrk req/s"]
    return table(header + ["open-loop sustained req/s"], body)


def _texts(ctx: Ctx, name: str, replicas: int) -> tuple[Run, Row] | None:
    r = run(ctx, name)
    rows = [w for w in r.served("minilm", 16, "wrk") if w["replicas"] == replicas]
    return (r, rows[0]) if rows else None


def r_mps_ab(ctx: Ctx) -> str:
    pairings = [
        (4, "G_minilm16_r4_r8_timesliced", "G_minilm16_r4_r8_mps"),
        (8, "G_minilm16_r4_r8_timesliced", "G_minilm16_r4_r8_mps"),
        (4, "F_minilm16_r4_r8_r12_timesliced", "H_minilm16_r4_r8_r12_mps"),
        (8, "F_minilm16_r4_r8_r12_timesliced", "H_minilm16_r4_r8_r12_mps"),
        (12, "F_minilm16_r4_r8_r12_timesliced", "H_minilm16_r4_r8_r12_mps"),
    ]
    body = []
    for replicas, ts_name, mps_name in pairings:
        ts, mp = _texts(ctx, ts_name, replicas), _texts(ctx, mps_name, replicas)
        if ts is None or mp is None:
            continue
        (ts_run, ts_row), (mp_run, mp_row) = ts, mp
        body.append(
            [
                layout(ts_row),
                f"{fmt_rate(ts_row['items_per_s'])} ({run_cell(ctx, ts_run)})",
                f"{fmt_rate(mp_row['items_per_s'])} ({run_cell(ctx, mp_run)})",
                f"{float(mp_row['items_per_s']) / float(ts_row['items_per_s']):.2f}",
                "yes" if ts_run.host == mp_run.host else "no",
                f"{budget_cell(ts_row)} / {budget_cell(mp_row)}",
                " / ".join(_hz_text(x) for x in (ts_row, mp_row)),
            ]
        )
    header = ["replicas x GPU", "time-sliced texts/s", "`enforcement: mps` texts/s"]
    header += ["MPS / time-sliced", "same host", "over budget (time-sliced / MPS)"]
    return table(header + ["NVML samples/s per replica (time-sliced / MPS)"], body)


def r_mps_loss_same_host(ctx: Ctx) -> str:
    """How much fewer texts/s MPS served than time-slicing on the same host (run G)."""
    losses = []
    for replicas in (4, 8):
        ts = _texts(ctx, "G_minilm16_r4_r8_timesliced", replicas)
        mp = _texts(ctx, "G_minilm16_r4_r8_mps", replicas)
        if ts and mp:
            losses.append(100 * (1 - float(mp[1]["items_per_s"]) / float(ts[1]["items_per_s"])))
    return fmt_range(losses, 0, "%")


def _hz_values(ctx: Ctx, names: Sequence[str], model: str) -> list[float]:
    out = []
    for name in names:
        for row in run(ctx, name).served(model):
            hz = nvml_hz(row)
            if hz is not None:
                out.append(hz)
    return out


def r_hz_minilm(ctx: Ctx) -> str:
    return fmt_range(_hz_values(ctx, RUNS_MINILM_1, "minilm"))


def r_hz_resnet(ctx: Ctx) -> str:
    return fmt_range(_hz_values(ctx, ("C_resnet_r12_noop_r12_r16", "E_resnet_r16"), "resnet50"))


def r_hz_resnet_mps(ctx: Ctx) -> str:
    return fmt_range(_hz_values(ctx, ("E_resnet_r16_mps",), "resnet50"))


def r_hz_mps_ab(ctx: Ctx) -> str:
    return fmt_range(_hz_values(ctx, RUNS_MPS_AB, "minilm"))


RUN_PEERS_16 = "J_minilm_r12_peers_16cores_shared"  # 2026-12-03, issue 28's layout
RUN_M = "M_minilm_r12_16cores_shared_109778c"  # 2026-12-04, the same layout a day later
RUN_N = "N_minilm_r12_mixed_16cores_shared_109778c"  # 2026-12-04, mixed lengths, same layout


def _run_as_rendered(ctx: Ctx, run: str) -> str:
    """A run as the throughput tool renders it, its headings one level down."""
    # Imported here: render imports benchmarks.tables.common, whose package imports this module.
    from load_tests.benchmarks.throughput.render import render_markdown

    folder = ctx.results / TP_DIR / run
    text = render_markdown(load(folder / "throughput.json"), load(folder / "meta.json"))
    return text.replace("### ", "#### ").rstrip()


def r_run_peers_16(ctx: Ctx) -> str:
    return _run_as_rendered(ctx, RUN_PEERS_16)


def r_run_m(ctx: Ctx) -> str:
    return _run_as_rendered(ctx, RUN_M)


def r_run_n(ctx: Ctx) -> str:
    return _run_as_rendered(ctx, RUN_N)


# 2026-12-04, a later lease: the layout of runs J and M at 33838cf (CUDA graphs to batch 256).
RUN_O = "O_minilm_r12_16cores_shared_33838cf"
# The same lease: ResNet-50 at 16 x 0.06, time-sliced (with the client phase), then under MPS.
RUN_P_TS = "P_resnet_r16_16cores_shared_33838cf"
RUN_P_MPS = "P_resnet_r16_16cores_shared_mps_33838cf"


def r_run_o(ctx: Ctx) -> str:
    return _run_as_rendered(ctx, RUN_O)


def _wrk_try(row: Row, connections: int) -> Row:
    return next(t for t in row["tries"] if t["connections"] == connections)


def _try_rate(row: Row, connections: int) -> float:
    """A wrk row's requests/s at one connection count (its tries)."""
    return float(_wrk_try(row, connections)["requests_per_s"])


def _served_row(r: Run, client: str) -> Row:
    rows = r.served(client=client)
    assert len(rows) == 1, (r.name, client)
    return rows[0]


def _one_text_vs_noop(ctx: Ctx, name: str) -> tuple[Row, Row]:
    """A run's serve_app wrk row at one text a request and its no-op wrk row."""
    rows = run(ctx, name).rows
    serve = next(
        x
        for x in rows
        if x.get("setup") == "serve_app" and x["client"] == "wrk" and x["inputs_per_request"] == 1
    )
    noop = next(x for x in rows if x.get("setup") == "ray_serve_noop" and x["client"] == "wrk")
    return serve, noop


def r_run_o_vs_noop(ctx: Ctx) -> str:
    """Run O, one text a request: serve_app against the no-op, best against best (each at the
    connection count that carried most) and at each connection count."""
    serve, noop = _one_text_vs_noop(ctx, RUN_O)
    best = float(serve["requests_per_s"]) / float(noop["requests_per_s"])
    each = [
        f"{fmt_x(_try_rate(serve, c) / _try_rate(noop, c))} at {c:,} connections "
        f"({fmt_rate(_try_rate(serve, c))} against {fmt_rate(_try_rate(noop, c))})"
        for c in sorted(int(t["connections"]) for t in noop["tries"])
    ]
    return (
        f"{fmt_rate(serve['requests_per_s'])} against {fmt_rate(noop['requests_per_s'])} req/s, "
        f"best against best: {fmt_x(best)}; {', '.join(each)}"
    )


def r_run_o_cpu_vs_noop(ctx: Ctx) -> str:
    """Run O, one text a request: server CPU per request against the no-op's (the wrk rows, as
    the CPU table shows them)."""
    serve, noop = _one_text_vs_noop(ctx, RUN_O)
    a, b = (
        float(serve["server_cpu_s_per_1000_requests"]),
        float(noop["server_cpu_s_per_1000_requests"]),
    )
    return f"{a:.3f} against {b:.3f} s per 1,000 requests: {fmt_x(a / b)}"


def r_run_p(ctx: Ctx) -> str:
    """Run P: ResNet-50 at 16 x 0.06, time-sliced and under serve_app's MPS mode, side by side;
    then the client's ceiling for the payload (measured in the time-sliced call only)."""
    body = []
    runs = [run(ctx, RUN_P_TS), run(ctx, RUN_P_MPS)]
    conns = sorted({int(t["connections"]) for r in runs for t in _served_row(r, "wrk")["tries"]})
    for r in runs:
        w, ol = _served_row(r, "wrk"), _served_row(r, "open-loop")
        tries = [_wrk_try(w, c) for c in conns]
        both = " / ".join
        body.append(
            [
                ctx.link(f"{TP_DIR}/{r.name}/", "time-sliced" if not r.mps else "MPS"),
                layout(w),
                f"wrk, {both(f'c{c}' for c in conns)}",
                both(fmt_rate(t["requests_per_s"]) for t in tries),
                both(fmt_ms(t["p50_ms"]) for t in tries),
                both(fmt_ms(t["p99_ms"]) for t in tries),
                both(str(t["errors"]) for t in tries),
                both(f"{float(t['server_cpu_s_per_1000_requests']):.3f}" for t in tries),
                budget_cell(w),
            ]
        )
        body.append(
            [
                ctx.link(f"{TP_DIR}/{r.name}/", "time-sliced" if not r.mps else "MPS"),
                layout(ol),
                f"open-loop at {fmt_rate(ol['offered_per_s'])}/s"
                + (
                    " (fell behind)"
                    if "open-loop client fell behind its schedule" in ol["flags"]
                    else ""
                ),
                fmt_rate(ol["requests_per_s"]),
                fmt_ms(ol["p50_ms"]),
                fmt_ms(ol["p99_ms"]),
                str(ol["errors"]),
                f"{float(ol['server_cpu_s_per_1000_requests']):.3f}",
                budget_cell(ol),
            ]
        )
    header = ["GPU sharing", "replicas x GPU", "client", "images/s", "p50", "p99", "errors"]
    header += ["server CPU s / 1,000 req", "over budget (of NVML samples)"]
    ts, mps = (_served_row(r, "wrk") for r in runs)
    ratios = ", ".join(
        f"{fmt_x(_try_rate(mps, c) / _try_rate(ts, c))} at {c:,} connections" for c in conns
    )
    ceiling = next(
        x for x in runs[0].rows if x.get("setup") == "client_ceiling" and x["client"] == "wrk"
    )
    best = max(float(x["requests_per_s"]) for x in (ts, mps))
    return "\n".join(
        [
            table(header, body),
            "",
            f"MPS against time-sliced, wrk: {ratios}. The client's own ceiling for this payload "
            f"(wrk against HAProxy's static no-op on the same cores, {ceiling['connections']:,} "
            f"connections), measured in the time-sliced call: "
            f"{fmt_rate(ceiling['requests_per_s'])} requests/s, "
            f"{float(ceiling['requests_per_s']) / best:.0f} times the best row above. The MPS "
            "call ran `--phases serve` alone, so its own tables say "
            '"client ceiling not measured".',
        ]
    )


RUN_CPU_PIPELINE = "K_cpu_minilm_l0_pipeline"  # 2026-12-03, three runs on the 2-core CPU host


def r_cpu_pipeline(ctx: Ctx) -> str:
    """Run K: serve_app with a 0-layer MiniLM against the no-op, three runs, every served row."""
    from load_tests.benchmarks.throughput.render import unmeasured_note

    body = []
    for sub in ("run1", "run2", "run3"):
        rows = load(ctx.results / TP_DIR / RUN_CPU_PIPELINE / sub / "throughput.json")
        for r in rows:
            if r.get("setup") not in ("serve_app", "ray_serve_noop") or r.get("status") != "ok":
                continue
            kinds = r.get("server_cpu_s_per_1000_requests_by_kind") or {}
            replica = kinds.get("replica")
            body.append(
                [
                    ctx.link(f"{TP_DIR}/{RUN_CPU_PIPELINE}/{sub}/throughput.json", sub),
                    "serve_app, 0 layers" if r["setup"] == "serve_app" else "Ray Serve no-op",
                    str(r.get("payload")),
                    str(r.get("client")),
                    fmt_rate(r.get("requests_per_s")),
                    f"{r['server_cpu_s_per_1000_requests']:.3f}{unmeasured_note(r)}",
                    fmt_x(r.get("server_cpu_vs_noop")),
                    "-" if replica is None else f"{replica:.3f}",
                    fmt_ms(r.get("p99_ms")),
                ]
            )
    header = ["run", "setup", "payload", "client", "req/s", "server CPU s / 1,000 req"]
    header += ["x no-op's", "replica CPU s / 1,000 req", "p99"]
    return table(header, body)


OPENLOOP_CLIENT_RUNS = (
    "openloop_client/aiohttp_95cd153_run1.json",
    "openloop_client/rawhttp_a8e6750_run1.json",
    "openloop_client/aiohttp_95cd153_run2.json",
    "openloop_client/rawhttp_a8e6750_run2.json",
)


def r_openloop_client(ctx: Ctx) -> str:
    """The open-loop client's own cost, aiohttp against rawhttp, rate by rate, in run order."""
    body = []
    for rel in OPENLOOP_CLIENT_RUNS:
        doc = load(ctx.results / rel)
        for p in doc["points"]:
            body.append(
                [
                    ctx.link(rel, doc["label"]),
                    fmt_rate(p["offered_per_s"]),
                    fmt_rate(p["requests_per_s"]),
                    f"{p['client_cpu_frac_max']:.2f}",
                    fmt_ms(p["p50_ms"]),
                    fmt_ms(p["p99_ms"]),
                    fmt_ms(p["send_lag_p99_ms"]),
                    "yes" if p["client_keeps_up"] else "**no**",
                ]
            )
    header = ["client (commit)", "offered req/s", "answered req/s", "client core used"]
    header += ["p50", "p99", "send lag p99", "kept its schedule"]
    return table(header, body)


RENDERERS: dict[str, tuple[str, Renderer]] = {
    "throughput-cpu-pipeline": (BLOCK, r_cpu_pipeline),
    "throughput-run-peers-16": (BLOCK, r_run_peers_16),
    "throughput-run-m": (BLOCK, r_run_m),
    "throughput-run-n": (BLOCK, r_run_n),
    "throughput-run-o": (BLOCK, r_run_o),
    "throughput-run-o-vs-noop": (INLINE, r_run_o_vs_noop),
    "throughput-run-o-cpu-vs-noop": (INLINE, r_run_o_cpu_vs_noop),
    "throughput-run-p": (BLOCK, r_run_p),
    "openloop-client": (BLOCK, r_openloop_client),
    "throughput-runs": (BLOCK, r_throughput_runs),
    "throughput-minilm-1": (BLOCK, r_minilm_1),
    "throughput-minilm-16": (BLOCK, r_minilm_16),
    "throughput-resnet": (BLOCK, r_resnet),
    "throughput-in-process": (BLOCK, r_in_process),
    "throughput-client-ceiling": (BLOCK, r_client_ceiling),
    "mps-vs-timesliced": (BLOCK, r_mps_ab),
    "mps-loss-same-host": (INLINE, r_mps_loss_same_host),
    "nvml-hz-minilm": (INLINE, r_hz_minilm),
    "nvml-hz-resnet": (INLINE, r_hz_resnet),
    "nvml-hz-resnet-mps": (INLINE, r_hz_resnet_mps),
    "nvml-hz-mps-ab": (INLINE, r_hz_mps_ab),
}
