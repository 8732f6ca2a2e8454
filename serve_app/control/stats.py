"""What each replica reports to the Serve controller for the headroom policy.

A replica's ``record_autoscaling_stats`` returns ``await replica_autoscaling_stats(...)``: its
own memory figures plus its node monitor's latest GPU readings, flattened into float metrics
(names in ``METRIC_*`` and ``gpu_metric_name``). The policy (control.policy) reads them back
from the ``AutoscalingContext``.
"""

from __future__ import annotations

import re

from serve_app.control import monitor
from serve_app.control.readings import NodeReadings, gpu_key

__all__ = [
    "GPU_METRIC",
    "METRIC_BUDGET_BYTES",
    "METRIC_GPU_FRACTION",
    "METRIC_GPU_KEY",
    "METRIC_NVML_OK",
    "METRIC_NVML_PROCESS_BYTES",
    "METRIC_PEAK_BYTES",
    "METRIC_RAY_GPU_AVAILABLE",
    "REPLICA_METRICS",
    "gpu_metric_name",
    "replica_autoscaling_stats",
    "stats_from_readings",
]

METRIC_BUDGET_BYTES = "serve_app_budget_bytes"
METRIC_PEAK_BYTES = "serve_app_peak_bytes"
METRIC_NVML_PROCESS_BYTES = "serve_app_nvml_process_bytes"  # -1: NVML does not list the PID
METRIC_GPU_FRACTION = "serve_app_gpu_fraction"  # num_gpus; 0 for a CPU replica
METRIC_GPU_KEY = "serve_app_gpu_key"  # readings.gpu_key(uuid) of the replica's GPU; 0: none
METRIC_NVML_OK = "serve_app_nvml_ok"  # 1: the node monitor answered with readings; 0: not
METRIC_RAY_GPU_AVAILABLE = "serve_app_ray_gpu_available"  # -1: unknown
# The figures every replica reports; one it has not reported yet makes the policy hold.
REPLICA_METRICS = (
    METRIC_BUDGET_BYTES,
    METRIC_PEAK_BYTES,
    METRIC_GPU_FRACTION,
    METRIC_GPU_KEY,
    METRIC_NVML_OK,
)
# One GPU figure: group 1 the GPU's key in hex, group 2 the field.
GPU_METRIC = re.compile(r"^serve_app_gpu_([0-9a-f]{12})_(total_bytes|free_bytes|timestamp_s)$")


def gpu_metric_name(key: int, field: str) -> str:
    """Metric name of one GPU figure: ``serve_app_gpu_<key hex>_<field>``."""
    return f"serve_app_gpu_{key:012x}_{field}"


def stats_from_readings(
    *,
    budget_bytes: int,
    peak_bytes: int,
    gpu_uuid: str | None,
    gpu_fraction: float,
    nvml_process_bytes: int | None,
    readings: NodeReadings | None,
) -> dict[str, float]:
    """The float metrics one replica reports, from its figures and its node's readings."""
    stats: dict[str, float] = {
        METRIC_BUDGET_BYTES: float(budget_bytes),
        METRIC_PEAK_BYTES: float(peak_bytes),
        METRIC_NVML_PROCESS_BYTES: float(-1 if nvml_process_bytes is None else nvml_process_bytes),
        METRIC_GPU_FRACTION: float(gpu_fraction),
        METRIC_GPU_KEY: float(gpu_key(gpu_uuid)) if gpu_uuid else 0.0,
        METRIC_NVML_OK: 0.0,
        METRIC_RAY_GPU_AVAILABLE: -1.0,
    }
    if readings is None or readings.error is not None or not readings.gpus:
        return stats
    stats[METRIC_NVML_OK] = 1.0
    if readings.ray_gpu_available is not None:
        stats[METRIC_RAY_GPU_AVAILABLE] = float(readings.ray_gpu_available)
    for gpu in readings.gpus:
        stats[gpu_metric_name(gpu.key, "total_bytes")] = float(gpu.total_bytes)
        stats[gpu_metric_name(gpu.key, "free_bytes")] = float(gpu.free_bytes)
        stats[gpu_metric_name(gpu.key, "timestamp_s")] = float(gpu.timestamp_s)
    return stats


async def replica_autoscaling_stats(
    *,
    budget_bytes: int,
    peak_bytes: int,
    gpu_uuid: str | None,
    gpu_fraction: float,
    nvml_process_bytes: int | None = None,
    timeout_s: float = 1.0,
) -> dict[str, float]:
    """What a replica's ``record_autoscaling_stats`` returns.

    Args:
        budget_bytes: the replica's memory budget (num_gpus x device total); 0 on the CPU.
        peak_bytes: the largest memory the replica has used (torch peak reserved + overhead).
        gpu_uuid: NVML UUID of its GPU (``devices.uuid_for_torch_device(0)``); ``None`` on the CPU.
        gpu_fraction: its ``num_gpus``; 0 on the CPU.
        nvml_process_bytes: NVML's figure for this PID, ``None`` if NVML does not list it.
        timeout_s: how long to wait for the node monitor (Serve's own limit is 10 s).
    """
    readings = await monitor.latest_readings(timeout_s) if gpu_uuid else None
    return stats_from_readings(
        budget_bytes=budget_bytes,
        peak_bytes=peak_bytes,
        gpu_uuid=gpu_uuid,
        gpu_fraction=gpu_fraction,
        nvml_process_bytes=nvml_process_bytes,
        readings=readings,
    )
