"""The memory report as Ray metrics (Prometheus-scrapable through Ray's metrics endpoint).

Serve adds the deployment, replica and application tags itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GAUGES = {
    "budget_bytes": "The replica's GPU memory budget (num_gpus x device total).",
    "torch_fraction": "The fraction passed to set_per_process_memory_fraction.",
    "allocated_bytes": "PyTorch allocated bytes.",
    "reserved_bytes": "PyTorch reserved (cached) bytes.",
    "peak_reserved_bytes": "Peak PyTorch reserved bytes.",
    "non_torch_overhead_bytes": "CUDA context and other memory outside PyTorch's allocator.",
    "nvml_process_bytes": "NVML's figure for this process.",
    "max_batch_size": "The batch cap in force (calibrated, lowered on OOM).",
}
COUNTERS = {
    "oom_recoveries": "Out-of-memory errors recovered by splitting a batch.",
    "cache_frees": "Times cached memory went back to the device by policy.",
}


class ReplicaMetrics:
    """Gauges and counters created once per replica (never at import)."""

    def __init__(self) -> None:
        from ray.serve import metrics

        self._gauges = {
            key: metrics.Gauge(f"serve_app_{key}", description=desc) for key, desc in GAUGES.items()
        }
        self._counters = {
            key: metrics.Counter(f"serve_app_{key}_total", description=desc)
            for key, desc in COUNTERS.items()
        }
        self._counted = dict.fromkeys(COUNTERS, 0)

    def update(self, report: Mapping[str, Any]) -> None:
        for key, gauge in self._gauges.items():
            value = report.get(key)
            if value is not None:
                gauge.set(float(value))
        for key, counter in self._counters.items():
            total = int(report.get(key) or 0)
            if total > self._counted[key]:
                counter.inc(total - self._counted[key])
                self._counted[key] = total
