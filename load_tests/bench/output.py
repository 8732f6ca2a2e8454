"""The JSON document, the summary table, the plots and the progress line."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from load_tests.bench.run import Progress, RateResult
from load_tests.bench.stats import SCHEMA_VERSION, RateSummary
from load_tests.harness.nvml import MemoryLog
from load_tests.harness.plots import pyplot


def bench_document(
    config: Mapping[str, Any],
    results: Sequence[RateResult],
    memory: MemoryLog | None = None,
    *,
    raw: bool = False,
    max_error_rate: float | None = None,
    run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The bench.json document (see the module docstring of `main` for the layout); ``run``:
    harness.meta.run_meta's provenance fields, first in the document."""
    rates = []
    for res in results:
        entry: dict[str, Any] = {
            **asdict(res.summary),
            "seed": res.seed,
            "started_unix_s": res.started_unix_s,
            "ended_unix_s": res.ended_unix_s,
            "scheduled": res.scheduled,
            "truncated": res.truncated,
        }
        if raw:
            entry["raw"] = [asdict(r) for r in res.records]
        rates.append(entry)
    worst = max((r.summary.error_rate for r in results), default=0.0)
    return {
        **(run or {}),
        "schema_version": SCHEMA_VERSION,
        "created_unix_s": time.time(),
        "config": dict(config),
        "rates": rates,
        "memory": asdict(memory) if memory is not None else {"samples": [], "notes": []},
        "verdict": {
            "max_error_rate": max_error_rate,
            "worst_error_rate": worst,
            "passed": max_error_rate is None or worst <= max_error_rate,
        },
    }


def format_table(summaries: Sequence[RateSummary]) -> str:
    """A fixed-width summary table; latencies printed in ms for readability."""
    head = (
        f"{'offered/s':>10} {'sent':>7} {'ok':>7} {'err%':>7} {'thru/s':>9} {'p50 ms':>9} "
        f"{'p90 ms':>9} {'p95 ms':>9} {'p99 ms':>9} {'max ms':>9} {'lag99 ms':>9}  errors"
    )
    lines = [head, "-" * len(head)]

    def ms(stats: dict[str, float] | None, key: str) -> str:
        return f"{stats[key] * 1e3:9.1f}" if stats else f"{'-':>9}"

    for s in summaries:
        errs = ", ".join(f"{k}={v}" for k, v in s.error_counts.items()) or "-"
        lines.append(
            f"{s.offered_rate_per_s:10.1f} {s.requests:7d} {s.ok:7d} {s.error_rate * 100:6.2f}% "
            f"{s.throughput_per_s:9.2f} {ms(s.latency_s, 'p50')} {ms(s.latency_s, 'p90')} "
            f"{ms(s.latency_s, 'p95')} {ms(s.latency_s, 'p99')} {ms(s.latency_s, 'max')} "
            f"{ms(s.send_lag_s, 'p99')}  {errs}"
        )
    return "\n".join(lines)


def plot_results(
    results: Sequence[RateResult], memory: MemoryLog | None, out_dir: Path, title: str = ""
) -> list[Path]:
    """Write bench.png (throughput, latency, errors vs offered rate) and, when there are memory
    samples, memory.png (per-replica bytes over time, budgets dashed). Returns the paths.
    Raises harness.plots.PlotsUnavailable without matplotlib (the extra ``plots``)."""
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    sums = sorted((r.summary for r in results), key=lambda s: s.offered_rate_per_s)
    x = [s.offered_rate_per_s for s in sums]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax = axes[0]
    ax.plot(x, [s.throughput_per_s for s in sums], "o-", label="achieved (2xx/s)")
    if x:
        ax.plot([0, max(x)], [0, max(x)], "k--", lw=0.8, label="offered")
        # The Poisson draw's own rate, so a point above the diagonal is not a puzzle.
        ax.plot(x, [s.scheduled_rate_per_s for s in sums], "kx", label="scheduled (this draw)")
    ax.set(xlabel="offered rate (req/s)", ylabel="throughput (req/s)", title="Throughput")
    ax.legend()
    ax = axes[1]
    for key in ("p50", "p95", "p99"):
        ys = [s.latency_s[key] if s.latency_s else math.nan for s in sums]
        ax.plot(x, ys, "o-", label=key)
    ax.set(xlabel="offered rate (req/s)", ylabel="latency of 2xx (s)", title="Latency")
    ax.set_yscale("log")
    ax.legend()
    ax = axes[2]
    ax.plot(x, [s.error_rate for s in sums], "o-", color="tab:red")
    ax.set(
        xlabel="offered rate (req/s)", ylabel="error fraction", title="Errors", ylim=(-0.02, 1.02)
    )
    for a in axes:
        a.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    paths.append(out_dir / "bench.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    if memory is not None and memory.samples:
        paths.append(out_dir / "memory.png")
        _plot_memory(plt, results, memory, paths[-1])
    return paths


def _plot_memory(plt: Any, results: Sequence[RateResult], memory: MemoryLog, path: Path) -> None:
    gib = float(1 << 30)
    origin = min([s["t_unix_s"] for s in memory.samples] + [r.started_unix_s for r in results])
    fig, ax = plt.subplots(figsize=(12, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    server: dict[str, list[dict[str, Any]]] = {}
    for s in memory.samples:
        if s.get("source") == "server":
            server.setdefault(str(s.get("replica_id")), []).append(s)
    replica_pids = {s.get("pid") for group in server.values() for s in group}
    for i, (rid, group) in enumerate(sorted(server.items())):
        c = colours[i % len(colours)]
        t = [s["t_unix_s"] - origin for s in group]
        # Prefer what the driver sees for the process; fall back to the allocator's figures.
        field_name = next(
            (
                k
                for k in ("nvml_process_bytes", "reserved_bytes", "peak_reserved_bytes")
                if any(s.get(k) is not None for s in group)
            ),
            None,
        )
        if field_name:
            ys = [(s.get(field_name) or 0) / gib for s in group]
            ax.plot(t, ys, "-", color=c, label=f"{rid[:16]} {field_name}")
        budgets = [(s.get("budget_bytes") or 0) / gib for s in group]
        ax.plot(t, budgets, "--", color=c, lw=1.0, label=f"{rid[:16]} budget")
    nvml: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for s in memory.samples:
        if s.get("source") == "nvml" and s.get("pid") not in replica_pids:
            nvml.setdefault((str(s.get("gpu_uuid")), int(s["pid"])), []).append(s)
    for (uuid, pid), group in sorted(nvml.items()):
        ax.plot(
            [s["t_unix_s"] - origin for s in group],
            [(s.get("used_bytes") or 0) / gib for s in group],
            ":",
            label=f"nvml pid {pid} {uuid[:12]}",
        )
    for r in results:
        ax.axvspan(r.started_unix_s - origin, r.ended_unix_s - origin, alpha=0.06, color="grey")
        ax.text(
            r.started_unix_s - origin,
            0.99,
            f" {r.rate_per_s:g}/s",
            transform=ax.get_xaxis_transform(),
            va="top",
            fontsize=8,
        )
    ax.set(
        xlabel="time since start (s)",
        ylabel="GPU memory (GiB)",
        title="Per-replica GPU memory (dashed: budget)",
    )
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class ProgressPrinter:
    """A dependency-free stderr bar: redrawn in place on a TTY, one line every `every_s` else."""

    def __init__(self, stream: TextIO = sys.stderr, every_s: float = 5.0) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.every_s = every_s
        self._last_line_s = -math.inf

    def __call__(self, p: Progress) -> None:
        frac = min(1.0, p.elapsed_s / p.total_s) if p.total_s > 0 else 1.0
        bar = "#" * int(frac * 30) + "." * (30 - int(frac * 30))
        line = (
            f"[{p.rate_per_s:8.1f}/s] [{bar}] {frac * 100:5.1f}% {p.phase:<7} "
            f"t={p.elapsed_s:6.1f}/{p.total_s:.0f}s sent={p.sent} ok={p.ok} "
            f"err={p.errors} in_flight={p.in_flight}"
        )
        if self.tty:
            self.stream.write("\r" + line + ("\n" if p.phase == "done" else ""))
        elif p.phase == "done" or time.monotonic() - self._last_line_s >= self.every_s:
            self._last_line_s = time.monotonic()
            self.stream.write(line + "\n")
        self.stream.flush()
