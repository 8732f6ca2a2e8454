"""One closed-loop window against one replica through the HTTP ingress, with what the replica
spent over it: its process's CPU seconds (psutil), its model thread's busy seconds (its report)
and the GPU's busy seconds (NVML's utilisation, sampled). ``serve-app plan --measure`` runs one
at saturation and one at a low load per batch cap."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from serve_app.plan.readings import LoopReading, percentile

NVML_SAMPLE_S = 0.1  # the driver updates utilisation every 1/6 s to 1 s, by GPU


@dataclass(frozen=True)
class Target:
    """A replica as the loop drives it: its route and request, its process, its GPU."""

    url: str
    body: bytes
    headers: dict[str, str]
    pid: int
    gpu_uuid: str | None
    busy_s: Callable[[], float]  # the replica's batch_busy_s, from its report


class _GpuSampler:
    """NVML's utilisation of one GPU sampled every NVML_SAMPLE_S on a thread; ``busy_s`` is the
    window's samples' mean share times the window (None when NVML gave none)."""

    def __init__(self, uuid: str | None) -> None:
        self.uuid = uuid
        self.samples: list[tuple[float, int]] = []  # (perf_counter, percent)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plan-nvml", daemon=True)

    def _run(self) -> None:
        from serve_app.gpu import nvml

        while self.uuid and not self._stop.wait(NVML_SAMPLE_S):
            got = nvml.value(nvml.utilization_and_name(self.uuid))
            if got is None:
                return
            self.samples.append((time.perf_counter(), got[0]))

    def __enter__(self) -> _GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def busy_s(self, begin: float, end: float) -> float | None:
        """The GPU's busy seconds in [begin, end): the mean of the samples taken in it."""
        inside = [p for at, p in self.samples if begin <= at < end]
        if not inside:
            return None
        return sum(inside) / len(inside) / 100.0 * (end - begin)


async def _drive(
    t: Target, concurrency: int, begin: float, end: float, timeout_s: float
) -> tuple[list[float], int]:
    """``concurrency`` workers each sending the next request when its last is answered, until
    ``end`` (perf_counter); the latencies and errors of requests sent from ``begin`` on."""
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        while (sent := time.perf_counter()) < end:
            try:
                resp = await client.post(t.url, content=t.body, headers=t.headers)
                ok = resp.status_code < 300
            except httpx.HTTPError:
                ok = False
            if sent >= begin:
                if ok:
                    latencies.append(time.perf_counter() - sent)
                else:
                    errors += 1

    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return latencies, errors


def run_window(
    t: Target, concurrency: int, warmup_s: float, window_s: float, timeout_s: float = 30.0
) -> LoopReading:
    """One closed-loop window (see ``_drive``) and what the replica spent over it. The replica's
    CPU and busy seconds are read at the window's edges, by a timer thread, so that the
    warm-up and the last requests' tails are not counted."""
    import psutil

    proc, me = psutil.Process(t.pid), psutil.Process()
    marks: dict[str, tuple[float, float, float]] = {}

    def mark(name: str) -> None:
        cpu = proc.cpu_times()
        marks[name] = (cpu.user + cpu.system, t.busy_s(), sum(me.cpu_times()[:2]))

    timers = [
        threading.Timer(warmup_s, mark, ("begin",)),
        threading.Timer(warmup_s + window_s, mark, ("end",)),
    ]
    with _GpuSampler(t.gpu_uuid) as gpu:
        begin = time.perf_counter() + warmup_s
        end = begin + window_s
        for timer in timers:
            timer.start()
        latencies, errors = asyncio.run(_drive(t, concurrency, begin, end, timeout_s))
        for timer in timers:
            timer.join()
    (cpu0, busy0, me0), (cpu1, busy1, me1) = marks["begin"], marks["end"]
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
        client_cpu_fraction=(me1 - me0) / (end - begin),
    )
