"""What a node monitor reads: each GPU's memory by UUID, as data, and the key the planner
knows a GPU by. Pure functions over NVML's answers; the actor that samples is control.monitor."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from serve_app import env
from serve_app.gpu import nvml

__all__ = [
    "SAMPLE_PERIOD_S",
    "GpuReading",
    "NodeReadings",
    "gpu_key",
    "gpu_label",
    "node_devices",
    "sample_node",
]

SAMPLE_PERIOD_S = 1.0  # how often a node monitor reads its GPUs


def gpu_key(uuid: str) -> int:
    """A 48-bit number for a GPU UUID: exact as a float metric value (below 2**53)."""
    return int(hashlib.sha1(uuid.encode()).hexdigest()[:12], 16)


def gpu_label(key: int) -> str:
    """How the planner names a GPU it knows only by key (``"gpu:0123456789ab"``)."""
    return f"gpu:{key:012x}"


@dataclass(frozen=True)
class GpuReading:
    """One GPU's memory at ``timestamp_s`` (wall clock of the monitor's node)."""

    uuid: str
    total_bytes: int
    free_bytes: int
    used_bytes: int
    timestamp_s: float

    @property
    def key(self) -> int:
        return gpu_key(self.uuid)


@dataclass(frozen=True)
class NodeReadings:
    """A node's latest sample. ``error`` is set (and ``gpus`` empty) when NVML failed."""

    node_id: str
    gpus: tuple[GpuReading, ...]
    error: nvml.NvmlError | None
    sampled_at_s: float
    ray_gpu_available: float | None = None
    ray_gpu_at_s: float | None = None


def sample_node(
    node_id: str,
    now_s: float,
    read: Callable[[], list[nvml.GpuMemory] | nvml.NvmlError] = nvml.all_devices,
    ray_gpu_available: float | None = None,
    ray_gpu_at_s: float | None = None,
) -> NodeReadings:
    """One sample of every GPU on this node, as data."""
    devices = read()
    if isinstance(devices, nvml.NvmlError):
        return NodeReadings(node_id, (), devices, now_s, ray_gpu_available, ray_gpu_at_s)
    gpus = tuple(
        GpuReading(d.uuid, d.total_bytes, d.free_bytes, d.used_bytes, now_s) for d in devices
    )
    return NodeReadings(node_id, gpus, None, now_s, ray_gpu_available, ray_gpu_at_s)


def node_devices() -> list[nvml.GpuMemory] | nvml.NvmlError:
    """The GPUs this node's Ray was given: those ``CUDA_VISIBLE_DEVICES`` names when it is set
    and not empty (a Ray node per GPU, ``CUDA_VISIBLE_DEVICES=1 ray start --num-gpus 1``, whose
    num_gpus=0 actors such as the monitor inherit the variable), else every GPU NVML sees.

    NVML ignores ``CUDA_VISIBLE_DEVICES``: without this, each per-GPU node's monitor would report
    every GPU of the host, and a deployment pinned to one GPU would wait for headroom on the
    others. An empty value (Ray's old override for actors given no GPU) means "not set"."""
    devices = nvml.all_devices()
    visible = (env.get("CUDA_VISIBLE_DEVICES") or "").strip()
    if isinstance(devices, nvml.NvmlError) or not visible:
        return devices
    out: list[nvml.GpuMemory] = []
    for entry in (v.strip() for v in visible.split(",") if v.strip()):
        got = _visible_entry(devices, entry)
        if got is None:
            return nvml.NvmlError(
                nvml.NvmlErrorKind.NOT_FOUND,
                f"CUDA_VISIBLE_DEVICES entry {entry!r} names no single GPU on this node",
            )
        if got not in out:
            out.append(got)
    return out


def _visible_entry(devices: list[nvml.GpuMemory], entry: str) -> nvml.GpuMemory | None:
    """One CUDA_VISIBLE_DEVICES entry (an index in NVML order, or a UUID or its prefix)."""
    if entry.isdigit():
        index = int(entry)
        return devices[index] if index < len(devices) else None
    matches = [d for d in devices if d.uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None
