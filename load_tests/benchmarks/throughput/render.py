"""Markdown tables of a throughput.json for docs/benchmarks.md.

    python -m load_tests.benchmarks.throughput.render DIR/throughput.json

Reads DIR/meta.json beside it when present (machine, cores, flags). Prints on stdout.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.tables.common import fmt_ms, fmt_rate  # one formatting for the docs and this
from load_tests.benchmarks.throughput import rows as rowlib

GIB = float(1 << 30)
MODEL_TITLES = {
    "minilm": "MiniLM-L6 embeddings, fp16 (dummy weights), short texts",
    "resnet50": "ResNet-50, fp16 (dummy weights), 224 px JPEGs",
}


SETUP_TITLES = {
    "serve_app": "serve_app",
    "ray_serve_batch": "Plain Ray Serve with @serve.batch (peer)",
    "litserve": "LitServe 0.2.19 (peer)",
}
CPU_KINDS = ("replica", "haproxy", "ray-serve-control", "ray-daemons", "litserve-http", "other")


def fmt_x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x" if value >= 0.1 else f"{value:.3f}x"


def _table(header: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return lines


def _status(row: Mapping[str, Any]) -> str:
    status = str(row.get("status") or "?")
    if status == "ok":
        flags = row.get("flags") or []
        return "ok" if not flags else "FLAG: " + "; ".join(flags)
    note = str(row.get("note") or "")
    return f"{status}: {note[:120]}" if note else status


def _errors(row: Mapping[str, Any]) -> str:
    if row.get("errors") is None:
        return "-"
    n, total = int(row["errors"]), row.get("requests") or 0
    return f"{n}" if not total else f"{n} ({100.0 * n / total:.2f}%)"


def _layout(row: Mapping[str, Any]) -> str:
    gpus = row.get("num_gpus")
    return f"{row.get('replicas')} x {gpus:g}" if gpus else f"{row.get('replicas')} (no GPU)"


def _workload(row: Mapping[str, Any]) -> str:
    return str(row.get("workload") or "short")


def _served_tables(rows: Sequence[Mapping[str, Any]], setup: str, title: str) -> list[str]:
    """One table per model and workload of ``setup``'s rows."""
    out: list[str] = []
    mine = [r for r in rows if r.get("setup") == setup]
    for model, workload in dict.fromkeys((r.get("model"), _workload(r)) for r in mine):
        served = [r for r in mine if r.get("model") == model and _workload(r) == workload]
        what = MODEL_TITLES.get(str(model), str(model))
        if workload == "mixed":
            what = what.replace("short texts", "mixed queries and passages")
        out += [f"### {title}: {what}", ""]
        body = [
            [
                _layout(r),
                str(r.get("inputs_per_request")),
                str(r.get("client")),
                fmt_rate(r.get("requests_per_s")),
                fmt_rate(r.get("items_per_s")),
                fmt_x(r.get("vs_ceiling")),
                fmt_ms(r.get("p50_ms")),
                fmt_ms(r.get("p99_ms")),
                _errors(r),
                fmt_rate(r.get("client_ceiling_requests_per_s")),
                fmt_x(r.get("client_headroom")),
                "-" if r.get("budget_violations") is None else str(r["budget_violations"]),
                _status(r),
            ]
            for r in served
        ]
        header = ["replicas x GPU", "inputs/req", "client", "req/s", "items/s", "x ceiling"]
        header += ["p50", "p99", "errors", "client ceiling req/s", "headroom", "over budget"]
        out += _table([*header, "status"], body)
        out.append("")
    return out


def _tokens_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Texts/s and tokens/s of every row that has them (text payloads and the text model's
    in-process ceiling), beside the ceiling on the same workload."""
    rated = [r for r in rows if r.get("tokens_per_s") is not None]
    if not rated:
        return []
    body = [
        [
            str(r.get("setup")),
            str(r.get("workload") or "short"),
            "-" if r.get("replicas") is None else _layout(r),
            str(r.get("inputs_per_request") or "-"),
            str(r.get("client") or "-"),
            "-" if r.get("tokens_per_request") is None else f"{r['tokens_per_request']:.1f}",
            fmt_rate(r.get("texts_per_s")),
            fmt_rate(r.get("tokens_per_s")),
            fmt_x(r.get("vs_ceiling_tokens")),
        ]
        for r in rated
    ]
    header = ["setup", "workload", "replicas x GPU", "inputs/req", "client", "tokens/req"]
    header += ["texts/s", "tokens/s", "x ceiling (tokens)"]
    out = ["### Texts and tokens per second (MiniLM's tokenizer, [CLS] and [SEP] included)", ""]
    return out + _table(header, body) + [""]


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def unmeasured_note(row: Mapping[str, Any]) -> str:
    """A note for a window that left a server process out (one already running that the first
    snapshot missed, as when Ray reloads HAProxy): its figure is short by that process's CPU."""
    n = int(row.get("server_processes_unmeasured") or 0)
    return f" (short: {n} process{'es' if n > 1 else ''} unmeasured)" if n else ""


def _cpu_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The server's CPU seconds per 1,000 requests of every row that has it, beside the no-op's
    at the same replica count and client, and split by process kind."""
    have = [r for r in rows if r.get("server_cpu_s_per_1000_requests") is not None]
    if not have:
        return []
    body = []
    for r in have:
        by_kind = r.get("server_cpu_s_per_1000_requests_by_kind") or {}
        body.append(
            [
                str(r.get("setup")),
                str(r.get("payload")),
                str(r.get("replicas") or "-"),
                str(r.get("client")),
                fmt_rate(r.get("requests_per_s")),
                _cpu(r.get("server_cpu_s_per_1000_requests")) + unmeasured_note(r),
                fmt_x(r.get("server_cpu_vs_noop")),
                "-" if r.get("server_cores_busy") is None else f"{r['server_cores_busy']:.2f}",
                *(_cpu(by_kind.get(k)) for k in CPU_KINDS),
            ]
        )
    header = ["setup", "payload", "replicas", "client", "req/s", "CPU s / 1,000 req"]
    header += ["x no-op's", "cores busy", *CPU_KINDS]
    return [
        "### Server CPU per 1,000 requests (every server process, from /proc)",
        "",
        *_table(header, body),
        "",
    ]


def render_markdown(
    rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None = None
) -> str:
    """The tables: the clients' ceiling, the in-process ceiling, serve_app per model, and the
    plain Ray Serve no-op; then the run's flags."""
    meta = meta or {}
    out: list[str] = []
    machine = meta.get("machine") or {}
    cores = meta.get("cores") or {}
    if meta:
        out += [
            f"Host {meta.get('host', '?')}: {machine.get('gpu_name') or 'no GPU'}, "
            f"{machine.get('cpu_count')} CPUs (server cores {cores.get('server')}, client "
            f"cores {cores.get('client')}), torch {machine.get('torch_version')}, Ray "
            f"{machine.get('ray_version')}, Python {machine.get('python')}.",
            "",
        ]
    client = [r for r in rows if r.get("setup") == "client_ceiling"]
    if client:
        out += ["### The clients' own ceiling (HAProxy's static no-op on the server cores)", ""]
        body = []
        for key in dict.fromkeys(r.get("payload") for r in client):
            w = next((r for r in client if r.get("payload") == key and r["client"] == "wrk"), {})
            o = next((r for r in client if r.get("payload") == key and r["client"] != "wrk"), {})
            conns = f" (c{w['connections']})" if w.get("connections") else ""
            body.append(
                [
                    str(key),
                    fmt_rate(w.get("requests_per_s")) + conns,
                    fmt_ms(w.get("p99_ms")),
                    fmt_rate(o.get("requests_per_s")),
                    fmt_rate(o.get("max_carried_per_s")),
                    fmt_ms(o.get("p99_ms")),
                    _status(w) if w.get("status") != "ok" or not o else _status(o),
                ]
            )
        header = ["payload", "wrk req/s", "wrk p99", "open-loop sustained req/s"]
        header += ["open-loop most carried", "open-loop p99", "status"]
        out += _table(header, body)
        out.append("")
    ceiling = [r for r in rows if r.get("setup") == "in_process"]
    if ceiling:
        out += ["### The model alone (in-process ceiling)", ""]
        body = [
            [
                str(r.get("model")),
                fmt_rate(r.get("ceiling_items_per_s")),
                str(r.get("ceiling_batch") or "-"),
                ", ".join(
                    f"{b}: {fmt_rate(v)}" for b, v in (r.get("items_per_s_by_batch") or {}).items()
                ),
                _status(r) if r.get("status") != "ok" else str(r.get("note") or ""),
            ]
            for r in ceiling
        ]
        out += _table(["model", "best items/s", "batch", "items/s by batch", "notes"], body)
        out.append("")
    for setup, title in SETUP_TITLES.items():
        out += _served_tables(rows, setup, title)
    out += _tokens_table(rows)
    noop = [r for r in rows if r.get("setup") == "ray_serve_noop"]
    if noop:
        out += ["### Plain Ray Serve no-op behind the same HAProxy ingress", ""]
        body = [
            [
                str(r.get("replicas")),
                str(r.get("client")),
                fmt_rate(r.get("requests_per_s")),
                fmt_ms(r.get("p50_ms")),
                fmt_ms(r.get("p99_ms")),
                _errors(r),
                fmt_rate(r.get("client_ceiling_requests_per_s")),
                fmt_x(r.get("client_headroom")),
                _status(r),
            ]
            for r in noop
        ]
        header = ["replicas", "client", "req/s", "p50", "p99", "errors"]
        out += _table([*header, "client ceiling req/s", "headroom", "status"], body)
        out.append("")
    out += _cpu_table(rows)
    flags = list(meta.get("flags") or [])
    if flags:
        out += ["**Flagged:**", ""] + [f"- {f}" for f in flags] + [""]
    elif any(r.get("setup") in rowlib.SERVED and r.get("status") == "ok" for r in rows):
        out += ["Every measured row had at least 3x client headroom.", ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.benchmarks.throughput.render")
    p.add_argument("json", type=Path, help="throughput.json (meta.json beside it is read too)")
    a = p.parse_args(argv)
    rows = json.loads(a.json.read_text())
    meta_path = a.json.with_name("meta.json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else None
    print(render_markdown(rows, meta), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
