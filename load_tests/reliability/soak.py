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

``--compare-env KEY=VALUE`` makes the soak an A/B of one run: a second application
(``compare``) beside the first, whose replicas also get that env var, ``--replicas`` split
between them. Their peaks are measured with both loaded at once, twice (alone, each would get
the whole host, and half of each alone peak offered to both overloaded the 2-core CPU host);
both are then offered ``--load-fraction`` of the lower mean peak at once, and the JSON gives
``peaks_rps``, each chunk ``by_application`` and ``verdict_by_application`` beside the whole.
Each ``--variant KEY=VALUE[,KEY=VALUE]`` adds one more such application (``variant1``, ...),
so that several settings share one run; ``--replica-num-gpus`` (0.25) fits more replicas on a
GPU (6 at 0.16: 2 each of three settings).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from load_tests.harness.cluster import APP, Target, add_app, reliability_env, start_cluster
from load_tests.harness.load import Outcome, capacity, open_loop, pct
from load_tests.harness.load import tally as tally_outcomes
from load_tests.harness.meta import PROVENANCE_HELP, run_meta
from load_tests.harness.nvml import BudgetWatch
from load_tests.harness.plots import PlotsUnavailable, pyplot
from load_tests.harness.run import each_at_once
from load_tests.reliability.gpu_faults import (
    actor_options,
    app_args,
    load_shape,
)
from load_tests.reliability.slope import (
    FLAT_BYTES,
    JUDGED,
    METRICS,
    REPORTED,
    SLOPE_TARGET_MIB_PER_H,
    Sample,
    default_warmup_s,
    verdict,
)

NVML_INTERVAL_S = 0.5
COMPARE_APP = "compare"  # --compare-env's application, beside the suite's APP
VARIANT_APP = "variant"  # --variant's applications: variant1, variant2, ...
PEAK_ROUNDS = 2  # with variants: the applications' peaks, all loaded at once, this many times
MB = 1_000_000
HOUR_S = 3600.0
SLOPE_WARMUP_S = 600.0  # --mode slope: Ray's and the replica's start-up growth is over by then


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


def rss_parts(pid: int) -> dict[str, int]:
    """``rss_anon_bytes``, ``rss_file_bytes``, ``rss_shmem_bytes`` of /proc/PID/status ({} where
    it cannot be read)."""
    keys = {
        "RssAnon:": "rss_anon_bytes",
        "RssFile:": "rss_file_bytes",
        "RssShmem:": "rss_shmem_bytes",
    }
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {keys[w[0]]: int(w[1]) * 1024 for w in map(str.split, lines) if w and w[0] in keys}


def smaps_rss(pid: int) -> dict[str, int]:
    """Resident bytes per mapping name of /proc/PID/smaps (a library's path, ``[heap]``,
    ``[anon]`` for nameless mappings), {} where it cannot be read."""
    out: dict[str, int] = {}
    name = "[anon]"
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return {}
    for line in text.splitlines():
        head = line.split(maxsplit=5)
        if head and not head[0].endswith(":"):  # a mapping's first line: range perms ... [path]
            name = head[5].strip() if len(head) == 6 else "[anon]"
        elif head and head[0] == "Rss:":
            out[name] = out.get(name, 0) + int(head[1]) * 1024
    return out


def smaps_growth(first: dict[str, int], last: dict[str, int], top: int = 10) -> list[list[Any]]:
    """The ``top`` mappings whose resident bytes changed most between two smaps_rss readings,
    as [name, bytes then, bytes now, change], the largest change first."""
    names = set(first) | set(last)
    changes = [(n, first.get(n, 0), last.get(n, 0)) for n in names]
    rows: list[list[Any]] = [[n, a, b, b - a] for n, a, b in changes if b != a]
    return sorted(rows, key=lambda r: -abs(r[3]))[:top]


class Sampler:
    """Every ``interval_s`` in a thread, a row per live replica process of GET /v1/memory; from
    ``smaps_after_s`` on, each replica's smaps once then (``smaps_first``) and every
    SMAPS_EVERY_S after (``smaps_last``), so that the doc can say which mappings grew."""

    SMAPS_EVERY_S = 60.0

    def __init__(
        self,
        memory_url: str,
        interval_s: float,
        watch: BudgetWatch | None,
        smaps_after_s: float | None = None,
    ):
        self.memory_url, self.interval_s, self.watch = memory_url, interval_s, watch
        self.smaps_after_s = smaps_after_s
        self.t0 = time.monotonic()
        self.rows: list[Sample] = []
        self.replica_ids: dict[int, str] = {}
        self.notes: list[str] = []
        self.smaps_first: dict[int, tuple[float, dict[str, int]]] = {}
        self.smaps_last: dict[int, tuple[float, dict[str, int]]] = {}
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
            row["application"] = rep.get("application")  # with variants, judged per application
            self.rows.append({**row, "reserved_bytes": rep.get("reserved_bytes"), **rss_parts(pid)})
            self._smaps(pid, t_s)

    def _smaps(self, pid: int, t_s: float) -> None:
        if self.smaps_after_s is None or t_s < self.smaps_after_s:
            return
        if pid not in self.smaps_first:
            self.smaps_first[pid] = (t_s, smaps_rss(pid))
        elif t_s - self.smaps_last.get(pid, self.smaps_first[pid])[0] >= self.SMAPS_EVERY_S:
            self.smaps_last[pid] = (t_s, smaps_rss(pid))

    def growth(self) -> dict[str, Any]:
        """Per replica, the mappings whose resident bytes changed most since the warm-up."""
        out: dict[str, Any] = {}
        for pid, (t_last, last) in sorted(self.smaps_last.items()):
            t_first, first = self.smaps_first[pid]
            out[str(pid)] = {
                "from_t_s": t_first,
                "to_t_s": t_last,
                "top": smaps_growth(first, last),
            }
        return out

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
        apps = {r["pid"]: r.get("application") for r in rows}
        for pid in sorted(apps):
            pts = [(r["t_s"], r[f"{m}_bytes"] / MB) for r in rows if r["pid"] == pid]
            pts = [p for p in pts if p[1] is not None]
            label = f"pid {pid}" + (f" ({apps[pid]})" if len(set(apps.values())) > 1 else "")
            ax.plot([t for t, _ in pts], [y for _, y in pts], marker=".", label=label)
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
        parts = [f"pid {e['pid']} ({e['samples_judged']} samples, {e.get('judged_s', 0)} s)"]
        for m in METRICS + REPORTED:
            spread, slope = e[f"{m}_spread_bytes"], e[f"{m}_slope_mib_per_h"]
            if spread is not None:
                err = e[f"{m}_slope_stderr_mib_per_h"]
                pm = "" if err is None else f" +- {err:.2f}"
                parts.append(f"{m} spread {spread / MB:.1f} MB slope {slope:+.2f}{pm} MiB/h")
        print("  " + ", ".join(parts))
    if v["replaced"]:
        print(f"  replicas replaced: appeared {v['appeared']}, gone {v['gone']}")
    print(
        f"flat (every spread <= {v['flat_bytes'] / MB:g} MB after {v['warmup_s']:g} s): {v['flat']}"
    )
    print(
        f"slope_ok (every slope <= {v['slope_target_mib_per_h']:g} MiB/h per replica): "
        f"{v['slope_ok']} (max {v['max_slope_mib_per_h']})"
    )


# ---- the command ---------------------------------------------------------------------------


def extra_env(a: argparse.Namespace) -> dict[str, str]:
    """The replicas' env_vars beyond the suite's: --replica-env, then tracemalloc's."""
    out = dict(kv.split("=", 1) for kv in a.replica_env)
    if a.tracemalloc_dir is None:
        return out
    from load_tests.reliability import tracemem

    return out | tracemem.replica_env(
        a.tracemalloc_dir, a.tracemalloc_start_s, a.tracemalloc_every_s, a.tracemalloc_frames
    )


def compare_env(a: argparse.Namespace) -> dict[str, str]:
    """--compare-env's env vars, which only COMPARE_APP's replicas get."""
    return dict(kv.split("=", 1) for kv in a.compare_env)


def variants(a: argparse.Namespace) -> dict[str, dict[str, str]]:
    """The applications beside APP and the env vars only their replicas get: COMPARE_APP for
    --compare-env, then variant1, variant2, ... for each --variant."""
    out = {COMPARE_APP: compare_env(a)} if a.compare_env else {}
    for i, spec in enumerate(a.variant, 1):
        out[f"{VARIANT_APP}{i}"] = dict(kv.split("=", 1) for kv in spec.split(","))
    return out


def split_replicas(replicas: int, others: Sequence[str] = ()) -> dict[str, int]:
    """Replicas per application: all in APP, or shared as evenly as they go between APP and
    ``others`` (APP first to get fewer when they do not divide)."""
    names = [APP, *others]
    each, extra = divmod(replicas, len(names))
    return {n: each + (1 if i >= len(names) - extra else 0) for i, n in enumerate(names)}


def lowest_peak(peaks: dict[str, list[float]]) -> float:
    """The lowest of the applications' mean peaks: with variants every one is offered the same
    fraction of it, so that they all carry the same load."""
    return min(sum(v) / len(v) for v in peaks.values())


def by_application(rows: list[Sample]) -> dict[str, list[Sample]]:
    """The sample rows of each application (``application`` of the replica's report)."""
    out: dict[str, list[Sample]] = {}
    for r in rows:
        out.setdefault(str(r.get("application")), []).append(r)
    return out


def measure_peaks(
    targets: dict[str, Target], seconds: float, body: dict[str, Any], clients: int
) -> dict[str, list[float]]:
    """Each application's closed-loop peak: once with one application; with several, all of
    them loaded at once (they share the host's cores and GPU, as they do in the soak, where
    each is offered its share), after one such window not counted, PEAK_ROUNDS times."""
    if len(targets) == 1:
        ((name, target),) = targets.items()
        return {name: [round(capacity(target, seconds, body=body, clients=clients), 1)]}
    peaks: dict[str, list[float]] = {name: [] for name in targets}

    def at_once(window_s: float) -> dict[str, float]:
        return each_at_once(lambda t: capacity(t, window_s, body=body, clients=clients), targets)

    at_once(min(seconds, 3.0))  # not counted: none pays its first batches in a counted window
    for _ in range(PEAK_ROUNDS):
        for name, rps in at_once(seconds).items():
            peaks[name].append(round(rps, 1))
    return peaks


def open_loops(
    targets: dict[str, Target], rate: float, seconds: float, body: dict[str, Any], processes: int
) -> dict[str, list[Outcome]]:
    """One open-loop chunk at ``rate`` against each application, all at once."""
    out = each_at_once(lambda t: open_loop(t.url, rate, seconds, body, processes), targets)
    missing = set(targets) - set(out)
    if missing:
        raise RuntimeError(f"the open loop against {sorted(missing)} failed (see above)")
    return out


def tracing_wait_s(a: argparse.Namespace) -> float:
    """How long to wait after the deploy before measuring the peak: with tracemalloc tracing
    frames, until it has started in every replica, so that the offered load is a fraction of
    what traced replicas carry (measured untraced, it overloaded them: journal 2026-12-03)."""
    if a.tracemalloc_dir is None or a.tracemalloc_frames <= 0:
        return 0.0
    return a.tracemalloc_start_s + 5.0


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the finally below shuts Ray down


PROG = "python -m load_tests.reliability.soak"


def soak_args(a: argparse.Namespace) -> dict[str, Any]:
    """The suite's app args; with ``--encoder-layers``, MiniLM at that depth (dummy weights)."""
    args = app_args(a.device)
    if a.encoder_layers is not None:
        from load_tests.benchmarks.throughput.setups import layered_minilm_dir

        args["model_path"] = str(layered_minilm_dir(a.encoder_layers))
    return args


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n")[0], epilog=PROVENANCE_HELP
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--mode",
        choices=("flat", "slope"),
        default="flat",
        help="flat: judge spreads (default 1800 s); slope: judge slopes against "
        "--slope-target-mib-per-h (default 3600 s, warm-up 600 s)",
    )
    p.add_argument("--duration-s", type=float, default=None, help="the soak's wall clock")
    p.add_argument("--out", type=Path, default=Path("soak.json"))
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--load-fraction", type=float, default=0.5, help="of the measured peak")
    p.add_argument("--peak-s", type=float, default=8.0, help="the closed loop measuring peak")
    p.add_argument("--chunk-s", type=float, default=30.0, help="open-loop chunk; JSON after each")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--warmup-s", type=float, default=None, help="default 10%% of it, >= 30 s")
    p.add_argument("--flat-bytes", type=int, default=FLAT_BYTES, help="100 MB = 100_000_000")
    p.add_argument("--slope-target-mib-per-h", type=float, default=SLOPE_TARGET_MIB_PER_H)
    p.add_argument("--no-plot", action="store_true", help="no PNG beside the JSON")
    tm_help = "tracemalloc snapshots of each replica there (load_tests.reliability.tracemem)"
    p.add_argument("--tracemalloc-dir", type=Path, default=None, help=tm_help)
    p.add_argument("--tracemalloc-start-s", type=float, default=120.0)
    p.add_argument("--tracemalloc-every-s", type=float, default=300.0)
    p.add_argument("--tracemalloc-frames", type=int, default=12, help="0: malloc stats only")
    p.add_argument(
        "--encoder-layers",
        type=int,
        default=None,
        help="MiniLM with this many encoder layers (dummy weights); 0 makes the forward nearly "
        "free, so a CPU soak serves many more requests an hour: a leak per request shows sooner",
    )
    env_help = "an env var for the replicas (e.g. MALLOC_ARENA_MAX=2); repeatable"
    p.add_argument("--replica-env", action="append", default=[], type=_key_value, help=env_help)
    variant_help = (
        "like --compare-env, one more application per use, whose replicas get these env vars "
        "(KEY=VALUE[,KEY=VALUE...]): variant1, variant2, ..."
    )
    p.add_argument("--variant", action="append", default=[], type=_key_values, help=variant_help)
    gpus_help = "each replica's num_gpus (default 0.25): lower it to fit more replicas on a GPU"
    p.add_argument("--replica-num-gpus", type=float, default=None, help=gpus_help)
    compare_help = (
        "A/B in one run: a second application whose replicas also get this env var "
        "(repeatable); --replicas is split between the two, their peaks are measured with both "
        f"loaded at once, {PEAK_ROUNDS} times, and both are offered --load-fraction of the lower "
        "mean peak at once; the verdict is also given per application"
    )
    p.add_argument("--compare-env", action="append", default=[], type=_key_value, help=compare_help)
    return p


def _key_values(text: str) -> str:
    for kv in text.split(","):
        _key_value(kv)
    return text


def _key_value(text: str) -> str:
    if "=" not in text or not text.split("=", 1)[0]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, with --mode's defaults filled in (duration, warm-up)."""
    a = parser().parse_args(argv)
    if a.encoder_layers is not None and a.encoder_layers < 0:
        parser().error(f"--encoder-layers {a.encoder_layers} must be >= 0")
    if a.replicas < (apps := 1 + len(variants(a))):
        parser().error(f"--replicas {a.replicas}: at least one per application ({apps})")
    if a.replica_num_gpus is not None and not 0 < a.replica_num_gpus <= 1:
        parser().error(f"--replica-num-gpus {a.replica_num_gpus} must be in (0, 1]")
    if a.replica_num_gpus is not None and a.device == "cpu":
        parser().error("--replica-num-gpus is for --device cuda (CPU replicas take no GPU)")
    if a.duration_s is None:
        a.duration_s = HOUR_S if a.mode == "slope" else 1800.0
    if a.warmup_s is None:
        a.warmup_s = SLOPE_WARMUP_S if a.mode == "slope" else default_warmup_s(a.duration_s)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    warmup_s = a.warmup_s
    others = variants(a)  # the applications beside APP, and their replicas' extra env vars
    from serve_app.ops import launch

    gpus = launch.gpu_count() if a.device == "cuda" else 0
    if a.device == "cuda" and gpus == 0:
        parser().error("--device cuda, but this machine has no CUDA GPU (use --device cpu)")
    body, processes, clients = load_shape(a.device)
    meta: dict[str, Any] = {
        **run_meta(PROG, argv),
        "device": a.device,
        "cores": os.cpu_count(),
        "cli": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        "replicas": a.replicas,
        "replicas_by_application": split_replicas(a.replicas, list(others)),
        "compare_env": compare_env(a),
        "variants": others,
        "args": soak_args(a),
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
        judge = (warmup_s, a.flat_bytes, a.slope_target_mib_per_h)
        apps = by_application(rows) if others else {}
        # the budget verdict so far on every write: a soak cut short keeps it
        memory = {"memory": watch.so_far()} if watch is not None and "memory" not in meta else {}
        return {
            **meta,
            **memory,
            "complete": complete,
            "took_s": round(time.monotonic() - t0, 1),
            "totals": totals,
            "verdict": verdict(rows, *judge),
            "verdict_by_application": {k: verdict(v, *judge) for k, v in sorted(apps.items())},
            "chunks": chunks,
            "replica_ids": {str(pid): rid for pid, rid in pids.items()},
            "sampler_notes": sampler.notes[:50] if sampler else [],
            # [mapping, resident bytes at the end of warm-up, at the last reading, change]
            "smaps_growth": sampler.growth() if sampler else {},
            "samples": rows,
        }

    signal.signal(signal.SIGTERM, _sigterm)
    try:
        # The suite's cluster (gpu_faults.start_suite_cluster), with the replicas' extra env
        # vars and the model depth this soak was given.
        opts = actor_options(a.device)
        opts["runtime_env"]["env_vars"].update(extra_env(a))
        if a.replica_num_gpus is not None:
            opts["num_gpus"] = a.replica_num_gpus
        n_cpus = max(8, a.replicas * 2)
        counts = meta["replicas_by_application"]
        target = start_cluster(counts[APP], meta["args"], opts, gpus, n_cpus, 240.0)
        targets = {APP: target}
        for name, more in others.items():  # the same app beside it, with env vars added
            env = {**opts["runtime_env"]["env_vars"], **more}
            opts_b = {**opts, "runtime_env": {**opts["runtime_env"], "env_vars": env}}
            targets[name] = add_app(target, name, counts[name], meta["args"], opts_b, 240.0)
        meta["startup_s"] = round(time.monotonic() - t0, 1)
        meta["reliability_env"] = reliability_env()
        memory_url = f"{target.base}/v1/memory"
        if a.device == "cuda":
            watch = BudgetWatch(memory_url, interval_s=NVML_INTERVAL_S).start()
        if (wait_s := tracing_wait_s(a)) > 0:
            print(f"waiting {wait_s:.0f} s for tracemalloc to start in the replicas", flush=True)
            time.sleep(wait_s)
        peaks = measure_peaks(targets, a.peak_s, body, clients)
        peak = lowest_peak(peaks)
        rate = max(1.0, a.load_fraction * peak)
        meta.update({"peak_rps": round(peak, 1), "rate_rps": round(rate, 1)})
        if len(targets) > 1:
            meta["peaks_rps"] = peaks
        each = " each" if len(targets) > 1 else ""
        print(
            f"deployed in {meta['startup_s']} s; peak {peak:.1f} req/s, soak at {rate:.1f}{each}"
            + (f" (peaks, all loaded at once: {peaks})" if len(targets) > 1 else ""),
            flush=True,
        )
        sampler = Sampler(memory_url, a.sample_s, watch, smaps_after_s=warmup_s).start()
        while (left_s := a.duration_s - (time.monotonic() - sampler.t0)) > 1.0:
            start_s, chunk_s = time.monotonic() - sampler.t0, min(a.chunk_s, left_s)
            by_app = open_loops(targets, rate, chunk_s, body, processes)
            wall_s = time.monotonic() - sampler.t0 - start_s
            # The last send is at (n - 1) / rate: keep the schedule (no short chunk after it).
            time.sleep(max(0.0, chunk_s - wall_s))
            outcomes = [o for part in by_app.values() for o in part]
            chunks.append(chunk_stats(outcomes, start_s, chunk_s, wall_s))
            if len(targets) > 1:
                chunks[-1]["by_application"] = {
                    k: chunk_stats(v, start_s, chunk_s, wall_s) for k, v in by_app.items()
                }
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
        final = doc()
        write(a.out, final)
    v = final["verdict"]
    if (
        not a.no_plot
        and sampler is not None
        and plot(a.out.with_suffix(".png"), sampler.rows, warmup_s)
    ):
        print(f"plotted {a.out.with_suffix('.png')}")
    totals = final["totals"]
    print(f"rate {meta['rate_rps']} req/s (peak {meta['peak_rps']}); {totals}")
    violations = meta.get("memory", {}).get("budget_violations", 0)
    if watch is not None:
        m = meta["memory"]
        print(f"budget violations: {violations} in {m['nvml_samples_judged']} NVML samples")
    print_verdict(v)
    for name, app_v in final["verdict_by_application"].items():
        env = others.get(name, "its env as given")
        print(f"application {name} ({env}):")
        print_verdict(app_v)
    print(f"wrote {a.out} in {round(time.monotonic() - t0, 1)} s")
    judged = v["slope_ok"] if a.mode == "slope" else v["flat"]
    return 0 if judged and totals["lost"] == 0 and not violations else 1


if __name__ == "__main__":
    sys.exit(main())
