"""The docs' tables and figures, rendered from the raw results they cite.

    python benchmarks/render.py            # rewrite every marked block in the docs
    python benchmarks/render.py --check    # exit 1, with a diff, where a doc differs from its JSON

A marked block is ``<!-- render:NAME -->...<!-- /render:NAME -->`` in one of ``DOC_GLOBS``;
NAME is a key of ``RENDERERS``. Block renderers write whole tables
(the markers on lines of their own), inline ones a figure inside a sentence. Everything here
reads ``benchmarks/results/`` only: no Ray, no network, no GPU. ``tests/docs`` runs ``--check``'s
logic in CI, so a figure that no longer matches its JSON fails the build.

The formatting helpers follow ``load_tests/throughput/render.py`` (copied, not imported: that
module is moving, and this script runs with the standard library alone).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOC_GLOBS = ("README.md", "docs/*.md", "benchmarks/*.md", "benchmarks/journal/*.md")
MARKER = re.compile(
    r"<!-- render:(?P<name>[a-z0-9-]+) -->(?P<body>.*?)<!-- /render:(?P=name) -->", re.S
)
GIB = float(1 << 30)
MB = 1e6

Row = Mapping[str, Any]


# ---- formatting ----------------------------------------------------------------------------


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


# ---- context: where the doc is, so that links resolve from it ------------------------------


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


# ---- throughput runs -----------------------------------------------------------------------

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
                    fmt_rate(ol and ol["requests_per_s"]),
                    fmt_ms(ol and ol["p50_ms"]),
                    fmt_ms(ol and ol["p99_ms"]),
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
                fmt_rate(ol and ol["items_per_s"]),
                fmt_ms(ol and ol["p50_ms"]),
                fmt_ms(ol and ol["p99_ms"]),
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
                    fmt_rate(o and o["requests_per_s"]),
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


# ---- the A/B of run 9 (2026-12-01) ---------------------------------------------------------

RUN9 = f"{TP_DIR}/I_minilm_r8_ab_97e0303_vs_head/run9_abba_475a289"
RUN9_SIDES = (("1_head", "475a289"), ("2_base", "97e0303"), ("3_base", "97e0303"))
RUN9_SIDES += (("4_head", "475a289"),)


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


# ---- start-up (startup.json, merged by hand from two runs) ---------------------------------

STARTUP_MEASURES = (
    ("decision_to_serving_s", "decision", "the controller's decision to the new replica serving"),
    ("replacement_s", "replacement", "SIGKILL of a replica to its replacement serving"),
    ("cold_ready_s", "cold_4x0.25_minilm", "cold `serve-app run`, 4 x 0.25 MiniLM, to `/readyz`"),
)


def _startup(ctx: Ctx) -> dict[str, Any]:
    return load(ctx.results / "startup.json")


def _startup_violations(ctx: Ctx, setup: str) -> tuple[int, int]:
    """(violations, NVML samples judged) of the raw file the setup's rows came from."""
    for src in _startup(ctx)["meta"]["sources"]:
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
    data = _startup(ctx)
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


# ---- the encoder A/B (one H200, 475a289) ---------------------------------------------------

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


# ---- fault suites --------------------------------------------------------------------------

GPU_FAULT_RUNS = ("reliability/gpu_faults_h200_run1.json", "reliability/gpu_faults_h200_run2.json")
CPU_FAULT_FILES = (
    "reliability/faults_cpu.json",
    "reliability/sigstop15_ray_defaults.json",
    "reliability/sigstop15.json",
    "reliability/sigstop40.json",
    "reliability/gpu_faults_cpu_dry_run.json",
)


def _kill_series(detail: Mapping[str, Any]) -> str:
    oor = [float(x) for x in detail["out_of_rotation_s"]]
    measured = [x for x in oor if x >= 0]
    text = (
        f"{detail['kills']} of {detail['kills_asked']} kills in {detail['series_s']:g} s; "
        f"replacements serving {fmt_range(detail['replacement_s'], 2)} s after their kill; "
        f"each victim out of HAProxy's rotation {fmt_range(measured, 2)} s after its kill"
    )
    if len(measured) < len(oor):
        bad = ", ".join(f"{x:g}" for x in oor if x < 0)
        text += f" ({len(measured)} kills; {len(oor) - len(measured)} recorded {bad}, not a measurement)"
    return text


def _fault_notes(row: Mapping[str, Any]) -> str:
    d = row.get("detail") or {}
    fault = row["fault"]
    if fault == "kill20":
        return _kill_series(d)
    if fault == "poisoned":
        return f"the replica exited {d['exited_s']:g} s after the hook, its requests replayed"
    if fault == "sigstop":
        replaced = "replaced while stopped" if d.get("replaced_while_stopped") else "not replaced"
        return (
            f"out of rotation {d['out_of_rotation_s']:g} s after SIGSTOP; stopped "
            f"{d['stopped_s']:g} s, {replaced}; neighbours {d['neighbour_answers']:,} answers, "
            f"{d['neighbour_lost']} lost, {d['neighbour_failed']} failed"
        )
    if fault == "hog":
        if "hog" not in d:
            return str(d.get("skipped", "-"))
        h = d["hog"]
        return (
            f"another process took {h['taken_bytes'] / GIB:.1f} GiB, leaving "
            f"{h['free_while_held_bytes'] / GIB:.2f} GiB free for {h['held_s']:g} s; "
            f"{d['requests_while_hogged']:,} requests meanwhile, "
            f"{d['lost_while_hogged']} lost, {d['failed_while_hogged']} failed"
        )
    if fault == "overload_3x":
        s = d.get("statuses", {})
        text = f"capacity {d['capacity_rps']:g} req/s, offered {d['offered_rps']:g}"
        if "items_per_request" in d:
            text += f" ({d['items_per_request']} texts a request)"
        text += f"; {s.get('503', 0):,} x 503, {s.get('200', 0):,} x 200"
        if "accepted_p99_s" in d:
            text += f" (p99 {d['accepted_p99_s']:g} s)"
        return text
    if fault.startswith("hostile:"):
        return f"answer {d.get('answer')} in {d.get('took_s'):g} s"
    return "-"


def _fault_row(row: Mapping[str, Any]) -> list[str]:
    rec = row.get("recovery_s")
    return [
        f"`{row['fault']}`",
        f"{row['sent']:,}",
        str(row["lost"]),
        f"{row['failed']:,}",
        "-" if rec is None else f"{rec:g}",
        _fault_notes(row),
    ]


def r_gpu_faults(ctx: Ctx) -> str:
    body = []
    lines = []
    for i, rel in enumerate(GPU_FAULT_RUNS, start=1):
        d = load(ctx.results / rel)
        for row in d["rows"]:
            body.append([f"{i} ({ctx.link(rel, 'JSON')})", *_fault_row(row)])
        watch = d.get("memory")
        judged = (
            f"{watch['budget_violations']} budget violations in {watch['nvml_samples_judged']:,} "
            f"NVML samples of {watch['replica_pids_judged']} replica processes"
            if watch
            else "no NVML budget judging recorded"
        )
        lines.append(
            f"- Run {i}: `complete: {str(d['complete']).lower()}`, {d['took_s']:g} s, faults "
            f"{', '.join(r['fault'] for r in d['rows'])}; {judged}."
        )
    header = ["run", "fault", "sent", "lost", "failed", "recovery_s", "what the JSON shows"]
    return table(header, body) + "\n\n" + "\n".join(lines)


def r_cpu_faults(ctx: Ctx) -> str:
    body = []
    for rel in CPU_FAULT_FILES:
        d = load(ctx.results / rel)
        for row in d["rows"]:
            body.append([ctx.link(rel), *_fault_row(row)])
    header = ["file", "fault", "sent", "lost", "failed", "recovery_s", "what the JSON shows"]
    return table(header, body)


SOAK_FILES = ("reliability/soak_cpu_120s.json", "reliability/soak_cpu_600s.json")


def r_soak_cpu(ctx: Ctx) -> str:
    body = []
    for rel in SOAK_FILES:
        d = load(ctx.results / rel)
        t, v = d["totals"], d["verdict"]
        reps = v["replicas"]
        body.append(
            [
                ctx.link(rel),
                f"`{str(d['commit'])[:7]}`",
                f"{d['cli']['duration_s']:g} s",
                f"{d['rate_rps']:g} ({d['peak_rps']:g})",
                f"{t['sent']:,}",
                str(t["lost"]),
                str(t["failed"]),
                fmt_range((r["rss_spread_bytes"] / MB for r in reps), 1, " MB"),
                fmt_range((r["rss_slope_bytes_per_min"] / MB for r in reps), 1, " MB/min"),
                "yes" if v["flat"] else "no",
            ]
        )
    header = ["file", "commit", "duration", "req/s offered (peak)", "sent", "lost", "failed"]
    header += ["RSS spread per replica after warm-up", "RSS slope", "flat"]
    return table(header, body)


def _kill20(ctx: Ctx) -> Mapping[str, Any]:
    rows = load(ctx.results / GPU_FAULT_RUNS[1])["rows"]
    return next(r for r in rows if r["fault"] == "kill20")["detail"]


def r_kill20_oor(ctx: Ctx) -> str:
    return fmt_range((x for x in _kill20(ctx)["out_of_rotation_s"] if x >= 0), 2, " s")


def r_kill20_negative(ctx: Ctx) -> str:
    oor = _kill20(ctx)["out_of_rotation_s"]
    return "; ".join(f"kill {i} of {len(oor)}: {x:g} s" for i, x in enumerate(oor, 1) if x < 0)


# ---- memory test 2 (tests/gpu/test_memory_gpu.py) ------------------------------------------

MEMORY_TEST_2 = (
    ("cb06e10", "startup/memory_gpu_2_oversized_isolation_run6_cb06e10.json"),
    ("475a289", "startup/memory_gpu_2_oversized_isolation_run7_475a289.json"),
    ("475a289", "startup/memory_gpu_2_oversized_isolation_run7b_475a289.json"),
)


def r_memory_test_2(ctx: Ctx) -> str:
    body = []
    for code, rel in MEMORY_TEST_2:
        d = load(ctx.results / rel)
        over, steady = d["oversized"], d["steady"]
        statuses = ", ".join(f"{n} x {s}" for s, n in over["load"]["statuses"].items())
        ratio, limit = steady["p99_ratio"], steady["p99_limit_factor"]
        body.append(
            [
                ctx.link(rel, rel.rsplit("_", 2)[-2] if "_run" in rel else rel),
                f"`{code}`",
                f"{over['cap_bytes']:,}",
                f"{over['nvml_max_bytes']:,}",
                f"{(over['cap_bytes'] - over['nvml_max_bytes']) / MB:.1f} MB",
                statuses,
                str(over["oom_recoveries"]),
                f"x{ratio:.2f} ({'passed' if ratio <= limit else 'failed'}, limit x{limit:g})",
            ]
        )
    header = ["run", "code", "cap bytes", "NVML max bytes", "under the cap", "answers"]
    return table(header + ["OOM recoveries", "steady replicas' p99 ratio"], body)


# ---- the cache policy's cost (research/cache_policy_cost.py, in-process) -------------------

CACHE_COST_RUNS = (
    ("first GPU tests", "gpu_tests/cache_policy_cost.json"),
    ("after the batcher", "gpu_tests/batcher/cache_policy_cost.json"),
    ("with CUDA graphs", "gpu_tests/graphs/cache_policy_cost.json"),
)


def _model_label(m: Mapping[str, Any]) -> str:
    name = "MiniLM" if "MiniLM" in str(m["model"]) else str(m["model"])
    tokens = f" x {m['tokens_per_item']} tokens" if m.get("tokens_per_item") else ""
    return f"{name} {m['dtype']}, batch {m['batch']}{tokens}"


def r_cache_policy_cost(ctx: Ctx) -> str:
    d = load(ctx.results / CACHE_COST_RUNS[-1][1])
    order = ("always", "threshold", "threshold_1pct", "never")
    body = []
    for m in d["models"]:
        cells = []
        for pol in order:
            r = m["results"][pol]
            cost = "" if pol == "never" else f" ({r['cost_vs_never_pct']:+.1f}%, "
            cost += "" if pol == "never" else f"{r['frees']} frees)"
            cells.append(f"{r['mean_ms']:.3f} ms{cost}")
        body.append([_model_label(m), *cells])
    fr = {k: v["threshold_fraction"] for k, v in d["policies"].items()}
    header = ["model", "`always`", f"`threshold` ({fr['threshold']:g}, the default)"]
    header += [f"`threshold` at {fr['threshold_1pct']:g}", "`never`"]
    spread = []
    for label, rel in CACHE_COST_RUNS:
        runs = load(ctx.results / rel)["models"]
        pcts = ", ".join(
            f"{r['results']['threshold']['cost_vs_never_pct']:+.2f}% "
            f"({'MiniLM' if 'MiniLM' in str(r['model']) else r['model']})"
            for r in runs
        )
        spread.append(f"{ctx.link(rel, label)}: {pcts}")
    note = (
        f"Mean of {d['rounds']} interleaved rounds of {d['batches_per_round']} batches, "
        f"{d['device']}, a {d['num_gpus']:g} budget. `threshold` against `never` in each run: "
        + "; ".join(spread)
        + "."
    )
    return table(header, body) + "\n\n" + note


def r_cache_policy_nvml(ctx: Ctx) -> str:
    rel = "gpu_tests/graphs/memory_gpu_4_cache_policy.json"
    d = load(ctx.results / rel)
    body = []
    for pol in ("always", "threshold", "never"):
        r = d["policies"][pol]
        body.append(
            [
                f"`{pol}`",
                f"{r['baseline_nvml_bytes']:,}",
                f"{r['after_nvml_bytes']:,}",
                f"{r['nvml_delta_bytes']:+,}",
                str(r["cache_frees"]),
            ]
        )
    header = ["policy", "NVML bytes before", "after", "change", "cache frees"]
    return table(header, body) + f"\n\n{d['items']} inputs in one batch ({ctx.link(rel)})."


# ---- the controller's H200 timeline (tests/gpu/test_controller_gpu.py) -------------------

TIMELINE = "gpu_tests/controller_timeline.json"
LOG_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def _decisions(d: Mapping[str, Any]) -> list[tuple[float, str]]:
    """(seconds after the test started, line) of each logged decision; the Serve controller
    logs in the host's time, which is UTC there."""
    out = []
    for line in d["controller_log"]:
        m = LOG_TIME.search(line)
        if m:
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
            out.append((t.timestamp() - float(d["started_at_unix_s"]), line))
    return out


def r_controller_timeline(ctx: Ctx) -> str:
    d = load(ctx.results / TIMELINE)
    phase = {p["name"]: float(p["t_s"]) for p in d["phases"]}
    dec = _decisions(d)

    def first(after: float, word: str) -> tuple[float, str]:
        return next((t, line) for t, line in dec if t >= after and word in line)

    def quote(line: str) -> str:
        return line.split("controller-gpu/model: ", 1)[-1].split(";")[0]

    up, up_line = first(phase["load"], "(scale_up)")
    shed, shed_line = first(phase["grab holds"], "(shed_memory_pressure)")
    back, _ = first(phase["release"], "(scale_up)")
    sheds = [t for t, line in dec if "(shed_memory_pressure)" in line and t < phase["release"]]
    gap_s = statistics.fmean(b - a for a, b in zip(sheds, sheds[1:], strict=False))
    grab = next(iter(d["grab"].values()))
    load_ = d["load"]
    rows = [
        [
            "load begins to the first scale-up decision",
            f"{up - phase['load']:.2f} s",
            f"`{quote(up_line)}`",
        ],
        [
            "the grab holds to the first shed",
            f"{shed - phase['grab holds']:.2f} s",
            f"`{quote(shed_line)}`; {len(sheds)} sheds in all, {gap_s:.2f} s apart",
        ],
        [
            "free bytes the grab left",
            f"{grab['free_bytes']:,}",
            f"of {grab['total_bytes']:,}; the grabbing process took {grab['grabbed_bytes']:,}",
        ],
        ["fewest replicas under the grab", str(d["fewest_replicas_under_grab"]), "`min_replicas`"],
        ["the release to the next scale-up decision", f"{back - phase['release']:.2f} s", ""],
        ["requests sent / failed", f"{load_['sent']:,} / {load_['failed']}", ""],
    ]
    note = (
        "Times run from the phase's start in the test's clock to the decision's line in the "
        f"Serve controller's log ({ctx.link(TIMELINE, 'JSON')}: `phases`, `controller_log`)."
    )
    return table(["figure", "value", "detail"], rows) + "\n\n" + note


# ---- the README's summary ------------------------------------------------------------------


def r_readme_headline(ctx: Ctx) -> str:
    b = run(ctx, "B_minilm_r8_r12_r16")
    w, ol = next((w, o) for w, o in pairs(b, "minilm", 1) if w["replicas"] == 12)
    e, em = run(ctx, "E_resnet_r16"), run(ctx, "E_resnet_r16_mps")
    ew = e.served("resnet50", 1, "wrk")[0]
    emw = em.served("resnet50", 1, "wrk")[0]
    s = _startup(ctx)["summary"]
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


# ---- the registry and the rewriting --------------------------------------------------------

Renderer = Callable[[Ctx], str]
BLOCK, INLINE = "block", "inline"
RENDERERS: dict[str, tuple[str, Renderer]] = {
    "throughput-runs": (BLOCK, r_throughput_runs),
    "throughput-minilm-1": (BLOCK, r_minilm_1),
    "throughput-minilm-16": (BLOCK, r_minilm_16),
    "throughput-resnet": (BLOCK, r_resnet),
    "throughput-in-process": (BLOCK, r_in_process),
    "throughput-client-ceiling": (BLOCK, r_client_ceiling),
    "mps-vs-timesliced": (BLOCK, r_mps_ab),
    "mps-loss-same-host": (INLINE, r_mps_loss_same_host),
    "warm-rss": (INLINE, r_warm_rss),
    "nvml-hz-minilm": (INLINE, r_hz_minilm),
    "nvml-hz-resnet": (INLINE, r_hz_resnet),
    "nvml-hz-resnet-mps": (INLINE, r_hz_resnet_mps),
    "nvml-hz-mps-ab": (INLINE, r_hz_mps_ab),
    "ab-run9": (BLOCK, r_ab_run9),
    "ab-run9-first": (INLINE, r_ab_run9_first),
    "ab-run9-later": (INLINE, r_ab_run9_later),
    "startup": (BLOCK, r_startup),
    "encoder-eager": (INLINE, r_encoder_eager),
    "encoder-graph-16": (INLINE, r_encoder_graph_16),
    "encoder-graph-128": (INLINE, r_encoder_graph_128),
    "gpu-faults": (BLOCK, r_gpu_faults),
    "cpu-faults": (BLOCK, r_cpu_faults),
    "kill20-out-of-rotation": (INLINE, r_kill20_oor),
    "soak-cpu": (BLOCK, r_soak_cpu),
    "kill20-negative": (INLINE, r_kill20_negative),
    "memory-test-2": (BLOCK, r_memory_test_2),
    "controller-timeline": (BLOCK, r_controller_timeline),
    "cache-policy-cost": (BLOCK, r_cache_policy_cost),
    "cache-policy-nvml": (BLOCK, r_cache_policy_nvml),
    "readme-headline": (BLOCK, r_readme_headline),
}


def render_text(text: str, doc: Path, results: Path = RESULTS) -> str:
    """``text`` with every marked block re-rendered; raises KeyError for an unknown NAME."""
    ctx = Ctx(doc.resolve(), results)

    def one(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in RENDERERS:
            raise KeyError(f"{doc}: unknown block <!-- render:{name} -->")
        kind, fn = RENDERERS[name]
        body = f"\n{fn(ctx)}\n" if kind == BLOCK else fn(ctx)
        return f"<!-- render:{name} -->{body}<!-- /render:{name} -->"

    return MARKER.sub(one, text)


def docs(root: Path = ROOT) -> list[Path]:
    return sorted({p for g in DOC_GLOBS for p in root.glob(g)})


def used_names(root: Path = ROOT) -> set[str]:
    return {m.group("name") for p in docs(root) for m in MARKER.finditer(p.read_text())}


def diffs(root: Path = ROOT, results: Path = RESULTS) -> dict[Path, str]:
    """Per doc whose marked blocks differ from what the JSON gives: a unified diff."""
    out = {}
    for path in docs(root):
        old = path.read_text()
        new = render_text(old, path, results)
        if new != old:
            rel = str(path.relative_to(root))
            out[path] = "".join(
                difflib.unified_diff(
                    old.splitlines(keepends=True),
                    new.splitlines(keepends=True),
                    f"{rel} (as committed)",
                    f"{rel} (rendered from benchmarks/results)",
                )
            )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/render.py", description=__doc__)
    p.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    a = p.parse_args(argv)
    changed = diffs()
    for path, diff in changed.items():
        if a.check:
            sys.stdout.write(diff)
        else:
            path.write_text(render_text(path.read_text(), path))
            print(f"rewrote {path.relative_to(ROOT)}")
    unused = set(RENDERERS) - used_names()
    if unused:
        print(f"renderers no doc uses: {', '.join(sorted(unused))}", file=sys.stderr)
    if a.check and changed:
        print(f"{len(changed)} doc(s) differ from their JSON: python benchmarks/render.py")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
