"""A GPU memory monitor per node: a light Ray actor that samples NVML about once a second.

It reports device-level free bytes per GPU UUID (memory of processes outside Ray included) and,
every few seconds, Ray's free logical GPU. Replicas read it (``latest_readings``) when Serve asks
them for autoscaling stats; the Serve controller's policy pushes its last decision per deployment
to it fire-and-forget (``record_decision``), and ``serve-app status`` reads everything back with
``status_snapshot``.

One actor per node, named ``serve_app_gpu_monitor_<node_id>`` in namespace ``serve_app``, created
idempotently (``get_if_exists``, detached, ``num_cpus=0``, pinned to its node).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from serve_app import nvml

__all__ = [
    "MONITOR_NAMESPACE",
    "MONITOR_PREFIX",
    "DecisionRecord",
    "GpuMonitor",
    "GpuReading",
    "NodeReadings",
    "StatusSnapshot",
    "get_or_create_monitor",
    "gpu_key",
    "gpu_label",
    "latest_readings",
    "monitor_name",
    "sample_node",
    "status_snapshot",
]

logger = logging.getLogger(__name__)

MONITOR_NAMESPACE = "serve_app"
MONITOR_PREFIX = "serve_app_gpu_monitor_"
SAMPLE_PERIOD_S = 1.0
RAY_GPU_PERIOD_S = 5.0


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


@dataclass(frozen=True)
class DecisionRecord:
    """The controller policy's last decision for one deployment (``app/deployment``)."""

    deployment: str
    target_replicas: int
    current_replicas: int
    direction: str
    reason: str
    detail: str
    timestamp_s: float


@dataclass(frozen=True)
class StatusSnapshot:
    """What ``serve-app status`` shows: every node's GPUs and the controller's decisions."""

    nodes: tuple[NodeReadings, ...]
    decisions: dict[str, DecisionRecord] = field(default_factory=dict)
    errors: tuple[str, ...] = ()


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


def _ray_gpu_available() -> float | None:
    try:
        import ray

        return float(ray.available_resources().get("GPU", 0.0))
    except Exception:  # the GCS may be briefly unreachable: the planner treats None as unknown
        logger.debug("ray.available_resources() failed", exc_info=True)
        return None


class GpuMonitor:
    """The per-node monitor (run as a Ray actor; a plain object in tests).

    A daemon thread samples every ``period_s``; actor methods only read the latest sample.
    """

    def __init__(
        self,
        node_id: str,
        period_s: float = SAMPLE_PERIOD_S,
        ray_period_s: float = RAY_GPU_PERIOD_S,
        clock: Callable[[], float] = time.time,
        ray_gpu: Callable[[], float | None] = _ray_gpu_available,
        start: bool = True,
    ) -> None:
        self._node_id = node_id
        self._period_s = period_s
        self._ray_period_s = ray_period_s
        self._clock = clock
        self._ray_gpu = ray_gpu
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._latest = NodeReadings(node_id, (), None, 0.0)
        self._ray_gpu_value: float | None = None
        self._ray_gpu_at_s: float | None = None
        self._decisions: dict[str, DecisionRecord] = {}
        if start:
            threading.Thread(target=self._run, name="serve-app-gpu-monitor", daemon=True).start()

    def sample_once(self) -> NodeReadings:
        """Take one sample now (the thread calls this every period)."""
        now_s = self._clock()
        if self._ray_gpu_at_s is None or now_s - self._ray_gpu_at_s >= self._ray_period_s:
            self._ray_gpu_value, self._ray_gpu_at_s = self._ray_gpu(), now_s
        reading = sample_node(
            self._node_id, now_s, nvml.all_devices, self._ray_gpu_value, self._ray_gpu_at_s
        )
        with self._lock:
            self._latest = reading
        return reading

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # keep sampling: one bad read must not end the monitor
                logger.exception("GPU monitor sample failed")
            self._stop.wait(self._period_s)

    def latest(self) -> NodeReadings:
        """The latest sample of this node's GPUs."""
        with self._lock:
            return self._latest

    def record_decision(self, record: DecisionRecord) -> None:
        """Keep the controller's last decision for a deployment (pushed fire-and-forget)."""
        with self._lock:
            self._decisions[record.deployment] = record

    def snapshot(self) -> tuple[NodeReadings, dict[str, DecisionRecord]]:
        """The latest sample and every decision this monitor holds."""
        with self._lock:
            return self._latest, dict(self._decisions)

    def stop(self) -> None:
        self._stop.set()


def monitor_name(node_id: str) -> str:
    return f"{MONITOR_PREFIX}{node_id}"


_actor_lock = threading.Lock()
_actor_cls: Any = None
_handles: dict[str, Any] = {}


def _remote_cls() -> Any:
    global _actor_cls
    with _actor_lock:
        if _actor_cls is None:
            import ray

            _actor_cls = ray.remote(num_cpus=0, max_restarts=-1)(GpuMonitor)
        return _actor_cls


def get_or_create_monitor(node_id: str | None = None) -> Any:
    """The monitor actor of ``node_id`` (default: this process's node), created if missing.

    Blocks on a short GCS lookup the first time per process; the handle is cached after that.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = node_id or ray.get_runtime_context().get_node_id()
    with _actor_lock:
        if node in _handles:
            return _handles[node]
    handle = (
        _remote_cls()
        .options(
            name=monitor_name(node),
            namespace=MONITOR_NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
        )
        .remote(node)
    )
    with _actor_lock:
        _handles[node] = handle
    return handle


async def latest_readings(timeout_s: float = 1.0) -> NodeReadings | None:
    """This node's latest GPU sample from its monitor, or ``None`` if none came in time."""
    try:
        handle = await asyncio.wait_for(asyncio.to_thread(get_or_create_monitor), timeout_s)
        result: NodeReadings = await asyncio.wait_for(handle.latest.remote(), timeout_s)
        return result
    except Exception:  # timeouts, a dead actor: the planner holds on missing readings
        logger.debug("no reading from the GPU monitor", exc_info=True)
        return None


def status_snapshot(timeout_s: float = 5.0) -> StatusSnapshot:
    """Every monitor's latest sample and the newest decision per deployment (for the CLI).

    Needs a connected Ray driver (``ray.init(address="auto")``).
    """
    import ray
    from ray.util import list_named_actors

    names = [
        a["name"]
        for a in list_named_actors(all_namespaces=True)
        if a.get("namespace") == MONITOR_NAMESPACE and a["name"].startswith(MONITOR_PREFIX)
    ]
    refs: list[Any] = []
    errors: list[str] = []
    for name in sorted(names):
        try:
            refs.append(ray.get_actor(name, namespace=MONITOR_NAMESPACE).snapshot.remote())
        except ValueError as exc:
            errors.append(f"{name}: {exc}")
    nodes: list[NodeReadings] = []
    decisions: dict[str, DecisionRecord] = {}
    ready, not_ready = (
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    )
    for ref in ready:
        try:
            node, node_decisions = ray.get(ref)
        except Exception as exc:
            errors.append(f"monitor failed: {exc}")
            continue
        nodes.append(node)
        for dep, rec in node_decisions.items():
            if dep not in decisions or rec.timestamp_s > decisions[dep].timestamp_s:
                decisions[dep] = rec
    if not_ready:
        errors.append(f"{len(not_ready)} monitor(s) did not answer within {timeout_s}s")
    return StatusSnapshot(tuple(nodes), decisions, tuple(errors))
