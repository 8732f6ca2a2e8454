"""The open-loop client: asyncio (on uvloop when present) with a lean HTTP/1.1 client
(load_tests.harness.rawhttp) in several processes, each pinned to one client core, sending at a
fixed Poisson (or constant) rate.

Each request is sent at its scheduled time whether or not earlier ones have answered, and its
latency is measured from that scheduled time, so a slow server (or a late client) shows in the
latency instead of silently lowering the rate (no coordinated omission). Each process records
how late it actually sent (``send lag``) and its CPU use, so a client that falls behind is seen.

Why not httpx (load_tests.bench) or aiohttp, which it used before: their pools cost several
times more CPU per request (rawhttp's docstring), and on a host whose cores the server shares the
client's CPU is taken from the server. The processes are started once (``OpenLoopPool``) and
take one job per rate point on stdin, answering one JSON line on stdout (latencies go to a .npy
file). A ``.bodies`` file gives several bodies, sent in turn (load_tests.harness.bodies).

A job may also run until told to stop (``stop_path``: the scenario of tests/gpu's controller
test decides when), writing its running counts to ``progress_path`` a few times a second.

    python -m load_tests.harness.openloop     # a pool worker: JSON jobs in, JSON lines out
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from load_tests.harness.bodies import read_bodies
from load_tests.harness.meta import ROOT
from load_tests.harness.rawhttp import ConnectError, RawPool, ReadError

READY = "OPENLOOP_READY"
MIN_SLEEP_S = 0.001

# Status codes the open-loop workers record beside HTTP statuses (which are all > 0).
STATUS_CODES: dict[str, int] = {
    "timeout": 0,  # no answer before the request's timeout or the end of the drain
    "dropped": -1,  # not sent: the worker already had max_in_flight requests outstanding
    "connect": -2,
    "read": -3,
    "write": -4,
}
_KIND_OF_CODE = {v: k for k, v in STATUS_CODES.items()}
# The client keeps up when its sends are at most this late at p99 (and it drops none). A
# pool may state a looser bound: on a loaded machine the OS's scheduling alone delays sends.
MAX_SEND_LAG_P99_MS = 5.0
MAX_CLIENT_CPU_FRAC = 0.95
PROGRESS_EVERY_S = 0.25  # how often a job with a stop_path or progress_path looks and writes
ERROR_SAMPLES = 5  # the first answers that were not 2xx, kept with their bodies


def _ms_percentiles(seconds: np.ndarray) -> dict[str, float | None]:
    if seconds.size == 0:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    p50, p90, p99 = np.percentile(seconds, [50.0, 90.0, 99.0])
    return {
        "p50_ms": float(p50) * 1e3,
        "p90_ms": float(p90) * 1e3,
        "p99_ms": float(p99) * 1e3,
        "max_ms": float(seconds.max()) * 1e3,
    }


def summarise_openloop(
    arrays: Sequence[np.ndarray],
    results: Sequence[Mapping[str, Any]],
    rate_per_s: float,
    duration_s: float,
    warmup_s: float,
    max_send_lag_p99_ms: float = MAX_SEND_LAG_P99_MS,
) -> dict[str, Any]:
    """Merge the workers' records of one rate point.

    ``arrays``: per worker, rows (scheduled s, latency s, send lag s, status) per request, where
    status is the HTTP status or a STATUS_CODES code. Requests *scheduled* in the window
    [warmup_s, warmup_s + duration_s) are measured: their errors and latency (from the
    scheduled time, 2xx only). Throughput counts 2xx answers that *complete* in the window,
    whenever scheduled, over duration_s."""
    end_s = warmup_s + duration_s
    rec = np.concatenate([np.asarray(a, dtype=np.float64) for a in arrays], axis=1)
    times, latency, lag, status = rec[0], rec[1], rec[2], rec[3].astype(np.int64)
    measured = (times >= warmup_s) & (times < end_s)
    ok = (status >= 200) & (status < 300)
    done_at = times + np.nan_to_num(latency, nan=np.inf)
    in_window = ok & (done_at >= warmup_s) & (done_at < end_s)
    errors: dict[str, int] = {}
    for code in status[measured & ~ok]:
        kind = "status" if code > 0 else _KIND_OF_CODE.get(int(code), "read")
        errors[kind] = errors.get(kind, 0) + 1
    lags = lag[measured & ~np.isnan(lag)]
    lag_p99_ms = float(np.percentile(lags, 99.0)) * 1e3 if lags.size else None
    cpu = max((float(r.get("cpu_frac", 0.0)) for r in results), default=0.0)
    late = max((float(r.get("start_late_s", 0.0)) for r in results), default=0.0)
    n_measured = int(measured.sum())
    keeps_up = (
        errors.get("dropped", 0) == 0
        and (lag_p99_ms is None or lag_p99_ms <= max_send_lag_p99_ms)
        and cpu < MAX_CLIENT_CPU_FRAC
    )
    return {
        "offered_per_s": rate_per_s,
        "scheduled_per_s": n_measured / duration_s if duration_s > 0 else 0.0,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "requests": n_measured,
        "ok": int((measured & ok).sum()),
        "errors": sum(errors.values()),
        "error_counts": errors,
        "requests_per_s": int(in_window.sum()) / duration_s if duration_s > 0 else 0.0,
        **_ms_percentiles(latency[measured & ok]),
        "send_lag_p99_ms": lag_p99_ms,
        "client_cpu_frac_max": round(cpu, 3),
        "start_late_s_max": round(late, 4),
        "max_send_lag_p99_ms": max_send_lag_p99_ms,
        "client_keeps_up": keeps_up,
    }


def schedule(rate_per_s: float, total_s: float, seed: int, poisson: bool) -> np.ndarray:
    """Send times in [0, total_s): Poisson arrivals (seeded) or evenly spaced."""
    if poisson:
        from load_tests.harness.schedule import poisson_schedule

        return np.asarray(poisson_schedule(rate_per_s, total_s, seed), dtype=np.float64)
    return np.arange(0.0, total_s, 1.0 / rate_per_s, dtype=np.float64)


def _error_code(exc: BaseException) -> int:
    """The STATUS_CODES code of a transport error."""
    if isinstance(exc, TimeoutError):  # before OSError, of which it is one
        return STATUS_CODES["timeout"]
    if isinstance(exc, ConnectError):
        return STATUS_CODES["connect"]
    if isinstance(exc, ReadError):  # closed or unparsable before the answer was whole
        return STATUS_CODES["read"]
    return STATUS_CODES["write"]


async def run_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """One rate point in this process (see OpenLoopPool.point for the fields)."""
    bodies = read_bodies(Path(job["body_path"]))  # sent in turn, from this worker's offset
    offset = int(job.get("body_offset", 0))
    total_s = job["warmup_s"] + job["duration_s"]
    times = schedule(job["rate_per_s"], total_s, job["seed"], job["poisson"])
    n = len(times)
    latency = np.full(n, np.nan)
    lag = np.full(n, np.nan)
    status = np.zeros(n, dtype=np.int32)  # the HTTP status, or a STATUS_CODES code
    loop = asyncio.get_running_loop()
    clock = time.perf_counter  # uvloop's loop.time() ticks in whole milliseconds
    # Only Host, Content-Type and Content-Length, as wrk sends: no compressed answers.
    pool = RawPool(job["url"], job["method"], job["headers"], job["connections"])
    timeout_s = job["timeout_s"]
    pending: set[asyncio.Task[None]] = set()
    stop_path, progress_path = job.get("stop_path"), job.get("progress_path")
    # sent, dropped, 2xx, not 2xx (transport errors included): for progress_path
    counts = [0, 0, 0, 0]
    error_samples: list[str] = []
    stopped_at_s: float | None = None
    delay_s = job["start_at_unix"] - time.time()
    if delay_s > 0:
        await asyncio.sleep(delay_s)
    start_late_s = max(0.0, -delay_s)
    cpu0 = time.process_time()
    try:
        t0 = clock()

        async def send(i: int) -> None:
            due = t0 + times[i]
            lag[i] = clock() - due
            try:
                async with asyncio.timeout(timeout_s):
                    code, answer = await pool.request(bodies[(offset + i) % len(bodies)])
                status[i] = code
                if not 200 <= code < 300 and len(error_samples) < ERROR_SAMPLES:
                    error_samples.append(f"{code}: {answer[:300]!r}")
            except OSError as exc:  # TimeoutError, ConnectError, ReadError and the rest
                status[i] = _error_code(exc)
                if len(error_samples) < ERROR_SAMPLES:
                    error_samples.append(f"{type(exc).__name__}: {str(exc)[:300]}")
            latency[i] = clock() - due
            counts[2 if 200 <= status[i] < 300 else 3] += 1

        i = 0
        next_look_s = 0.0
        while i < n:
            now = clock() - t0
            while i < n and times[i] <= now:
                if len(pending) >= job["max_in_flight"]:
                    status[i] = STATUS_CODES["dropped"]
                    counts[1] += 1
                else:
                    task = loop.create_task(send(i))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    counts[0] += 1
                i += 1
            if (stop_path or progress_path) and now >= next_look_s:
                next_look_s = now + PROGRESS_EVERY_S
                if progress_path:
                    _write_progress(progress_path, now, i, counts, len(pending))
                if stop_path and os.path.exists(stop_path):
                    stopped_at_s, n = now, i  # nothing after this was due: record none of it
                    break
            if i < n:
                # Timers tick in milliseconds: wait at least one tick (sends due meanwhile go
                # out together, their lateness counted in their latency) rather than spin.
                await asyncio.sleep(max(MIN_SLEEP_S, times[i] - (clock() - t0)))
        if pending:
            await asyncio.wait(set(pending), timeout=job["drain_s"])
        # Still unanswered at the end of the drain: recorded as timeouts (status 0), so
        # counted as failed in the progress file too (sent == ok + failed at the end).
        counts[3] += len(pending)
        for task in list(pending):
            task.cancel()
        if pending:
            await asyncio.wait(set(pending), timeout=2.0)
    finally:
        pool.close()
    wall_s = clock() - t0
    cpu_s = time.process_time() - cpu0
    if progress_path:
        _write_progress(progress_path, wall_s, n, counts, 0)
    rows = [times[:n], latency[:n], lag[:n], status[:n].astype(np.float64)]
    np.save(job["latency_path"], np.stack(rows))
    return {
        "pid": os.getpid(),
        "scheduled": n,
        "cpu_frac": cpu_s / wall_s if wall_s > 0 else 0.0,
        "start_late_s": start_late_s,
        "stopped_at_s": stopped_at_s,
        "error_samples": error_samples,
        "latency_path": job["latency_path"],
    }


def _write_progress(path: str, t_s: float, due: int, counts: Sequence[int], in_flight: int) -> None:
    """The job's running counts, replaced whole (a reader never sees half a file)."""
    sent, dropped, ok, failed = counts
    doc = {"t_s": round(t_s, 3), "due": due, "sent": sent, "dropped": dropped}
    doc.update(ok=ok, failed=failed, in_flight=in_flight)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def read_progress(paths: Sequence[Path]) -> dict[str, int]:
    """The workers' progress files summed (a file not written yet counts as zeros)."""
    total = dict.fromkeys(("due", "sent", "dropped", "ok", "failed", "in_flight"), 0)
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        for key in total:
            total[key] += int(doc.get(key, 0))
    return total


def _run(coro: Any) -> Any:
    """``coro`` on a uvloop event loop when uvloop is installed, else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def worker_main() -> int:
    """A pool worker: one JSON job per stdin line, one JSON result per stdout line."""
    print(READY, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        gc.collect()
        gc.freeze()  # a collection pass over a long-lived heap would stall the sends
        try:
            result = _run(run_job(json.loads(line)))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which records it
            result = {"pid": os.getpid(), "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)
    return 0


class OpenLoopPool:
    """One worker process per core of ``cores`` (at most ``procs``), each pinned to its core."""

    def __init__(
        self,
        cores: Sequence[int],
        procs: int | None,
        work_dir: Path,
        max_send_lag_p99_ms: float = MAX_SEND_LAG_P99_MS,
    ) -> None:
        if not cores:
            raise ValueError("the open-loop client needs at least one core")
        if not max_send_lag_p99_ms > 0:
            raise ValueError(f"max_send_lag_p99_ms must be > 0, not {max_send_lag_p99_ms}")
        self.work_dir = work_dir
        self.max_send_lag_p99_ms = float(max_send_lag_p99_ms)
        self.cores = list(cores)[: procs or len(cores)]
        self._io = ThreadPoolExecutor(max_workers=len(self.cores))
        self.procs: list[subprocess.Popen[str]] = []
        self._job: dict[str, Any] = {}
        self.last_arrays: list[np.ndarray] = []
        self.last_results: list[dict[str, Any]] = []
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        for core in self.cores:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "load_tests.harness.openloop"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    cwd=str(ROOT),
                    env=dict(os.environ, PYTHONPATH=path),
                    preexec_fn=functools.partial(os.sched_setaffinity, 0, {core}),
                )
            )
        for line in self._read_lines(60.0):
            if line.strip() != READY:
                self.close()
                raise RuntimeError(f"open-loop worker did not start: {line!r}")

    def _read_lines(self, timeout_s: float) -> list[str]:
        futures = [self._io.submit(p.stdout.readline) for p in self.procs if p.stdout]
        try:
            return [f.result(timeout=timeout_s) for f in futures]
        except Exception:
            self.close()
            raise

    def point(
        self,
        url: str,
        headers: Mapping[str, str],
        body_path: Path,
        *,
        rate_per_s: float,
        duration_s: float,
        warmup_s: float,
        connections: int,
        seed: int = 0,
        poisson: bool = True,
        timeout_s: float = 5.0,
        max_in_flight: int = 4096,
        drain_s: float | None = None,
    ) -> dict[str, Any]:
        """Offer ``rate_per_s`` in all (split evenly: a sum of Poisson processes is Poisson)
        for warmup_s + duration_s; returns summarise_openloop of the measured window.
        ``max_in_flight`` is per worker process; ``drain_s`` (default min(timeout_s, 3)) is how
        long the answers still due after the schedule may take before they count as timeouts."""
        self.submit(
            url,
            headers,
            body_path,
            rate_per_s=rate_per_s,
            duration_s=duration_s,
            warmup_s=warmup_s,
            connections=connections,
            seed=seed,
            poisson=poisson,
            timeout_s=timeout_s,
            max_in_flight=max_in_flight,
            drain_s=drain_s,
        )
        return self.collect()

    def submit(
        self,
        url: str,
        headers: Mapping[str, str],
        body_path: Path,
        *,
        rate_per_s: float,
        duration_s: float,
        warmup_s: float,
        connections: int,
        seed: int = 0,
        poisson: bool = True,
        timeout_s: float = 5.0,
        max_in_flight: int = 4096,
        stop_path: Path | None = None,
        drain_s: float | None = None,
    ) -> list[Path]:
        """Start a job on every worker without waiting (``collect`` waits); returns the
        workers' progress files (see ``read_progress``). With ``stop_path``, the workers stop
        sending once that file exists (at most PROGRESS_EVERY_S later), drain and answer."""
        n = len(self.procs)
        drain_s = min(timeout_s, 3.0) if drain_s is None else drain_s
        start_at = time.time() + 0.3
        progress = [self.work_dir / f"openloop-{k}.progress.json" for k in range(n)]
        for path in progress:
            path.unlink(missing_ok=True)
        for k, proc in enumerate(self.procs):
            job = {
                "url": url,
                "method": "POST",
                "headers": dict(headers),
                "body_path": str(body_path),
                "body_offset": k,
                "rate_per_s": rate_per_s / n,
                "duration_s": duration_s,
                "warmup_s": warmup_s,
                "seed": seed * 1009 + k,
                "poisson": poisson,
                "connections": max(1, math.ceil(connections / n)),
                "max_in_flight": max_in_flight,
                "timeout_s": timeout_s,
                "drain_s": drain_s,
                "start_at_unix": start_at,
                "latency_path": str(self.work_dir / f"openloop-{k}.npy"),
                "progress_path": str(progress[k]),
                "stop_path": None if stop_path is None else str(stop_path),
            }
            if proc.stdin is None or proc.poll() is not None:
                raise RuntimeError(f"open-loop worker {proc.pid} has exited ({proc.returncode})")
            proc.stdin.write(json.dumps(job) + "\n")
            proc.stdin.flush()
        self._job = {
            "rate_per_s": rate_per_s,
            "duration_s": duration_s,
            "warmup_s": warmup_s,
            "connections": connections,
            "poisson": poisson,
            "drain_s": drain_s,
            "start_at_unix": start_at,
        }
        return progress

    def collect(self) -> dict[str, Any]:
        """Wait for the submitted job's answers; returns summarise_openloop of its measured
        window (cut short where a stop_path stopped it), and keeps every worker's records in
        ``last_arrays`` and answers in ``last_results``."""
        job = self._job
        total_s = job["warmup_s"] + job["duration_s"]
        lines = self._read_lines(total_s + job["drain_s"] + 30.0)
        results = [json.loads(line) for line in lines]
        failed = [r["error"] for r in results if "error" in r]
        if failed:
            raise RuntimeError(f"open-loop worker failed: {failed[0]}")
        arrays = [np.load(r["latency_path"]) for r in results]
        self.last_arrays, self.last_results = arrays, results
        stops = [r["stopped_at_s"] for r in results if r.get("stopped_at_s") is not None]
        duration_s = job["duration_s"]
        if stops:
            duration_s = max(0.0, min(duration_s, max(stops) - job["warmup_s"]))
        summary = summarise_openloop(
            arrays,
            results,
            job["rate_per_s"],
            duration_s,
            job["warmup_s"],
            self.max_send_lag_p99_ms,
        )
        summary.update(
            connections=job["connections"],
            procs=len(self.procs),
            poisson=job["poisson"],
            start_at_unix=job["start_at_unix"],
        )
        return summary

    def close(self) -> None:
        for proc in self.procs:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
        self._io.shutdown(wait=False, cancel_futures=True)


if __name__ == "__main__":
    raise SystemExit(worker_main())
