"""One closed-loop window against one replica through the HTTP ingress, with what the replica
spent over it: its process's CPU seconds (psutil), its model thread's busy seconds (its report),
the GPU's busy seconds (NVML's utilisation, sampled) and the replica's GPU bytes (NVML, its
peak); and the CPU seconds of the ingress's processes (serve_app.plan.ingress). ``serve-app
plan --measure`` runs one at saturation and one at a low load per batch cap.

The client is aiohttp (Ray Serve's own HTTP client library, so no new dependency) in spawned
processes of their own, each an event loop with its share of the connections: one asyncio
process tops out at a few thousand small requests a second, under what one replica of a small
model answers, and a figure the client limits measures the client."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from serve_app.plan import ingress as ing
from serve_app.plan.gputime import GpuSampler
from serve_app.plan.readings import LoopReading, percentile

CLIENT_START_TIMEOUT_S = 60.0  # a spawned client imports aiohttp (about a second)


@dataclass(frozen=True)
class Target:
    """A replica as the loop drives it: its route and request, its process, its GPU."""

    url: str
    body: bytes
    headers: dict[str, str]
    pid: int
    gpu_uuid: str | None
    busy_s: Callable[[], float]  # the replica's batch_busy_s, from its report
    # The ingress's processes and their CPU seconds, now (ingress.snapshot); None: not read.
    ingress: Callable[[], Mapping[int, ing.ProcCpu]] | None = None


def client_processes(concurrency: int, cpu_count: int | None = None) -> int:
    """How many client processes drive ``concurrency`` requests in flight: a quarter of the
    host's cores (the replica, Ray and HAProxy keep the rest), at least one, at most 8, never
    more than the requests in flight."""
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return max(1, min(8, cores // 4, concurrency))


def split(concurrency: int, parts: int) -> list[int]:
    """``concurrency`` dealt over ``parts`` processes as evenly as it goes."""
    base, extra = divmod(concurrency, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


async def _drive(
    url: str,
    body: bytes,
    headers: dict[str, str],
    concurrency: int,
    begin: float,
    end: float,
    timeout_s: float,
) -> tuple[list[float], int, float]:
    """``concurrency`` workers each sending the next request when its last is answered, until
    ``end`` (perf_counter, the host's monotonic clock, the same in every process); the
    latencies and errors of requests sent from ``begin`` on, and this process's CPU seconds
    from ``begin`` to ``end``."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    cpu: dict[str, float] = {}
    loop = asyncio.get_running_loop()

    def mark(name: str) -> None:  # the CPU time read when the timer fires, not when it is set
        cpu[name] = time.process_time()

    for name, at in (("begin", begin), ("end", end)):
        loop.call_later(max(0.0, at - time.perf_counter()), mark, name)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while (sent := time.perf_counter()) < end:
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    ok = resp.status < 300
            except (TimeoutError, aiohttp.ClientError):
                ok = False
            if sent >= begin:
                if ok:
                    latencies.append(time.perf_counter() - sent)
                else:
                    errors += 1

    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    cpu.setdefault("end", time.process_time())
    return latencies, errors, cpu["end"] - cpu.get("begin", cpu["end"])


def _client_main(conn: Connection, job: dict[str, Any]) -> None:
    """A spawned client: imports, says it is ready, waits for the window, drives it, sends back
    its latencies, errors and CPU seconds (or the error that stopped it)."""
    try:
        import aiohttp  # noqa: F401  (imported before "ready", so the start is not in the window)

        conn.send("ready")
        begin, end = conn.recv()
        conn.send(
            asyncio.run(
                _drive(
                    job["url"],
                    job["body"],
                    job["headers"],
                    job["concurrency"],
                    begin,
                    end,
                    job["timeout_s"],
                )
            )
        )
    except BaseException as exc:  # reported to the parent, which raises it
        conn.send(f"client failed: {type(exc).__name__}: {exc}")
    finally:
        conn.close()


def _run_clients(
    t: Target,
    concurrency: int,
    warmup_s: float,
    window_s: float,
    timeout_s: float,
    on_start: Callable[[float, float], None],
) -> tuple[list[float], int, list[float], float, float]:
    """Start the client processes, then the window once all are ready; ``on_start(begin,
    end)`` is called then. Latencies, errors, each process's CPU seconds, begin, end."""
    ctx = mp.get_context("spawn")  # never fork a process that runs Ray's threads
    procs: list[tuple[Any, Connection]] = []
    try:
        for n in split(concurrency, client_processes(concurrency)):
            mine, theirs = ctx.Pipe()
            job = {
                "url": t.url,
                "body": t.body,
                "headers": t.headers,
                "concurrency": n,
                "timeout_s": timeout_s,
            }
            p = ctx.Process(
                target=_client_main, args=(theirs, job), name="plan-client", daemon=True
            )
            p.start()
            theirs.close()
            procs.append((p, mine))
        for _, conn in procs:
            if not conn.poll(CLIENT_START_TIMEOUT_S):
                raise RuntimeError(f"a load client did not start in {CLIENT_START_TIMEOUT_S} s")
            if (msg := conn.recv()) != "ready":
                raise RuntimeError(str(msg))
        begin = time.perf_counter() + warmup_s
        end = begin + window_s
        on_start(begin, end)
        for _, conn in procs:
            conn.send((begin, end))
        latencies: list[float] = []
        errors, cpus = 0, []
        for _, conn in procs:
            if not conn.poll(warmup_s + window_s + timeout_s + 30.0):
                raise RuntimeError("a load client did not finish its window")
            got = conn.recv()
            if isinstance(got, str):
                raise RuntimeError(got)
            lat, err, cpu_s = got
            latencies += lat
            errors += err
            cpus.append(cpu_s)
        return latencies, errors, cpus, begin, end
    finally:
        for p, conn in procs:
            conn.close()
            p.join(timeout=5.0)
            if p.is_alive():
                p.kill()


def run_window(
    t: Target, concurrency: int, warmup_s: float, window_s: float, timeout_s: float = 30.0
) -> LoopReading:
    """One closed-loop window (see ``_drive``) and what the replica spent over it. The replica's
    CPU and busy seconds, and the ingress's CPU seconds, are read at the window's edges, by
    timer threads, so that the warm-up and the last requests' tails are not counted."""
    import psutil

    proc = psutil.Process(t.pid)
    marks: dict[str, tuple[float, float]] = {}
    ingress: dict[str, tuple[float, Mapping[int, ing.ProcCpu]]] = {}
    timers: list[threading.Timer] = []

    def mark(name: str) -> None:
        if t.ingress is not None:
            ingress[name] = (time.time(), t.ingress())
        cpu = proc.cpu_times()
        marks[name] = (cpu.user + cpu.system, t.busy_s())

    def on_start(begin: float, end: float) -> None:
        now = time.perf_counter()
        timers.extend(
            threading.Timer(at - now, mark, (name,))
            for name, at in (("begin", begin), ("end", end))
        )
        for timer in timers:
            timer.start()

    with GpuSampler([t.gpu_uuid] if t.gpu_uuid else [], t.pid) as gpu:
        latencies, errors, cpus, begin, end = _run_clients(
            t, concurrency, warmup_s, window_s, timeout_s, on_start
        )
        for timer in timers:
            timer.join()
    (cpu0, busy0), (cpu1, busy1) = marks["begin"], marks["end"]
    front = ing.IngressCpu({}, {}, 0)
    if ingress:
        (start_s, before), (_, after) = ingress["begin"], ingress["end"]
        front = ing.delta(before, after, start_s)
    return LoopReading(
        concurrency=concurrency,
        requests=len(latencies),
        errors=errors,
        window_s=end - begin,
        p50_s=percentile(latencies, 50),
        p99_s=percentile(latencies, 99),
        replica_cpu_s=cpu1 - cpu0,
        batch_busy_s=busy1 - busy0,
        gpu_busy_s=gpu.busy_s(begin, end),
        client_cpu_fraction=max(cpus) / (end - begin),
        client_processes=len(cpus),
        replica_nvml_peak_bytes=gpu.peak_bytes,
        ingress_cpu_s=front.cpu_s,
        ingress_cpu_s_by_kind=front.cpu_s_by_kind,
        ingress_processes_by_kind=front.processes_by_kind,
        ingress_processes_lost=front.lost,
    )
