"""A GPU memory monitor per node: a light Ray actor that samples NVML about once a second.

It reports device-level free bytes per GPU UUID (memory of processes outside Ray included) and,
every few seconds, Ray's free logical GPU. It also watches every GPU replica's NVML bytes against
its budget four times a second (``watch``): a replica over its budget is an *escape*
(control.escapes), logged, exported as the ``serve_app_budget_escape_bytes`` gauge and listed by
``serve-app status`` within a second. Replicas read it (``latest_readings``) when Serve asks them
for autoscaling stats; the Serve controller's policy pushes its last decision per deployment to it
fire-and-forget (``record_decision``), and ``serve-app status`` reads everything back with
``status_snapshot``. What it reads, as data: control.readings.

One actor per node, named ``serve_app_gpu_monitor_<node_id>`` in namespace ``serve_app``, created
idempotently (``get_if_exists``, detached, ``num_cpus=0``, pinned to its node). Just over 400
lines: the actor and the typed handle its callers reach it by belong together.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

from serve_app.control.escapes import (
    ESCAPE_PERIOD_S,
    Escape,
    WatchedReplica,
    escape_began,
    find_escapes,
)
from serve_app.control.readings import SAMPLE_PERIOD_S, NodeReadings, node_devices, sample_node
from serve_app.gpu import nvml

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorClass
    from ray.util.metrics import Gauge

__all__ = [
    "MONITOR_NAMESPACE",
    "MONITOR_PREFIX",
    "DecisionRecord",
    "GpuMonitor",
    "MonitorHandle",
    "StatusSnapshot",
    "get_or_create_monitor",
    "latest_readings",
    "monitor_name",
    "pid_alive",
    "status_snapshot",
]

logger = logging.getLogger(__name__)

MONITOR_NAMESPACE = "serve_app"
MONITOR_PREFIX = "serve_app_gpu_monitor_"
RAY_GPU_PERIOD_S = 5.0


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
    escapes: tuple[Escape, ...] = ()


# What one monitor's ``snapshot`` returns: its latest sample, its decisions, its escapes.
Snapshot = tuple[NodeReadings, dict[str, DecisionRecord], list[Escape]]


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
        self._watched: dict[int, WatchedReplica] = {}
        self._escapes: dict[int, Escape] = {}
        self._escape_gauge: Gauge | None = None
        self._escape_gauge_failed = False  # not in a Ray worker (tests): log lines only
        self._last_sample_s = float("-inf")
        if start:
            threading.Thread(target=self._run, name="serve-app-gpu-monitor", daemon=True).start()

    def sample_once(self) -> NodeReadings:
        """Take one sample now (the thread calls this every period)."""
        now_s = self._clock()
        if self._ray_gpu_at_s is None or now_s - self._ray_gpu_at_s >= self._ray_period_s:
            self._ray_gpu_value, self._ray_gpu_at_s = self._ray_gpu(), now_s
        reading = sample_node(
            self._node_id, now_s, node_devices, self._ray_gpu_value, self._ray_gpu_at_s
        )
        with self._lock:
            self._latest = reading
        return reading

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if time.monotonic() - self._last_sample_s >= self._period_s:
                    self._last_sample_s = time.monotonic()
                    self.sample_once()
                if self._watched:
                    self.check_escapes()
            except Exception:  # keep sampling: one bad read must not end the monitor
                logger.exception("GPU monitor sample failed")
            self._stop.wait(min(self._period_s, ESCAPE_PERIOD_S))

    def watch(self, replica: WatchedReplica) -> None:
        """Compare this replica's NVML bytes with its budget from now on (replicas call this
        once they know their budget; a PID that has exited is dropped)."""
        with self._lock:
            self._watched[replica.pid] = replica

    def check_escapes(
        self, read: Callable[[str], dict[int, int] | nvml.NvmlError] = nvml.processes
    ) -> list[Escape]:
        """One look at every watched replica's bytes; logs and exports new escapes."""
        with self._lock:
            watched = dict(self._watched)
            previous = dict(self._escapes)
        for pid in [p for p in watched if not pid_alive(p)]:
            watched.pop(pid)
            with self._lock:
                self._watched.pop(pid, None)
        readings: dict[str, dict[int, int]] = {}
        for uuid in {w.gpu_uuid for w in watched.values()}:
            got = read(uuid)
            if not isinstance(got, nvml.NvmlError):
                readings[uuid] = got
        now_s = self._clock()
        escapes = find_escapes(watched, readings, previous, now_s)
        with self._lock:
            self._escapes = escapes
        for pid, esc in escapes.items():
            was = previous.get(pid)
            if esc.active and (was is None or not was.active):
                logger.warning("%s", escape_began(esc))
            elif was is not None and was.active and not esc.active:
                logger.warning(
                    "GPU memory escape over: replica %s is within its budget again",
                    esc.replica.replica_id,
                )
        self._export_escapes(escapes)
        return list(escapes.values())

    def _export_escapes(self, escapes: dict[int, Escape]) -> None:
        if not escapes or self._escape_gauge_failed:
            return
        if self._escape_gauge is None:
            try:
                from ray.util import metrics

                self._escape_gauge = metrics.Gauge(
                    "serve_app_budget_escape_bytes",
                    description="GPU bytes a replica holds over its budget (0 once back within).",
                    tag_keys=("replica", "app", "gpu"),
                )
            except Exception:  # noqa: BLE001 - not in a Ray worker (tests): log lines only
                self._escape_gauge_failed = True
                return
        for esc in escapes.values():
            self._escape_gauge.set(
                float(esc.over_bytes if esc.active else 0),
                tags={
                    "replica": esc.replica.replica_id,
                    "app": esc.replica.app,
                    "gpu": esc.replica.gpu_uuid,
                },
            )

    def escapes(self) -> list[Escape]:
        with self._lock:
            return list(self._escapes.values())

    def latest(self) -> NodeReadings:
        """The latest sample of this node's GPUs."""
        with self._lock:
            return self._latest

    def record_decision(self, record: DecisionRecord) -> None:
        """Keep the controller's last decision for a deployment (pushed fire-and-forget)."""
        with self._lock:
            self._decisions[record.deployment] = record

    def snapshot(self) -> Snapshot:
        """The latest sample, every decision this monitor holds, and the escapes it saw."""
        with self._lock:
            return self._latest, dict(self._decisions), list(self._escapes.values())

    def stop(self) -> None:
        self._stop.set()


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists on this node (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def monitor_name(node_id: str) -> str:
    return f"{MONITOR_PREFIX}{node_id}"


class _Latest(Protocol):
    def remote(self) -> ObjectRef[NodeReadings]: ...


class _Watch(Protocol):
    def remote(self, replica: WatchedReplica) -> ObjectRef[None]: ...


class _RecordDecision(Protocol):
    def remote(self, record: DecisionRecord) -> ObjectRef[None]: ...


class _Snapshot(Protocol):
    def remote(self) -> ObjectRef[Snapshot]: ...


class MonitorHandle(Protocol):
    """The monitor actor as its Ray handle offers it: ``GpuMonitor``'s methods, each called
    with ``.remote(...)`` for an ObjectRef of what the method returns."""

    @property
    def latest(self) -> _Latest: ...

    @property
    def watch(self) -> _Watch: ...

    @property
    def record_decision(self) -> _RecordDecision: ...

    @property
    def snapshot(self) -> _Snapshot: ...


_actor_lock = threading.Lock()
_actor_cls: ActorClass[GpuMonitor] | None = None
_handles: dict[str, MonitorHandle] = {}


def _remote_cls() -> ActorClass[GpuMonitor]:
    global _actor_cls
    with _actor_lock:
        if _actor_cls is None:
            import ray

            _actor_cls = ray.remote(num_cpus=0, max_restarts=-1)(GpuMonitor)
        return _actor_cls


def get_or_create_monitor(node_id: str | None = None) -> MonitorHandle:
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
        _handles[node] = cast(MonitorHandle, handle)
        return _handles[node]


async def latest_readings(timeout_s: float = 1.0) -> NodeReadings | None:
    """This node's latest GPU sample from its monitor, or ``None`` if none came in time."""
    try:
        handle = await asyncio.wait_for(asyncio.to_thread(get_or_create_monitor), timeout_s)
        return await asyncio.wait_for(handle.latest.remote(), timeout_s)
    except Exception:  # timeouts, a dead actor: the planner holds on missing readings
        logger.debug("no reading from the GPU monitor", exc_info=True)
        return None


def _alive_nodes() -> set[str] | None:
    """Node IDs the GCS reports alive, or ``None`` if it could not be asked."""
    try:
        import ray

        return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    except Exception:  # noqa: BLE001 - then every monitor is asked, as before
        logger.debug("ray.nodes() failed", exc_info=True)
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
    refs: list[ObjectRef[Snapshot]] = []
    errors: list[str] = []
    alive = _alive_nodes()
    for name in sorted(names):
        node_id = name.removeprefix(MONITOR_PREFIX)
        if alive is not None and node_id not in alive:
            # A detached monitor pinned to a node that is gone never answers: say so at once
            # instead of waiting out the timeout; its GPUs drop out of the report.
            errors.append(f"node {node_id} is not alive: its GPUs are lost")
            continue
        try:
            refs.append(ray.get_actor(name, namespace=MONITOR_NAMESPACE).snapshot.remote())
        except ValueError as exc:
            errors.append(f"{name}: {exc}")
    nodes: list[NodeReadings] = []
    decisions: dict[str, DecisionRecord] = {}
    escapes: list[Escape] = []
    ready, not_ready = (
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    )
    for ref in ready:
        try:
            node, node_decisions, node_escapes = ray.get(ref)
        except Exception as exc:
            errors.append(f"monitor failed: {exc}")
            continue
        nodes.append(node)
        escapes.extend(node_escapes)
        for dep, rec in node_decisions.items():
            if dep not in decisions or rec.timestamp_s > decisions[dep].timestamp_s:
                decisions[dep] = rec
    if not_ready:
        errors.append(f"{len(not_ready)} monitor(s) did not answer within {timeout_s}s")
    return StatusSnapshot(tuple(nodes), decisions, tuple(errors), tuple(escapes))
