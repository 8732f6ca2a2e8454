"""Whether one host's CPU cores can hold the replicas a config starts with.

Every Serve replica reserves its ``ray_actor_options.num_cpus`` (Serve's default: 1) while it
lives. A replica that the node's cores cannot hold stays pending for good, so ``serve-app run``
would wait out its readiness timeout and report only that nothing became ready. On its own
node the cores are known before anything starts, so a config that cannot start there is told
apart at once, with each deployment's part and the fix. A cluster's nodes add up their cores
in Ray's own scheduler; this check is for ``serve-app run``'s single node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serve_app.config.walk import deployments

SERVE_DEFAULT_NUM_CPUS = 1.0  # ray/serve/_private/config.py: ReplicaConfig's default


@dataclass(frozen=True)
class CoreAsk:
    name: str
    replicas: int
    num_cpus: float

    def describe(self) -> str:
        return f"{self.name} {self.replicas} x {self.num_cpus:g}"


def starting_replicas(dep: dict[str, Any]) -> int | None:
    """The replicas a deployment's first roll-out starts (Serve's rules); None when unreadable."""
    auto = dep.get("autoscaling_config")
    num = dep.get("num_replicas")
    if isinstance(auto, dict):
        start = auto.get("initial_replicas")
        if start is None:
            start = auto.get("min_replicas", 1)
        return start if isinstance(start, int) and not isinstance(start, bool) else None
    if num is None or num == "auto":  # "auto" starts at its autoscaling default, one
        return 1
    return num if isinstance(num, int) and not isinstance(num, bool) else None


def core_asks(doc: dict[str, Any]) -> list[CoreAsk]:
    """Every deployment whose first roll-out reserves cores."""
    found = []
    for d in deployments(doc):
        cpus = d.actor_options.get("num_cpus")
        if cpus is None:
            cpus = SERVE_DEFAULT_NUM_CPUS
        count = starting_replicas(d.dep)
        if not isinstance(cpus, (int, float)) or isinstance(cpus, bool) or not count:
            continue
        if cpus > 0:
            found.append(CoreAsk(d.name, count, float(cpus)))
    return found


def cores_error(doc: dict[str, Any], host_cpus: float) -> str | None:
    """An error naming each deployment's cores when the replicas a config starts with reserve
    more than ``host_cpus`` (the cores Ray gives the node); None when they fit."""
    asks = core_asks(doc)
    total = sum(a.replicas * a.num_cpus for a in asks)
    if total <= host_cpus:
        return None
    return (
        f"CPU cores: the replicas this config starts with reserve {total:g} cores "
        f"({'; '.join(a.describe() for a in asks)}), and this host gives Ray {host_cpus:g}, "
        "so the rest would stay pending and the server would never be ready. Lower "
        "num_replicas (or autoscaling_config.min_replicas) or ray_actor_options.num_cpus "
        "(fractions such as 0.5 are allowed), or serve fewer applications on this host"
    )
