"""Render side_by_side.json (from load_tests.side_by_side) as the tables of docs/benchmarks.md,
and redraw its plots.

    python -m load_tests.render_benchmarks docs/results/benchmarks/side_by_side.json
    python -m load_tests.render_benchmarks side_by_side.json --plots docs/results/benchmarks

Prints markdown on stdout. `--plots DIR` writes side_by_side_<model>.png there (useful when the
machine that ran the benchmark had no matplotlib).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

GIB = float(1 << 30)
MODEL_TITLES = {
    "resnet50": "ResNet-50, fp16, one 224 px JPEG per request",
    "minilm": "MiniLM-L6 embeddings, fp16, one short text per request",
}
SETUP_ORDER = ("plain_1", "plain_shared", "serve_app", "plain_1_haproxy", "plain_shared_haproxy")
SETUP_NAMES = {
    "plain_1": "plain Ray Serve, 1 replica, default proxy",
    "plain_shared": "plain Ray Serve, shared GPU, default proxy",
    "serve_app": "serve_app, shared GPU, HAProxy",
    "plain_1_haproxy": "plain Ray Serve, 1 replica, HAProxy",
    "plain_shared_haproxy": "plain Ray Serve, shared GPU, HAProxy",
}


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    if ms < 0.1:
        return f"{seconds * 1e6:.1f} us"
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 1 else f"{ms:.2f} ms"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x" if value >= 0.1 else f"{value:.3f}x"


def fmt_gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def _status(setup: Mapping[str, Any]) -> str:
    status = setup.get("status", "?")
    if status == "ok":
        return "ok"
    err = str(setup.get("error") or "").replace("|", "/").replace("\n", " ")
    return f"{status}: {err[:80]}" if err else str(status)


def _layout(setup: Mapping[str, Any]) -> str:
    n = setup.get("replicas")
    g = setup.get("num_gpus_per_replica")
    return f"{n} x {g:g}" if n and g else "-"


def setup_row(
    key: str, setup: Mapping[str, Any], app_vs: float | None, moderate_rate: float
) -> str:
    best = setup.get("best") or {}
    mod = setup.get("moderate") or {}
    mem = setup.get("memory") or {}
    budgets = [r.get("budget_bytes") for r in mem.get("replicas", []) if r.get("budget_bytes")]
    cells = [
        SETUP_NAMES.get(key, key),
        _layout(setup),
        fmt_rate(best.get("items_per_s", best.get("throughput_per_s"))),
        fmt_ratio(setup.get("vs_ceiling")),
        fmt_ratio(app_vs) if key != "serve_app" else "1.00x",
        fmt_ms(mod.get("p50_s")),
        fmt_ms(mod.get("p99_s")),
        fmt_gib(mem.get("max_peak_nvml_bytes")),
        fmt_gib(max(budgets) if budgets else None),
        _status(setup),
    ]
    return "| " + " | ".join(cells) + " |"


def model_section(name: str, m: Mapping[str, Any]) -> list[str]:
    items = m.get("items", "items")
    rate = float(m.get("moderate_rate_per_s") or 0)
    target = m.get("p99_target_s")
    per_request = int(m.get("inputs_per_request") or 1)
    per = f"{items}/s ({per_request} per request)" if per_request > 1 else "req/s"
    lines = [
        f"### {MODEL_TITLES.get(name, name)}",
        "",
        f"Best sustained = highest throughput with p99 under {fmt_ms(target)} and under 1% "
        f"errors; p50/p99 at {fmt_rate(rate)} requests/s.",
        "",
        f"| setup | replicas x GPU | best sustained {per} | x ceiling | serve_app x this | "
        f"p50 @ {fmt_rate(rate)}/s | p99 @ {fmt_rate(rate)}/s | peak NVML GiB / replica | "
        "share GiB | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ceiling = m.get("ceiling") or {}
    per_batch = ceiling.get("items_per_s") or {}
    if per_batch or ceiling.get("status"):
        shown = ", ".join(f"batch {b}: {fmt_rate(v)}" for b, v in per_batch.items()) or "-"
        peak = ceiling.get("peak_reserved_bytes")
        status = _status(ceiling) if ceiling.get("status") else "-"
        lines.append(
            f"| in-process ceiling ({items}/s; {shown}) | 1 process | "
            f"{fmt_rate(ceiling.get('items_per_s_max'))} | 1.00x | - | - | - | "
            f"{fmt_gib(peak)} (torch reserved) | - | {status} |"
        )
    setups = m.get("setups") or {}
    ratios = m.get("ratios") or {}
    for key in SETUP_ORDER:
        if key in setups:
            lines.append(setup_row(key, setups[key], ratios.get(f"serve_app_vs_{key}"), rate))
    pre = ceiling.get("cpu_preprocess_items_per_s_one_thread")
    if pre:
        lines += [
            "",
            f"One CPU thread decodes/tokenizes about {fmt_rate(pre)} {items}/s of these payloads.",
        ]
    return lines


def noop_section(doc: Mapping[str, Any]) -> list[str]:
    noop = doc.get("noop") or {}
    inproc = noop.get("in_process") or {}
    bare = (doc.get("client") or {}).get("bare_uvicorn_noop") or {}
    rows = [
        ("in-process await of the handler", inproc.get("direct_call_p50_s"), None),
        (
            "in-process ASGI call (httpx ASGITransport, same client code)",
            inproc.get("asgi_in_process_p50_s"),
            inproc.get("asgi_in_process_p99_s"),
        ),
        ("bare uvicorn + Starlette over loopback HTTP", bare.get("p50_s"), bare.get("p99_s")),
        (
            "Ray Serve no-op deployment, default proxy",
            (noop.get("serve_default") or {}).get("p50_s"),
            (noop.get("serve_default") or {}).get("p99_s"),
        ),
        (
            "Ray Serve no-op deployment, HAProxy (serve_app's path)",
            (noop.get("serve_haproxy") or {}).get("p50_s"),
            (noop.get("serve_haproxy") or {}).get("p99_s"),
        ),
    ]
    rate = (doc.get("config") or {}).get("noop_rate")
    lines = [
        "### No-op overhead",
        "",
        f"A POST of `{{}}` at {fmt_rate(rate)} requests/s, same client.",
        "",
        "| path | p50 | p99 |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {fmt_ms(p50)} | {fmt_ms(p99)} |" for name, p50, p99 in rows]
    verdict = noop.get("verdict_haproxy_vs_bare_uvicorn") or {}
    if verdict.get("passed") is not None:
        word = "within" if verdict["passed"] else "OVER"
        lines += [
            "",
            f"Serve + HAProxy adds {fmt_ms(verdict['added_p50_s'])} p50 over bare uvicorn: "
            f"{word} the {fmt_ms(verdict['limit_s'])} limit.",
        ]
    return lines


def client_section(doc: Mapping[str, Any]) -> list[str]:
    client = doc.get("client") or {}
    lines = [
        "### The client's own ceiling",
        "",
        f"{client.get('client_procs', '?')} client processes x "
        f"{client.get('max_connections_per_proc', '?')} connections against a bare uvicorn + "
        f"Starlette no-op server ({client.get('server_workers', '?')} workers).",
        "",
        "| payload | highest throughput req/s | best with p99 under target |",
        "|---|---|---|",
    ]
    for kind in ("image", "embeddings"):
        k = client.get(kind)
        if k:
            best = (k.get("best_sustained") or {}).get("throughput_per_s")
            lines.append(
                f"| {kind} | {fmt_rate(k.get('max_throughput_per_s'))} | {fmt_rate(best)} "
                f"(p99 < {fmt_ms(k.get('p99_target_s'))}) |"
            )
    if client.get("status") == "error":
        lines.append(f"\nClient ceiling failed: {client.get('error')}")
    return lines


def machine_section(doc: Mapping[str, Any]) -> list[str]:
    m = doc.get("machine") or {}
    gpu = m.get("gpu_name") or "no GPU"
    total = m.get("gpu_total_bytes")
    memory = f"{fmt_gib(total)} GiB" if total else "-"
    return [
        "### Machine",
        "",
        "| GPU | memory | driver | torch (CUDA) | Ray | Python | CPUs | client loop |",
        "|---|---|---|---|---|---|---|---|",
        f"| {gpu} | {memory} | {m.get('driver_version') or '-'} | "
        f"{m.get('torch_version')} ({m.get('torch_cuda') or 'cpu'}) | {m.get('ray_version')} | "
        f"{m.get('python')} | {m.get('cpu_count')} | {m.get('client_event_loop')} |",
    ]


def render_markdown(doc: Mapping[str, Any]) -> str:
    """The results tables for docs/benchmarks.md, from a side_by_side.json document."""
    lines = [f"Command: `{doc.get('command', '?')}`", ""]
    lines += machine_section(doc) + [""]
    for name, m in (doc.get("models") or {}).items():
        lines += model_section(name, m) + [""]
    if doc.get("noop"):
        lines += noop_section(doc) + [""]
    if doc.get("client"):
        lines += client_section(doc)
    errors = doc.get("errors") or []
    if errors:
        lines += ["", "### Errors", ""]
        lines += [f"- {e.get('phase', '?')}: {str(e.get('error'))[:300]}" for e in errors]
    total = (doc.get("timings") or {}).get("total_s")
    if total is not None:
        lines += ["", f"Wall time: {total:.0f} s."]
    return "\n".join(lines) + "\n"


def plot_model(
    name: str, m: Mapping[str, Any], path: Path, client: Mapping[str, Any] | None = None
) -> Path:
    """Throughput vs offered rate and p99 vs offered rate, one line per setup."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_p) = plt.subplots(1, 2, figsize=(14, 5.2))
    rates: list[float] = []
    for key in SETUP_ORDER:
        s = (m.get("setups") or {}).get(key)
        if not s or not s.get("sweep"):
            continue
        pts = sorted(s["sweep"], key=lambda p: p["offered_rate_per_s"])
        x = [p["offered_rate_per_s"] for p in pts]
        rates += x
        label = SETUP_NAMES.get(key, key)
        ax_t.plot(x, [p["throughput_per_s"] for p in pts], "o-", label=label)
        ax_p.plot(
            x, [(p.get("latency_s") or {}).get("p99", math.nan) for p in pts], "o-", label=label
        )
    if rates:
        lo, hi = min(rates), max(rates)
        ax_t.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="offered")
    ceiling = (m.get("ceiling") or {}).get("items_per_s_max")
    if ceiling:
        ax_t.axhline(ceiling, color="tab:red", ls=":", label=f"in-process ceiling {ceiling:,.0f}/s")
    kind_client = (client or {}).get(m.get("kind", ""), {}) if client else {}
    if kind_client.get("max_throughput_per_s"):
        c = kind_client["max_throughput_per_s"]
        ax_t.axhline(c, color="grey", ls="-.", label=f"client ceiling {c:,.0f}/s")
    target = m.get("p99_target_s")
    if target:
        ax_p.axhline(target, color="tab:red", ls=":", label=f"p99 target {target * 1e3:g} ms")
    ax_t.set(
        xscale="log",
        yscale="log",
        xlabel="offered rate (req/s)",
        ylabel="throughput (2xx/s)",
        title="Throughput",
    )
    ax_p.set(
        xscale="log",
        yscale="log",
        xlabel="offered rate (req/s)",
        ylabel="p99 latency (s)",
        title="p99 latency",
    )
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for ax in (ax_t, ax_p):
        ax.xaxis.set_major_formatter(plain)
        ax.yaxis.set_major_formatter(plain)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(MODEL_TITLES.get(name, name))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(doc: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """side_by_side_<model>.png for every model in the document."""
    return [
        plot_model(name, m, out_dir / f"side_by_side_{name}.png", doc.get("client"))
        for name, m in (doc.get("models") or {}).items()
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m load_tests.render_benchmarks", description=__doc__.split("\n")[0]
    )
    p.add_argument("json", type=Path, help="side_by_side.json")
    p.add_argument(
        "--plots", type=Path, default=None, help="also write the PNGs into this directory"
    )
    a = p.parse_args(argv)
    doc = json.loads(a.json.read_text())
    print(render_markdown(doc), end="")
    if a.plots is not None:
        for path in plot_all(doc, a.plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
