"""A GPU memory monitor per node: a light Ray actor that samples NVML about once a second.

It reports device-level free bytes per GPU UUID (memory of processes outside Ray included) and,
every few seconds, Ray's free logical GPU. It also watches every GPU replica's NVML bytes against
its budget four times a second (``watch``): a replica over its budget (memory allocated outside
PyTorch's cap, which ``enforcement: torch`` cannot stop) is an *escape*, logged, exported as the
``serve_app_budget_escape_bytes`` gauge and listed by ``serve-app status`` within a second.
Replicas read it (``latest_readings``) when Serve asks them for autoscaling stats; the Serve
controller's policy pushes its last decision per deployment to it fire-and-forget
(``record_decision``), and ``serve-app status`` reads everything back with ``status_snapshot``.

One actor per node, named ``serve_app_gpu_monitor_<node_id>`` in namespace ``serve_app``, created
idempotently (``get_if_exists``, detached, ``num_cpus=0``, pinned to its node).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from serve_app import env
from serve_app.gpu import nvml

__all__ = [
    "MONITOR_NAMESPACE",
    "MONITOR_PREFIX",
    "DecisionRecord",
    "Escape",
    "WatchedReplica",
    "find_escapes",
    "GpuMonitor",
    "GpuReading",
    "NodeReadings",
    "StatusSnapshot",
    "get_or_create_monitor",
    "gpu_key",
    "gpu_label",
    "latest_readings",
    "monitor_name",
    "pid_alive",
    "node_devices",
    "sample_node",
    "status_snapshot",
]

logger = logging.getLogger(__name__)

MONITOR_NAMESPACE = "serve_app"
MONITOR_PREFIX = "serve_app_gpu_monitor_"
SAMPLE_PERIOD_S = 1.0
RAY_GPU_PERIOD_S = 5.0
ESCAPE_PERIOD_S = 0.25  # watched replicas' bytes against their budgets; reported within 1 s


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
class WatchedReplica:
    """A GPU replica whose NVML bytes the monitor compares with its budget."""

    replica_id: str
    app: str
    pid: int
    gpu_uuid: str
    budget_bytes: int
    enforcement: str


@dataclass(frozen=True)
class Escape:
    """A watched replica seen holding more GPU memory than its budget."""

    replica: WatchedReplica
    nvml_process_bytes: int
    peak_bytes: int
    first_seen_s: float
    last_seen_s: float
    active: bool

    @property
    def pid(self) -> int:
        return self.replica.pid

    @property
    def over_bytes(self) -> int:
        return self.nvml_process_bytes - self.replica.budget_bytes

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self.replica)
        doc.update({k: v for k, v in self.__dict__.items() if k != "replica"})
        doc["over_bytes"] = self.over_bytes
        return doc


def find_escapes(
    watched: dict[int, WatchedReplica],
    processes: dict[str, dict[int, int]],
    previous: dict[int, Escape],
    now_s: float,
) -> dict[int, Escape]:
    """Escapes by PID after one reading: a watched replica whose bytes on its GPU exceed its
    budget is (still) escaping; one seen before and now back within it stays listed, inactive.

    ``processes`` holds NVML's bytes per PID per GPU UUID (only GPUs that were read).
    """
    out = {pid: dataclasses.replace(e, active=False) for pid, e in previous.items()}
    for pid, rep in watched.items():
        per_pid = processes.get(rep.gpu_uuid)
        if per_pid is None or pid not in per_pid:
            continue
        used = per_pid[pid]
        if used <= rep.budget_bytes:
            continue
        before = previous.get(pid)
        out[pid] = Escape(
            replica=rep,
            nvml_process_bytes=used,
            peak_bytes=max(used, before.peak_bytes if before else used),
            first_seen_s=before.first_seen_s if before and before.active else now_s,
            last_seen_s=now_s,
            active=True,
        )
    return out


@dataclass(frozen=True)
class StatusSnapshot:
    """What ``serve-app status`` shows: every node's GPUs and the controller's decisions."""

    nodes: tuple[NodeReadings, ...]
    decisions: dict[str, DecisionRecord] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    escapes: tuple[Escape, ...] = ()


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
    num_gpus=0 actors such as this monitor inherit the variable), else every GPU NVML sees.

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
        self._escape_metrics: Any = None
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
                logger.warning(
                    "GPU memory escape: replica %s (%s, pid %d) holds %d bytes on GPU %s, %d "
                    "over its budget of %d bytes (enforcement %s: %s)",
                    esc.replica.replica_id,
                    esc.replica.app,
                    pid,
                    esc.nvml_process_bytes,
                    esc.replica.gpu_uuid,
                    esc.over_bytes,
                    esc.replica.budget_bytes,
                    esc.replica.enforcement,
                    "memory allocated outside PyTorch's cap; enforcement: mps makes the driver "
                    "refuse it"
                    if esc.replica.enforcement == "torch"
                    else "over the driver's limit",
                )
            elif was is not None and was.active and not esc.active:
                logger.warning(
                    "GPU memory escape over: replica %s is within its budget again",
                    esc.replica.replica_id,
                )
        self._export_escapes(escapes)
        return list(escapes.values())

    def _export_escapes(self, escapes: dict[int, Escape]) -> None:
        if not escapes:
            return
        if self._escape_metrics is None:
            try:
                from ray.util import metrics

                self._escape_metrics = metrics.Gauge(
                    "serve_app_budget_escape_bytes",
                    description="GPU bytes a replica holds over its budget (0 once back within).",
                    tag_keys=("replica", "app", "gpu"),
                )
            except Exception:  # noqa: BLE001 - not in a Ray worker (tests): log lines only
                self._escape_metrics = False
        if self._escape_metrics:
            for esc in escapes.values():
                self._escape_metrics.set(
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

    def snapshot(self) -> tuple[NodeReadings, dict[str, DecisionRecord], list[Escape]]:
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
    refs: list[Any] = []
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
