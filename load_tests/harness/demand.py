"""The open-loop load a scaling test needs, from what one replica carries (issue 29, item 4).

A closed loop of N clients puts ``L = X x W`` requests at the replicas (Little's law: X the
throughput, W the time a request spends there), so faster replicas lower the load the
autoscaling policy reads, and a test that needed 4 replicas stops needing them once replicas get
faster. An open loop fixes the rate instead. ``plan_demand`` takes one replica's measured rate
``r1`` and returns a rate that ``want_replicas - 1`` replicas cannot carry and ``want_replicas``
can, the in-flight cap that keeps the server's queues bounded while fewer replicas run (then
the client sends no more than the cap: it is a closed loop of that many, and ``phase_counts``
counts what it did not send), and the Little's-law figures that say why the policy must ask for
``want_replicas`` and keep them. ``phase_counts`` summarises the open-loop workers' records
(load_tests.harness.openloop) by the test's phases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from load_tests.harness.openloop import STATUS_CODES

_KIND_OF_CODE = {v: k for k, v in STATUS_CODES.items()}


class DemandError(ValueError):
    """The host or the settings cannot give a load that needs ``want_replicas``."""


@dataclass(frozen=True)
class DemandPlan:
    one_replica_per_s: float
    rate_per_s: float
    factor: float  # rate_per_s / one_replica_per_s
    in_flight_cap: int
    want_replicas: int
    target_ongoing_requests: float
    downscale_threshold: float
    backlog_growth_per_s: float  # at least, with want_replicas - 1 replicas
    up_above_load: float  # with want_replicas - 1 replicas the policy scales up past this
    utilisation_at_want: float  # at least, of each of want_replicas replicas
    min_load_at_want: float  # Little's law: at least one request in each busy replica
    down_below_load: float  # with want_replicas, the policy drops a replica under this
    reasoning: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_demand(
    one_replica_per_s: float,
    *,
    want_replicas: int,
    target_ongoing_requests: float,
    downscale_threshold: float,
    factor: float,
    min_factor: float,
    max_rate_per_s: float,
    in_flight_s: float,
    min_in_flight: int,
    max_in_flight: int,
) -> DemandPlan:
    """The open-loop rate ``min(factor x r1, max_rate_per_s)`` and its in-flight cap.

    With ``want_replicas - 1`` replicas, which carry at most ``(want_replicas - 1) x r1``
    (replicas that share a GPU and a host carry no more each than one alone), the backlog grows
    by at least ``rate - (want_replicas - 1) x r1`` a second, so the load passes
    ``target x (want_replicas - 1)`` and the policy asks for more. With ``want_replicas`` each
    replica is busy at least ``rate / (want_replicas x r1)`` of the time with at least one
    request in it, so the load is at least ``rate / r1``; it must stay above
    ``target x (want_replicas - 1) x downscale_threshold``, below which the policy would drop
    one. The cap is ``in_flight_s`` of one replica's work, within [min_in_flight,
    max_in_flight]: what one replica alone answers within about ``in_flight_s``.

    Raises DemandError when r1 is not positive, when the bound on the rate leaves it under
    ``min_factor x r1`` (too close to what ``want_replicas - 1`` carry), or when the target is
    too high for the load to hold ``want_replicas``.
    """
    if not one_replica_per_s > 0 or not math.isfinite(one_replica_per_s):
        raise DemandError(f"one replica carried {one_replica_per_s!r} requests/s: nothing to plan")
    if not want_replicas - 1 < min_factor <= factor < want_replicas:
        raise DemandError(
            f"factors must satisfy {want_replicas - 1} < min_factor ({min_factor}) <= factor "
            f"({factor}) < {want_replicas}"
        )
    r1 = float(one_replica_per_s)
    rate = min(factor * r1, max_rate_per_s)
    eff = rate / r1
    if eff < min_factor:
        raise DemandError(
            f"one replica carries {r1:.0f} requests/s, so {want_replicas} replicas are needed "
            f"only above {(want_replicas - 1) * r1:.0f}/s; the client is bounded at "
            f"{max_rate_per_s:.0f}/s ({eff:.2f} x, under {min_factor} x): send heavier requests "
            "or raise the bound on a host with more client cores"
        )
    up_above = target_ongoing_requests * (want_replicas - 1)
    down_below = target_ongoing_requests * (want_replicas - 1) * downscale_threshold
    if eff <= down_below:
        raise DemandError(
            f"at {want_replicas} replicas the load is only sure to be >= {eff:.2f} (rate / r1), "
            f"not above {down_below:.2f} = {target_ongoing_requests:g} x {want_replicas - 1} x "
            f"{downscale_threshold:g}, under which the policy drops a replica: lower "
            "target_ongoing_requests"
        )
    cap = int(min(max_in_flight, max(min_in_flight, math.ceil(r1 * in_flight_s))))
    growth = rate - (want_replicas - 1) * r1
    rho = eff / want_replicas
    reasoning = (
        f"open loop at {rate:.0f}/s = {eff:.2f} x one replica's {r1:.0f}/s. Little's law "
        f"(L = rate x time at the replicas): {want_replicas - 1} replicas carry at most "
        f"{(want_replicas - 1) * r1:.0f}/s, so their backlog grows by >= {growth:.0f}/s and "
        f"the load passes {up_above:g} = {target_ongoing_requests:g} x {want_replicas - 1}: "
        f"the policy asks for {want_replicas}. {want_replicas} replicas are each busy >= "
        f"{rho:.1%} of the time with >= 1 request, so L >= {eff:.2f} > {down_below:.2f}, "
        "under which alone the policy would drop one."
    )
    return DemandPlan(
        one_replica_per_s=r1,
        rate_per_s=rate,
        factor=eff,
        in_flight_cap=cap,
        want_replicas=want_replicas,
        target_ongoing_requests=target_ongoing_requests,
        downscale_threshold=downscale_threshold,
        backlog_growth_per_s=growth,
        up_above_load=up_above,
        utilisation_at_want=rho,
        min_load_at_want=eff,
        down_below_load=down_below,
        reasoning=reasoning,
    )


def phase_counts(
    arrays: Sequence[np.ndarray],
    offset_s: float,
    phases: Sequence[Mapping[str, Any]],
    end_s: float,
) -> list[dict[str, Any]]:
    """Per phase, what the open-loop workers did with the requests scheduled in it.

    ``arrays``: per worker, rows (scheduled s, latency s, send lag s, status) as
    load_tests.harness.openloop records them, the times from the workers' start;
    ``offset_s``: that start in the phases' clock; ``phases``: ``{"name", "t_s"}`` in order,
    each lasting until the next (the last until ``end_s``). ``dropped`` were not sent (the
    in-flight cap: the client was a closed loop then); ``failed`` were sent and got anything
    but a 2xx (transport errors and timeouts included), by kind in ``failed_by``."""
    if arrays:
        rec = np.concatenate([np.asarray(a, dtype=np.float64) for a in arrays], axis=1)
    else:
        rec = np.zeros((4, 0))
    times = rec[0] + offset_s
    latency, status = rec[1], rec[3].astype(np.int64)
    out = []
    for k, phase in enumerate(phases):
        start = float(phase["t_s"])
        stop = float(phases[k + 1]["t_s"]) if k + 1 < len(phases) else end_s
        span = max(0.0, stop - start)
        inside = (times >= start) & (times < stop)
        dropped = inside & (status == STATUS_CODES["dropped"])
        ok = inside & (status >= 200) & (status < 300)
        failed = inside & ~ok & ~dropped
        failed_by: dict[str, int] = {}
        for code in status[failed]:
            kind = str(int(code)) if code > 0 else _KIND_OF_CODE.get(int(code), "read")
            failed_by[kind] = failed_by.get(kind, 0) + 1
        lat = latency[ok]
        p50, p99 = (np.percentile(lat, [50.0, 99.0]) * 1e3) if lat.size else (None, None)
        out.append(
            {
                "name": phase["name"],
                "start_s": round(start, 2),
                "span_s": round(span, 2),
                "scheduled": int(inside.sum()),
                "scheduled_per_s": round(int(inside.sum()) / span, 1) if span else None,
                "sent": int((inside & ~dropped).sum()),
                "dropped": int(dropped.sum()),
                "ok": int(ok.sum()),
                "ok_per_s": round(int(ok.sum()) / span, 1) if span else None,
                "failed": int(failed.sum()),
                "failed_by": failed_by,
                "p50_ms": None if p50 is None else round(float(p50), 2),
                "p99_ms": None if p99 is None else round(float(p99), 2),
            }
        )
    return out
