"""Budget escapes: a GPU replica seen holding more device memory (NVML, per process) than its
budget, which ``enforcement: torch`` cannot stop when the memory is allocated outside PyTorch.
Pure logic over readings; the node monitor (control.monitor) reads, logs and exports them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["ESCAPE_PERIOD_S", "Escape", "WatchedReplica", "escape_began", "find_escapes"]

ESCAPE_PERIOD_S = 0.25  # watched replicas' bytes against their budgets; reported within 1 s


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
        doc: dict[str, Any] = dataclasses.asdict(self.replica)
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


def escape_began(esc: Escape) -> str:
    """The warning logged when a replica starts escaping its budget, with what would stop it."""
    why = (
        "memory allocated outside PyTorch's cap; enforcement: mps makes the driver refuse it"
        if esc.replica.enforcement == "torch"
        else "over the driver's limit"
    )
    rep = esc.replica
    return (
        f"GPU memory escape: replica {rep.replica_id} ({rep.app}, pid {rep.pid}) holds "
        f"{esc.nvml_process_bytes} bytes on GPU {rep.gpu_uuid}, {esc.over_bytes} over its budget "
        f"of {rep.budget_bytes} bytes (enforcement {rep.enforcement}: {why})"
    )
