"""Bytes promised to replicas still starting, shared by every deployment's policy in the Serve
controller process, so two deployments on one GPU cannot both spend the same free bytes."""

from __future__ import annotations

import importlib
import threading

from serve_app.control.planner import (
    Decision,
    Direction,
    PlannerInputs,
    Reservation,
    footprint_bytes,
)
from serve_app.control.settings import ControllerConfig

__all__ = ["Ledger", "shared_ledger", "update_ledger"]


class Ledger:
    """Reservations by deployment (``app/deployment``), under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, Reservation] = {}


_LEDGER = Ledger()


def shared_ledger() -> Ledger:
    """The controller process's one ledger.

    Ray cloudpickles the module a policy_function names *by value*, so a policy may run with its
    own copy of a module's globals (ray/serve/config.py: ``AutoscalingPolicy.serialize_policy``).
    Importing this module by name reaches the installed module, whose ledger every policy in the
    process shares (tests/unit/control/test_ledger.py pickles a policy by value to check it).
    """
    real = importlib.import_module("serve_app.control.ledger")
    ledger: Ledger = real._LEDGER
    return ledger


def update_ledger(
    ledger: Ledger,
    deployment: str,
    inputs: PlannerInputs,
    decision: Decision,
    config: ControllerConfig,
    now_s: float,
) -> None:
    """Reserve bytes for replicas a scale-up starts; settle them once they run; forget them once
    readings newer than that have had time to arrive. Call it holding ``ledger.lock``."""
    added = decision.target_replicas - inputs.target_replicas
    gpu_replicas = [r for r in inputs.replicas if r.gpu_fraction > 0 or r.gpu_uuid]
    if decision.direction is Direction.UP and added > 0 and gpu_replicas and inputs.gpus:
        footprint = max(footprint_bytes(r, config) for r in gpu_replicas)
        ledger.entries[deployment] = Reservation(
            deployment, added * footprint, frozenset(g.uuid for g in inputs.gpus), None
        )
    entry = ledger.entries.get(deployment)
    if (
        entry is not None
        and entry.settled_at_s is None
        and decision.direction is not Direction.UP
        and inputs.running_replicas >= inputs.target_replicas
    ):
        ledger.entries[deployment] = Reservation(
            entry.deployment, entry.bytes, entry.gpu_uuids, now_s
        )
    expiry_s = config.max_reading_age_s + config.max_clock_skew_s
    for name, res in list(ledger.entries.items()):
        if res.settled_at_s is not None and now_s - res.settled_at_s > expiry_s:
            del ledger.entries[name]
