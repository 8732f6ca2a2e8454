"""GPU time from NVML: a sampler of the GPUs' utilisation (and one replica's bytes) for
``plan --measure``'s windows and ``plan --from-running``'s, and the re-plan's GPU seconds per
request fitted to it. A live replica reports its model thread's busy seconds, which count
tokenization, decoding and the launch as well as the GPU's work; at the rates seen, the models'
GPU time must add up to the utilisation NVML saw over the same window, so the busy time is
scaled down to it (never up: utilisation counts a second in which any kernel ran as busy)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

NVML_SAMPLE_S = 0.1  # the driver updates utilisation every 1/6 s to 1 s, by GPU


class GpuSampler:
    """NVML every NVML_SAMPLE_S on a thread: each GPU's utilisation (``busy_s`` is the window's
    samples' mean share times the window, summed over the GPUs; None when a GPU gave none) and,
    with ``pid``, that process's used bytes on the first GPU (``peak_bytes``, over the whole
    call)."""

    def __init__(self, uuids: Sequence[str], pid: int | None = None) -> None:
        self.uuids, self.pid = [u for u in uuids if u], pid
        self.samples: dict[str, list[tuple[float, int]]] = {u: [] for u in self.uuids}
        self.peak_bytes: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plan-nvml", daemon=True)

    def _run(self) -> None:
        from serve_app.gpu import nvml

        while self.uuids and not self._stop.wait(NVML_SAMPLE_S):
            if self.pid is not None:
                used = nvml.value(nvml.process_used_bytes(self.pid, self.uuids[0]))
                if used is not None:
                    self.peak_bytes = max(self.peak_bytes or 0, used)
            for uuid in self.uuids:
                got = nvml.value(nvml.utilization_and_name(uuid))
                if got is None:
                    return
                self.samples[uuid].append((time.perf_counter(), got[0]))

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def busy_s(self, begin: float, end: float) -> float | None:
        """The GPUs' busy seconds in [begin, end) (perf_counter): per GPU, the mean of its
        samples taken in it times the window; their sum. None without a sample of each."""
        if not self.uuids:
            return None
        total = 0.0
        for uuid in self.uuids:
            inside = [p for at, p in self.samples[uuid] if begin <= at < end]
            if not inside:
                return None
            total += sum(inside) / len(inside) / 100.0 * (end - begin)
        return total


def fit_to_nvml(
    models: Mapping[str, dict[str, Any]],
    busy_s: Mapping[str, float],
    gpu_busy_s: float | None,
) -> str | None:
    """Scale the GPU models' ``gpu_s_per_request`` (their model threads' busy seconds per
    request, ``busy_s`` by application over the window) by one factor, so that their GPU time
    at the rates seen adds up to ``gpu_busy_s``, NVML's over the same window; never up. In
    place; the note for the measurements file, or None where nothing was scaled."""
    on_gpu = {k: m for k, m in models.items() if busy_s.get(k, 0.0) > 0 and _gpu_s(m) > 0}
    threads_s = sum(busy_s[k] for k in on_gpu)
    if gpu_busy_s is None or gpu_busy_s < 0 or threads_s <= 0:
        return None
    factor = min(1.0, gpu_busy_s / threads_s)
    for m in on_gpu.values():
        for c in m["candidates"]:
            c["gpu_s_per_request"] = c["gpu_s_per_request"] * factor
        m["sources"]["gpu_s_per_request"] += (
            f"; times {factor:.4f}: NVML's utilisation of the replicas' GPUs over the window "
            f"({gpu_busy_s:.3f} busy seconds) over the model threads' busy seconds of every "
            f"GPU application ({threads_s:.3f}), so that their GPU time at the rates seen adds "
            "up to NVML's"
        )
    return (
        f"GPU seconds per request: the model threads' busy time scaled by {factor:.4f} to "
        f"NVML's utilisation over the window ({gpu_busy_s:.3f} of {threads_s:.3f} s)"
    )


def _gpu_s(model: Mapping[str, Any]) -> float:
    return max((float(c.get("gpu_s_per_request") or 0.0) for c in model["candidates"]), default=0)
