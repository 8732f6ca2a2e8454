"""The GPU shares a deploy file asks for, checked against the GPUs they must fit on.

Ray hands out fractional GPUs as numbers, never more than 1.0 of a GPU, and a fraction never
spans GPUs: a 0.3 replica lands whole on one GPU, by best fit (docs/cluster.md, "Placement").
A replica that does not fit stays pending, and ``serve-app run`` waits for it until its ready
timeout. So a config whose replicas at their most (``num_replicas``, or autoscaling's
``max_replicas``) do not pack into the GPUs is refused before anything starts.

"On one GPU": deployments pinned to a GPU (``ray_actor_options.label_selector`` with
``serve-app/gpu``, a Ray node per GPU, docs/cluster.md) share that GPU; every other deployment
shares the ``gpus`` GPUs the check is given (one, unless ``serve-app run`` counted more).
Shares are summed in Ray's own unit, 1/10000 of a GPU, so 12 x 0.08 is exactly 0.96.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serve_app.config.walk import deployments

UNITS = 10_000  # Ray's resource granularity: a GPU share is rounded to 1/10000
PIN_LABEL = "serve-app/gpu"
AUTO_MAX_REPLICAS = 100  # num_replicas: auto without max_replicas (Serve's AutoscalingConfig)


@dataclass(frozen=True)
class Ask:
    """One deployment's GPU share per replica and its most replicas."""

    path: str  # e.g. applications[1].deployments[0]
    name: str  # application/deployment
    share_units: int
    replicas: int
    why: str  # where the replica count comes from

    def describe(self) -> str:
        share = self.share_units / UNITS
        total = self.share_units * self.replicas / UNITS
        return f"{self.path} ({self.name}) {self.replicas} x {share:g} ({self.why}) = {total:g}"


def booked_share(num_gpus: float) -> float:
    """The share Ray books for a ``num_gpus``, and hands the replica as its assigned GPU: it
    truncates ``num_gpus x 10000`` (0.0249 is 248.99999999999997 units, so 0.0248 is booked)."""
    return int(num_gpus * UNITS) / UNITS


def budget_units(budget_bytes: int, total_bytes: int) -> int:
    """The fewest units (1/10000 of a GPU) whose booked share holds ``budget_bytes`` on a GPU of
    ``total_bytes`` (``int(share x total)``, as gpu/budget.plan_budget computes it)."""
    units = -(-budget_bytes * UNITS // total_bytes)
    while int(booked_share(units / UNITS) * total_bytes) < budget_bytes:  # float rounding
        units += 1
    return units


def share_for_budget(budget_bytes: int, total_bytes: int) -> float:
    """The ``num_gpus`` whose booked share holds at least ``budget_bytes`` on a GPU of
    ``total_bytes``: rounded up to Ray's 1/10000. ValueError when one GPU cannot hold it."""
    units = budget_units(budget_bytes, total_bytes)
    if units > UNITS:
        raise ValueError(
            f"a budget of {budget_bytes:,} bytes is more than the GPU's {total_bytes:,} bytes; "
            "lower memory.budget or pin the deployment to a larger GPU"
        )
    return units / UNITS


def budget_share_error(
    budget_bytes: int, num_gpus: Any, total_bytes: int | None, path: str
) -> str | None:
    """What is wrong with a deployment that states ``memory.budget``: no num_gpus (plain
    ``serve deploy`` would run it without the share), or a num_gpus that holds less than the
    budget on the GPU of ``total_bytes`` (None: not known here)."""
    derived = None
    if total_bytes is not None:
        try:
            derived = share_for_budget(budget_bytes, total_bytes)
        except ValueError as exc:
            return f"{path}: {exc}"
    if not isinstance(num_gpus, (int, float)) or isinstance(num_gpus, bool) or num_gpus <= 0:
        hint = f"num_gpus: {derived:g}" if derived is not None else "the derived num_gpus"
        return (
            f"{path}.ray_actor_options.num_gpus: not set, but memory.budget asks for "
            f"{budget_bytes:,} bytes; serve deploy schedules by num_gpus only, so write {hint} "
            "into the file (serve-app check --write-shares OUT does; docs/planning.md)"
        )
    booked = booked_share(num_gpus) if isinstance(num_gpus, (int, float)) else 0.0
    if derived is not None and total_bytes is not None and int(booked * total_bytes) < budget_bytes:
        return (
            f"{path}.ray_actor_options.num_gpus: {num_gpus:g} (Ray books {booked:g}) holds "
            f"{int(booked * total_bytes):,} bytes of a {total_bytes:,}-byte GPU, less than "
            f"memory.budget ({budget_bytes:,} bytes); use num_gpus: {derived:g}"
        )
    return None


def replica_budget_problem(
    budget_bytes: int, num_gpus: float, device_total_bytes: int | None, node_has_gpu: bool
) -> str | None:
    """At a replica's start: why its ``memory.budget`` cannot be kept, or None. No share on a
    node with GPUs: the file went to ``serve deploy`` without the derived num_gpus, and the
    replica would run unbounded on the CPU. A share that holds less than the budget: it landed
    on a smaller GPU than the one its share was derived from."""
    if num_gpus <= 0:
        if not node_has_gpu:
            return None  # a CPU-only node: the budget is ignored, as num_gpus is
        return (
            f"memory.budget asks for {budget_bytes:,} bytes but Ray gave this replica no GPU "
            "share (ray_actor_options.num_gpus is not set): serve deploy schedules by num_gpus "
            "only. Write the derived share into the file (serve-app check --write-shares OUT, "
            "or serve-app plan) or start it with serve-app run (docs/planning.md)"
        )
    if device_total_bytes is not None and int(num_gpus * device_total_bytes) < budget_bytes:
        return (
            f"num_gpus {num_gpus:g} of this GPU's {device_total_bytes:,} bytes is "
            f"{int(num_gpus * device_total_bytes):,} bytes, less than memory.budget "
            f"({budget_bytes:,} bytes): the share was derived for a larger GPU; derive it for "
            "the smallest GPU the deployment may land on, or pin it (docs/planning.md)"
        )
    return None


def most_replicas(dep: dict[str, Any]) -> tuple[int, str] | None:
    """A deployment's most replicas and where that number comes from; None when unreadable."""
    auto = dep.get("autoscaling_config")
    num = dep.get("num_replicas")
    if isinstance(auto, dict):
        most = auto.get("max_replicas", AUTO_MAX_REPLICAS if num == "auto" else 1)
        return (most, "autoscaling max_replicas") if isinstance(most, int) else None
    if num == "auto":
        return AUTO_MAX_REPLICAS, "num_replicas auto: up to 100"
    if num is None:
        return 1, "one replica"
    return (num, "num_replicas") if isinstance(num, int) and not isinstance(num, bool) else None


def asks(doc: dict[str, Any]) -> dict[str | None, list[Ask]]:
    """Every deployment that asks for a GPU share, grouped by the GPU it is pinned to (None:
    not pinned)."""
    groups: dict[str | None, list[Ask]] = {}
    for d in deployments(doc):
        opts = d.actor_options
        share = opts.get("num_gpus")
        if not isinstance(share, (int, float)) or isinstance(share, bool):
            continue
        if not 0 < share <= 1:  # more than one GPU is an error of its own (deploy.py)
            continue
        count = most_replicas(d.dep)
        if count is None or count[0] <= 0:
            continue
        labels = opts.get("label_selector")
        pin = labels.get(PIN_LABEL) if isinstance(labels, dict) else None
        ask = Ask(d.path, d.name, round(float(share) * UNITS), count[0], count[1])
        groups.setdefault(None if pin is None else str(pin), []).append(ask)
    return groups


def packs(items_units: list[int], gpus: int) -> bool:
    """Whether the shares pack into ``gpus`` GPUs, each fraction whole on one GPU: best fit,
    largest first (as the raylet places each request on the GPU with the least room that holds
    it). On one GPU this is exactly "the sum is at most 1"."""
    room = [UNITS] * gpus
    for item in sorted(items_units, reverse=True):
        fits = [k for k in range(gpus) if room[k] >= item]
        if not fits:
            return False
        best = min(fits, key=lambda k: (room[k], k))
        room[best] -= item
    return True


def share_errors(doc: dict[str, Any], gpus: int = 1) -> list[str]:
    """One error per group of deployments whose replicas, at their most, cannot all hold their
    GPU shares at once: naming each deployment, the sum and the fix."""
    errors = []
    for pin, group in sorted(asks(doc).items(), key=lambda kv: str(kv[0])):
        on = 1 if pin is not None else gpus
        items = [a.share_units for a in group for _ in range(min(a.replicas, 10 * UNITS))]
        if packs(items, on):
            continue
        total = sum(a.share_units * a.replicas for a in group) / UNITS
        where = (
            f"GPU {pin} (label_selector {PIN_LABEL})"
            if pin is not None
            else ("one GPU" if on == 1 else f"{on} GPUs (each share whole on one GPU)")
        )
        errors.append(
            f"GPU shares: the replicas on {where} ask for {total:g} in all, more than fits: "
            + "; ".join(a.describe() for a in group)
            + ". Ray never gives out more than 1.0 of a GPU, so the replicas past it would "
            "stay pending: lower ray_actor_options.num_gpus or the replica counts "
            "(num_replicas, autoscaling_config.max_replicas) so that the shares on each GPU add "
            "up to at most 1"
            + ("" if pin is not None else ", or pin deployments to GPUs (docs/cluster.md)")
        )
    return errors
