"""Soak, one command: 4 replicas sharing one GPU at half their peak load, replica memory sampled
(issue 12, item 8: memory stays flat within 100 MB after warm-up).

    python -m load_tests.reliability.soak --device cuda --duration-s 1800 --out soak.json  # ~32 min
    python -m load_tests.reliability.soak --device cpu --duration-s 120 --out /tmp/soak.json

(~32 minutes on an H200; ~3 minutes on 2 CPU cores.) The cluster is gpu_faults' (the harness's
start_cluster with gpu_faults.app_args and actor_options: MiniLM, load_format dummy, float16,
num_gpus 0.25 each on a GPU). Peak: harness.load.capacity, a closed loop for ``--peak-s``, with
gpu_faults.load_shape (64 long texts a request from 4 client processes on a GPU, so that the
server and not the client is the limit). The soak offers ``--load-fraction`` (0.5) of that peak
with harness.load.open_loop, in chunks of ``--chunk-s`` (30 s)
for ``--duration-s`` of wall clock (a chunk's stragglers included); the JSON at ``--out`` is
rewritten after each chunk, so a run cut short keeps what it measured.

Every ``--sample-s`` (5 s), one row per replica process in GET /v1/memory (by pid): its RSS
(psutil), its NVML used bytes (the latest sample of a BudgetWatch, which also judges every
NVML sample against the replica's budget_bytes; null on a CPU) and the report's reserved_bytes
(torch's caching allocator). A replica replaced mid-soak shows as a pid that appears or goes.

Verdict (``verdict``, pure): each replica's rows from ``--warmup-s`` (10% of the duration, at
least 30 s) after its first row (a replacement warms up too); per replica the spread (max - min)
and the least-squares slope (bytes per minute) of RSS, NVML and reserved bytes. ``flat``: every
RSS and NVML spread <= ``--flat-bytes``, 100_000_000 by default (the issue's 100 MB, decimal);
None when no replica had two rows after its warm-up. Exit 0 when flat, nothing lost and no
budget violation. Only 127.0.0.1 is targeted; every wait is bounded; Ray is shut down on error,
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from load_tests.harness.cluster import reliability_env
from load_tests.harness.load import Outcome, capacity, open_loop, pct
from load_tests.harness.load import tally as tally_outcomes
from load_tests.harness.meta import PROVENANCE_HELP, run_meta
from load_tests.harness.nvml import BudgetWatch
from load_tests.harness.plots import PlotsUnavailable, pyplot
from load_tests.reliability.gpu_faults import (
    actor_options,
    app_args,
    load_shape,
    start_suite_cluster,
)

FLAT_BYTES = 100_000_000  # the "100 MB", decimal
JUDGED = ("rss", "nvml")  # what `flat` is about; reserved is reported beside them
METRICS = ("rss", "nvml", "reserved")
NVML_INTERVAL_S = 0.5
MB = 1_000_000

Sample = dict[str, Any]  # {"t_s", "pid", "rss_bytes", "nvml_bytes", "reserved_bytes"}


# ---- the verdict (pure) --------------------------------------------------------------------


def default_warmup_s(duration_s: float) -> float:
    return max(30.0, 0.1 * duration_s)


def after_warmup(rows: Iterable[Sample], warmup_s: float) -> dict[int, list[Sample]]:
    """Each replica's rows (by pid, in time order) from ``warmup_s`` after its first row."""
    by_pid: dict[int, list[Sample]] = {}
    for r in sorted(rows, key=lambda r: r["t_s"]):
        by_pid.setdefault(int(r["pid"]), []).append(r)
    return {
        pid: [r for r in rs if r["t_s"] >= rs[0]["t_s"] + warmup_s] for pid, rs in by_pid.items()
    }


def slope_per_min(points: list[tuple[float, int]]) -> float | None:
    """Least-squares slope of (seconds, bytes) points, in bytes per minute."""
    if len(points) < 2:
        return None
    t_mean = sum(t for t, _ in points) / len(points)
    y_mean = sum(y for _, y in points) / len(points)
    den = sum((t - t_mean) ** 2 for t, _ in points)
    if den == 0:
        return None
    return 60.0 * sum((t - t_mean) * (y - y_mean) for t, y in points) / den


def metric_stats(rows: list[Sample], metric: str) -> dict[str, int | None]:
    """``{metric}_min/max/spread_bytes`` and ``{metric}_slope_bytes_per_min`` over the rows
    that have it (spread and slope need two)."""
    points = [
        (r["t_s"], int(r[f"{metric}_bytes"])) for r in rows if r.get(f"{metric}_bytes") is not None
    ]
    values = [y for _, y in points]
    slope = slope_per_min(points)
    return {
        f"{metric}_min_bytes": min(values, default=None),
        f"{metric}_max_bytes": max(values, default=None),
        f"{metric}_spread_bytes": max(values) - min(values) if len(values) >= 2 else None,
        f"{metric}_slope_bytes_per_min": None if slope is None else round(slope),
    }


def replacements(rows: list[Sample]) -> dict[str, Any]:
    """Replicas (pids) that appeared after the first row or were gone before the last one."""
    spans = {pid: (rs[0]["t_s"], rs[-1]["t_s"]) for pid, rs in after_warmup(rows, 0.0).items()}
    first_t = min((lo for lo, _ in spans.values()), default=0.0)
    last_t = max((hi for _, hi in spans.values()), default=0.0)
    appeared = [{"pid": p, "first_t_s": lo} for p, (lo, _) in sorted(spans.items()) if lo > first_t]
    gone = [{"pid": p, "last_t_s": hi} for p, (_, hi) in sorted(spans.items()) if hi < last_t]
    return {"replaced": bool(appeared or gone), "appeared": appeared, "gone": gone}


def verdict(rows: list[Sample], warmup_s: float, flat_bytes: int = FLAT_BYTES) -> dict[str, Any]:
    """Per replica, spreads and slopes after its warm-up; ``flat`` when every judged spread is
    within ``flat_bytes`` (None: nothing to judge)."""
    replicas = []
    for pid, rs in sorted(after_warmup(rows, warmup_s).items()):
        entry: dict[str, Any] = {"pid": pid, "samples_judged": len(rs)}
        for metric in METRICS:
            entry.update(metric_stats(rs, metric))
        replicas.append(entry)
    spreads = [
        e[f"{m}_spread_bytes"]
        for e in replicas
        for m in JUDGED
        if e[f"{m}_spread_bytes"] is not None
    ]
    return {
        "warmup_s": warmup_s,
        "flat_bytes": flat_bytes,
        "flat": all(s <= flat_bytes for s in spreads) if spreads else None,
        "max_spread_bytes": max(spreads, default=None),
        "not_judged_pids": [e["pid"] for e in replicas if e["samples_judged"] < 2],
        **replacements(rows),
        "replicas": replicas,
    }


def chunk_stats(
    outcomes: list[Outcome], start_s: float, duration_s: float, wall_s: float
) -> dict[str, Any]:
    """One open-loop chunk: sent, ok, failed, lost (as harness.load.tally counts them), accepted
    p50/p99."""
    lost, failed, statuses = tally_outcomes([(s, c) for s, c, _ in outcomes])
    ok_s = sorted(t for s, _, t in outcomes if s == 200)
    return {
        "start_s": round(start_s, 1),
        "duration_s": round(duration_s, 1),
        "wall_s": round(wall_s, 1),
        "sent": len(outcomes),
        "ok": len(ok_s),
        "failed": failed,
        "lost": lost,
        "statuses": statuses,
        "accepted_p50_s": pct(ok_s, 0.50),
        "accepted_p99_s": pct(ok_s, 0.99),
    }


def latest_nvml(samples: list[dict[str, Any]], since_unix_s: float) -> dict[int, int]:
    """The newest NVML used bytes of each pid among MemorySampler ``samples`` since then."""
    out: dict[int, int] = {}
    for s in reversed(samples[-512:]):  # a slice: the sampler thread appends meanwhile
        if s["t_unix_s"] < since_unix_s:
            break
        if s.get("source") == "nvml" and s.get("used_bytes") is not None:
            out.setdefault(int(s["pid"]), int(s["used_bytes"]))
    return out


# ---- sampling (I/O) ------------------------------------------------------------------------


class Sampler:
    """Every ``interval_s`` in a thread, a row per live replica process of GET /v1/memory."""

    def __init__(self, memory_url: str, interval_s: float, watch: BudgetWatch | None):
        self.memory_url, self.interval_s, self.watch = memory_url, interval_s, watch
        self.t0 = time.monotonic()
        self.rows: list[Sample] = []
        self.replica_ids: dict[int, str] = {}
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def tick(self) -> None:
        import psutil

        try:
            resp = httpx.get(self.memory_url, timeout=min(10.0, self.interval_s))
            reports = resp.json()["replicas"]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            self.notes.append(f"t {time.monotonic() - self.t0:.1f} s: {type(exc).__name__}")
            return
        t_s = round(time.monotonic() - self.t0, 2)
        nvml = {}
        if self.watch is not None:
            nvml = latest_nvml(self.watch.sampler.log.samples, time.time() - 4 * NVML_INTERVAL_S)
        for rep in reports:
            pid = int(rep["pid"])
            try:
                rss = int(psutil.Process(pid).memory_info().rss)
            except psutil.Error:  # gone: a dead replica's report lingers a few seconds
                continue
            self.replica_ids[pid] = str(rep.get("replica_id"))
            row = {"t_s": t_s, "pid": pid, "rss_bytes": rss, "nvml_bytes": nvml.get(pid)}
            self.rows.append({**row, "reserved_bytes": rep.get("reserved_bytes")})

    def _run(self) -> None:
        while True:
            self.tick()
            if self._stop.wait(self.interval_s):
                break

    def start(self) -> Sampler:
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=20.0)


# ---- output --------------------------------------------------------------------------------


def write(path: Path, doc: dict[str, Any]) -> None:
    """The JSON, with one line per sample row (30 minutes of 4 replicas is ~1,500 rows)."""
    rows = ",\n    ".join(json.dumps(r) for r in doc["samples"])
    text = json.dumps({**doc, "samples": "@ROWS@"}, indent=2)
    text = text.replace('"@ROWS@"', f"[\n    {rows}\n  ]" if rows else "[]")
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def plot(path: Path, rows: list[Sample], warmup_s: float) -> bool:
    """RSS and NVML bytes per replica over time; False (and why, on stderr) without
    matplotlib or without samples."""
    try:
        plt = pyplot()
    except PlotsUnavailable as exc:
        print(f"no plot: {exc}", file=sys.stderr)
        return False
    metrics = [m for m in JUDGED if any(r.get(f"{m}_bytes") is not None for r in rows)]
    if not metrics:
        return False
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 2.6 * len(metrics)), sharex=True)
    for ax, m in zip(fig.axes, metrics, strict=True):
        for pid in sorted({r["pid"] for r in rows}):
            pts = [(r["t_s"], r[f"{m}_bytes"] / MB) for r in rows if r["pid"] == pid]
            pts = [p for p in pts if p[1] is not None]
            ax.plot([t for t, _ in pts], [y for _, y in pts], marker=".", label=f"pid {pid}")
        ax.axvline(warmup_s, color="grey", linestyle="--", linewidth=1)
        ax.set_ylabel(f"{m.upper()} (MB)")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=7, loc="best")
    fig.axes[0].set_title("replica memory during the soak (dashed: end of warm-up)")
    fig.axes[-1].set_xlabel("seconds since the soak began")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def print_verdict(v: dict[str, Any]) -> None:
    for e in v["replicas"]:
        parts = [f"pid {e['pid']} ({e['samples_judged']} samples)"]
        for m in METRICS:
            spread, slope = e[f"{m}_spread_bytes"], e[f"{m}_slope_bytes_per_min"]
            if spread is not None:
                parts.append(f"{m} spread {spread / MB:.1f} MB slope {slope / MB:+.2f} MB/min")
        print("  " + ", ".join(parts))
    if v["replaced"]:
        print(f"  replicas replaced: appeared {v['appeared']}, gone {v['gone']}")
    print(
        f"flat (every spread <= {v['flat_bytes'] / MB:g} MB after {v['warmup_s']:g} s): {v['flat']}"
    )


# ---- the command ---------------------------------------------------------------------------


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the finally below shuts Ray down


PROG = "python -m load_tests.reliability.soak"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n")[0], epilog=PROVENANCE_HELP
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--duration-s", type=float, default=1800.0, help="the soak's wall clock")
    p.add_argument("--out", type=Path, default=Path("soak.json"))
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--load-fraction", type=float, default=0.5, help="of the measured peak")
    p.add_argument("--peak-s", type=float, default=8.0, help="the closed loop measuring peak")
    p.add_argument("--chunk-s", type=float, default=30.0, help="open-loop chunk; JSON after each")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--warmup-s", type=float, default=None, help="default 10%% of it, >= 30 s")
    p.add_argument("--flat-bytes", type=int, default=FLAT_BYTES, help="100 MB = 100_000_000")
    p.add_argument("--no-plot", action="store_true", help="no PNG beside the JSON")
    a = p.parse_args(argv)
    warmup_s = a.warmup_s if a.warmup_s is not None else default_warmup_s(a.duration_s)
    from serve_app.ops import launch

    gpus = launch.gpu_count() if a.device == "cuda" else 0
    if a.device == "cuda" and gpus == 0:
        p.error("--device cuda, but this machine has no CUDA GPU (use --device cpu)")
    body, processes, clients = load_shape(a.device)
    meta: dict[str, Any] = {
        **run_meta(PROG, argv),
        "device": a.device,
        "cores": os.cpu_count(),
        "cli": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        "replicas": a.replicas,
        "args": app_args(a.device),
        "actor_options": actor_options(a.device),
        "load": {
            "items_per_request": len(body["input"]),
            "processes": processes,
            "clients": clients,
        },
        "started_unix_s": round(time.time(), 1),
    }
    chunks: list[dict[str, Any]] = []
    sampler: Sampler | None = None
    watch: BudgetWatch | None = None
    complete = False
    t0 = time.monotonic()

    def doc() -> dict[str, Any]:
        rows = sampler.rows if sampler else []
        totals = {k: sum(c[k] for c in chunks) for k in ("sent", "ok", "failed", "lost")}
        pids = sampler.replica_ids if sampler else {}
        return {
            **meta,
            "complete": complete,
            "took_s": round(time.monotonic() - t0, 1),
            "totals": totals,
            "verdict": verdict(rows, warmup_s, a.flat_bytes),
            "chunks": chunks,
            "replica_ids": {str(pid): rid for pid, rid in pids.items()},
            "sampler_notes": sampler.notes[:50] if sampler else [],
            "samples": rows,
        }

    signal.signal(signal.SIGTERM, _sigterm)
    try:
        target = start_suite_cluster(a.device, a.replicas, gpus, 240.0)
        meta["startup_s"] = round(time.monotonic() - t0, 1)
        meta["reliability_env"] = reliability_env()
        memory_url = f"{target.base}/v1/memory"
        if a.device == "cuda":
            watch = BudgetWatch(memory_url, interval_s=NVML_INTERVAL_S).start()
        peak = capacity(target, a.peak_s, body=body, clients=clients)
        rate = max(1.0, a.load_fraction * peak)
        meta.update({"peak_rps": round(peak, 1), "rate_rps": round(rate, 1)})
        print(
            f"deployed in {meta['startup_s']} s; peak {peak:.1f} req/s, soak at {rate:.1f}",
            flush=True,
        )
        sampler = Sampler(memory_url, a.sample_s, watch).start()
        while (left_s := a.duration_s - (time.monotonic() - sampler.t0)) > 1.0:
            start_s, chunk_s = time.monotonic() - sampler.t0, min(a.chunk_s, left_s)
            outcomes = open_loop(target.url, rate, chunk_s, body, processes)
            wall_s = time.monotonic() - sampler.t0 - start_s
            # The last send is at (n - 1) / rate: keep the schedule (no short chunk after it).
            time.sleep(max(0.0, chunk_s - wall_s))
            chunks.append(chunk_stats(outcomes, start_s, chunk_s, wall_s))
            write(a.out, doc())
            c = chunks[-1]
            print(
                f"t {start_s:6.0f} s: sent {c['sent']} ok {c['ok']} failed {c['failed']} "
                f"lost {c['lost']} p50 {c['accepted_p50_s']} s p99 {c['accepted_p99_s']} s",
                flush=True,
            )
        complete = True
    finally:
        if sampler is not None:
            sampler.stop()
        if watch is not None:
            meta["memory"] = watch.stop()
        launch.shutdown()
        write(a.out, doc())
    v = doc()["verdict"]
    if (
        not a.no_plot
        and sampler is not None
        and plot(a.out.with_suffix(".png"), sampler.rows, warmup_s)
    ):
        print(f"plotted {a.out.with_suffix('.png')}")
    totals = doc()["totals"]
    print(f"rate {meta['rate_rps']} req/s (peak {meta['peak_rps']}); {totals}")
    violations = meta.get("memory", {}).get("budget_violations", 0)
    if watch is not None:
        m = meta["memory"]
        print(f"budget violations: {violations} in {m['nvml_samples_judged']} NVML samples")
    print_verdict(v)
    print(f"wrote {a.out} in {round(time.monotonic() - t0, 1)} s")
    return 0 if v["flat"] and totals["lost"] == 0 and not violations else 1


if __name__ == "__main__":
    sys.exit(main())
