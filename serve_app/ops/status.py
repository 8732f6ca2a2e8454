"""``serve-app status``: read ``GET /v1/memory`` and render it as a table, like nvidia-smi's
process list; and the cluster view (GPUs, decisions, escapes) that the report adds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from serve_app.errors import ServeAppError
from serve_app.gpu.budget import format_bytes

COLUMNS = [
    ("REPLICA", "replica_id", 10),
    ("APP", "app", 18),
    ("PID", "pid", 8),
    ("GPU", "gpu_uuid", 14),
    ("BUDGET", "budget_bytes", 11),
    ("ENFORCE", "enforcement", 8),
    ("FRAC", "torch_fraction", 6),
    ("ALLOC", "allocated_bytes", 11),
    ("RESERVED", "reserved_bytes", 11),
    ("PEAK", "peak_reserved_bytes", 11),
    ("OVERHEAD", "non_torch_overhead_bytes", 11),
    ("NVML", "nvml_process_bytes", 11),
    ("BATCH", "max_batch_size", 6),
    ("OOMS", "oom_recoveries", 5),
    ("FREES", "cache_frees", 6),
]


class StatusUnavailable(ServeAppError):
    """The running app's memory report could not be read."""

    error_type = "status_unavailable"


def read_memory_report(
    url: str, timeout_s: float = 10.0, api_key: str | None = None
) -> dict[str, Any]:
    """The ``GET /v1/memory`` document of the app at ``url``, sent with ``api_key``, or else
    with the first key of this environment's ``SERVE_APP_API_KEYS``/``_FILE`` when it has one
    (the route needs a key when the server has keys).

    Raises:
        StatusUnavailable: the app cannot be reached or did not answer 200.
    """
    import httpx

    from serve_app import env

    key = api_key if api_key is not None else next(iter(env.api_keys()), None)
    headers = {"authorization": f"Bearer {key}"} if key else None
    try:
        resp = httpx.get(f"{url.rstrip('/')}/v1/memory", timeout=timeout_s, headers=headers)
    except httpx.HTTPError as exc:
        raise StatusUnavailable(f"cannot reach {url}: {exc}") from None
    if resp.status_code != 200:
        raise StatusUnavailable(f"{url}/v1/memory answered {resp.status_code}: {resp.text}")
    doc: dict[str, Any] = resp.json()
    return doc


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_bytes"):
        return format_bytes(int(value)).replace(" GiB", "G")
    if key == "torch_fraction":
        return f"{float(value):.3f}"
    if key == "gpu_uuid":
        return str(value)[:14]
    if key == "replica_id":
        return str(value)[:10]
    return str(value)


def startup_line(rep: dict[str, Any]) -> str | None:
    """A replica's start-up phases in seconds, in order (``process``: Ray's worker start-up,
    or, in a warm worker, its start and preload ahead of time; ``imports``: the replica's own
    imports), the calibration's source, when the first request was answered (from the
    process's start, and from the imports or the replica's own start), and the node's warm
    workers as its keeper last saw them."""
    phases = rep.get("startup_phases_s")
    if not isinstance(phases, dict) or not phases:
        return None
    warm = bool(rep.get("preloaded_worker"))
    parts = []
    for name, seconds in phases.items():
        part = f"{name} {float(seconds):.2f}"
        if name == "calibration" and rep.get("calibration_source"):
            part += f" ({rep['calibration_source']})"
        if name == "process" and warm:
            waited = rep.get("worker_waited_s")
            part += " (warm worker" + (
                f", ready {float(waited):.2f} before the replica)" if waited is not None else ")"
            )
        parts.append(part)
    first = rep.get("first_request_s")
    first_text = "none yet" if first is None else f"{float(first):.2f}"
    since_imports = rep.get("first_request_since_imports_s")
    if first is not None and since_imports is not None:
        start = "its own start" if warm else "the imports"
        first_text += f" ({float(since_imports):.2f} from {start})"
    pool = rep.get("warm_workers")
    pool_text = ""
    if isinstance(pool, dict):
        pool_text = f"; warm workers {pool.get('idle')}/{pool.get('target')}"
        if pool.get("error"):
            pool_text += f" (top-up failing: {pool['error']})"
    return (
        f"start-up {_cell('replica_id', rep.get('replica_id'))} (s): {', '.join(parts)}; "
        f"first request {first_text}{pool_text}"
    )


def placement_key(rep: dict[str, Any]) -> tuple[str, str]:
    """Where a replica runs: (node ID, GPU UUID), "" for either when unknown or on the CPU."""
    return str(rep.get("node_id") or ""), str(rep.get("gpu_uuid") or "")


def by_node_and_gpu(replicas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replicas grouped by node, then GPU (a stable sort: the order within a group stays)."""
    return sorted(replicas, key=placement_key)


def placement_groups(replicas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (node, GPU) holding replicas: their IDs and the sum of their budgets."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for rep in by_node_and_gpu(replicas):
        node, gpu = placement_key(rep)
        group = groups.setdefault(
            (node, gpu),
            {"node_id": node or None, "gpu_uuid": gpu or None, "replica_ids": []},
        )
        group["replica_ids"].append(rep.get("replica_id"))
        group["budgets_bytes"] = group.get("budgets_bytes", 0) + int(rep.get("budget_bytes") or 0)
    return list(groups.values())


def _heading(key: tuple[str, str]) -> str:
    node, gpu = key
    return f"node {node[:12] or '-'} GPU {gpu or '- (CPU)'}"


def render_status(doc: dict[str, Any]) -> str:
    """The replica table, each replica's start-up phases, then one line per GPU and the
    controller's last decisions.

    Rows are grouped by node and GPU; when replicas sit on more than one (node, GPU), a heading
    line (``node <id> GPU <uuid>``) opens each group. On one GPU the table is unchanged."""
    lines = [" ".join(title.ljust(width) for title, _, width in COLUMNS)]
    replicas = by_node_and_gpu(list(doc.get("replicas") or []))
    several = len({placement_key(r) for r in replicas}) > 1
    last: tuple[str, str] | None = None
    for rep in replicas:
        if several and placement_key(rep) != last:
            last = placement_key(rep)
            lines.append(_heading(last))
        lines.append(" ".join(_cell(key, rep.get(key)).ljust(width) for _, key, width in COLUMNS))
    if not replicas:
        lines.append("(no replica has reported yet)")
    for rep in replicas:
        line = startup_line(rep)
        if line:
            lines.append(line)
    for gpu in doc.get("gpus", []) or []:  # cluster_view lists them by node
        node = f" on node {str(gpu['node_id'])[:12]}" if gpu.get("node_id") else ""
        lines.append(
            f"GPU {gpu.get('uuid')}{node}: total {_cell('total_bytes', gpu.get('total_bytes'))}, "
            f"free {_cell('free_bytes', gpu.get('free_bytes'))}, sum of budgets "
            f"{_cell('budget_bytes', gpu.get('budgets_bytes'))}"
        )
    for esc in doc.get("escapes", []) or []:
        state = "ESCAPE" if esc.get("active") else "escaped earlier"
        lines.append(
            f"{state}: replica {esc.get('replica_id')} ({esc.get('app')}, pid {esc.get('pid')}, "
            f"enforcement {esc.get('enforcement')}) holds "
            f"{_cell('nvml_process_bytes', esc.get('nvml_process_bytes'))} on GPU "
            f"{esc.get('gpu_uuid')}, {_cell('over_bytes', esc.get('over_bytes'))} over its "
            f"budget of {_cell('budget_bytes', esc.get('budget_bytes'))}"
        )
    for name, d in (doc.get("controller") or {}).items():
        lines.append(
            f"controller {name}: {d.get('current_replicas')} -> {d.get('target_replicas')} "
            f"({d.get('reason')}): {d.get('detail')}"
        )
    return "\n".join(lines)


class GpuRow(TypedDict):
    """One GPU in ``GET /v1/memory``'s ``gpus``: a node monitor's reading and our budgets."""

    node_id: str
    uuid: str
    total_bytes: int
    free_bytes: int
    used_bytes: int
    budgets_bytes: int
    sampled_at_s: float


class DecisionRow(TypedDict):
    """The controller's last decision for a deployment, in ``GET /v1/memory``'s ``controller``."""

    target_replicas: int
    current_replicas: int
    direction: str
    reason: str
    detail: str
    timestamp_s: float


@dataclass(frozen=True)
class ClusterView:
    """What the node monitors add to the replicas' reports in ``GET /v1/memory``."""

    gpus: list[GpuRow]
    controller: dict[str, DecisionRow]
    errors: list[str]
    escapes: list[dict[str, Any]]  # Escape.to_json() of each


def cluster_view(replicas: list[dict[str, Any]], timeout_s: float = 2.0) -> ClusterView:
    """Each GPU's total and free bytes (from the node monitors), the sum of the replicas'
    budgets on it, the controller's last decision per deployment, and budget escapes."""
    from serve_app.control.monitor import status_snapshot

    try:
        snap = status_snapshot(timeout_s)
    except Exception as exc:  # noqa: BLE001 - the report still shows the replicas
        return ClusterView([], {}, [f"monitor unavailable: {exc}"], [])
    budgets: dict[str, int] = {}
    for rep in replicas:
        if rep.get("gpu_uuid"):
            budgets[rep["gpu_uuid"]] = budgets.get(rep["gpu_uuid"], 0) + int(rep["budget_bytes"])
    gpus: list[GpuRow] = [
        {
            "node_id": node.node_id,
            "uuid": gpu.uuid,
            "total_bytes": gpu.total_bytes,
            "free_bytes": gpu.free_bytes,
            "used_bytes": gpu.used_bytes,
            "budgets_bytes": budgets.get(gpu.uuid, 0),
            "sampled_at_s": gpu.timestamp_s,
        }
        for node in sorted(snap.nodes, key=lambda n: n.node_id)
        for gpu in node.gpus
    ]
    controller: dict[str, DecisionRow] = {
        name: {
            "target_replicas": d.target_replicas,
            "current_replicas": d.current_replicas,
            "direction": d.direction,
            "reason": d.reason,
            "detail": d.detail,
            "timestamp_s": d.timestamp_s,
        }
        for name, d in snap.decisions.items()
    }
    escapes = sorted((e.to_json() for e in snap.escapes), key=lambda e: str(e["replica_id"]))
    return ClusterView(gpus, controller, list(snap.errors), escapes)
