"""The packing solver: replicas x share for each model on each GPU, from measurements as data.

Pure: no Ray, no GPU, no files. It takes a ``Problem`` (what was measured and what is asked)
and returns a ``Plan`` or raises ``Infeasible`` naming what cannot be met. The search is an
exact mixed-integer program (scipy's HiGHS, ``mip_rel_gap`` 0), so a plan's throughput is
optimal for its model of the world (a search past 30 s is refused, never returned unproven),
and the properties in tests/unit/plan/test_solver.py hold by construction:

- memory: on each GPU the shares, in Ray's unit (1/10000 of a GPU), fit the GPU less its
  reserve; a share is the model's budget in bytes over the smallest GPU, rounded up;
- cores: the replicas' ``num_cpus``, plus the ingress's CPU (the rate the GPU's replicas carry
  times each model's ``ingress_cpu_s_per_request``), fit the GPU's cores less their reserve;
- GPU time: the requests each GPU serves, times each model's GPU seconds per request, fit one
  second per second less a reserve (time-slicing; under MPS kernels overlap, so it is a bound);
- p99: a model's load, split evenly over its replicas (as HAProxy does), keeps each replica at
  or below the rate at which the p99 model meets the target, and at or below ``max_utilization``
  of the replica's saturation rate;
- the objective: total weighted throughput, at each model's stated load, or for a model stated
  by weight only, the most it can serve within its p99 target.

The p99 model is an M/M/1 tail over a measured floor (docs/planning.md): a replica that serves
``mu`` requests a second at saturation, with a p99 of ``p99_idle_s`` when idle, has at a
per-replica rate ``lam`` a p99 of ``p99_idle_s + ln(100) / (mu - lam)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from serve_app.config.shares import budget_units

UNITS = 10_000  # Ray's resource granularity, as config/shares.py
TAIL = math.log(100.0)  # the 99th percentile of an exponential wait, in units of its mean


class Infeasible(ValueError):
    """No plan meets every model's minimum replicas, load and p99 target on these GPUs."""


@dataclass(frozen=True)
class Candidate:
    """One way to run a model's replicas: a batch cap, the bytes it needs, what it serves."""

    batch_size: int
    budget_bytes: int  # context + weights + graph pool + activation peak at this batch, + margin
    throughput_rps: float  # one replica at saturation (its CPU bound already applied)
    p99_idle_s: float
    gpu_s_per_request: float

    def rate_within(self, target_s: float, max_utilization: float = 1.0) -> float:
        """The highest per-replica rate whose predicted p99 meets ``target_s``, and at most
        ``max_utilization`` of saturation (0: none)."""
        slack = target_s - self.p99_idle_s
        if slack <= 0:
            return 0.0
        tail = max(0.0, self.throughput_rps - TAIL / slack)
        return min(tail, max_utilization * self.throughput_rps)

    def p99_at(self, rate_rps: float) -> float:
        if rate_rps >= self.throughput_rps:
            return math.inf
        return self.p99_idle_s + TAIL / (self.throughput_rps - rate_rps)


@dataclass(frozen=True)
class ModelAsk:
    name: str
    candidates: tuple[Candidate, ...]
    p99_target_s: float
    load_rps: float | None = None  # None: serve as much as it can, weighted
    weight: float = 1.0
    min_replicas: int = 1
    max_replicas: int = 64
    num_cpus: float = 1.0
    ingress_cpu_s_per_request: float = 0.0  # HAProxy's (and Ray's proxy's) CPU a request costs
    # A replica is planned at most this fraction of its saturation rate: the M/M/1 tail alone
    # would plan a batching replica within a few requests/s of its measured peak.
    max_utilization: float = 1.0


@dataclass(frozen=True)
class Gpu:
    name: str
    total_bytes: int
    cores: float  # the host's CPU cores that go with this GPU


@dataclass(frozen=True)
class Reserve:
    memory_bytes: int = 0  # per GPU
    cores: float = 0.0  # per GPU
    gpu_time: float = 0.0  # per GPU, a fraction of each second


@dataclass(frozen=True)
class Problem:
    models: tuple[ModelAsk, ...]
    gpus: tuple[Gpu, ...]
    reserve: Reserve = field(default_factory=Reserve)


@dataclass(frozen=True)
class ModelPlan:
    name: str
    candidate: Candidate
    share_units: int  # ray_actor_options.num_gpus x 10000
    replicas: tuple[int, ...]  # per GPU
    throughput_rps: float  # predicted: the stated load, or the most within the p99 target
    p99_s: float  # predicted at that throughput, split evenly

    @property
    def total_replicas(self) -> int:
        return sum(self.replicas)

    @property
    def num_gpus(self) -> float:
        return self.share_units / UNITS


@dataclass(frozen=True)
class GpuUse:
    gpu: Gpu
    units: int  # shares in Ray's unit
    units_cap: int
    memory_bytes: int  # what the replicas' budgets hold on this GPU
    memory_cap_bytes: int
    cores: float  # the replicas' num_cpus
    ingress_cores: float  # the ingress's CPU for the requests this GPU's replicas carry
    cores_cap: float
    gpu_time: float
    gpu_time_cap: float
    # The GPU time when the router spreads each model's requests evenly over its replicas, as
    # HAProxy does; on several GPUs it may differ from the plan's per-GPU rates (docs/planning.md).
    gpu_time_even_split: float
    binds: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    models: tuple[ModelPlan, ...]
    gpus: tuple[GpuUse, ...]
    objective: float  # total weighted throughput, requests a second


def share_units(budget_bytes: int, total_bytes: int) -> int:
    """The share, in Ray's 1/10000 of a GPU, whose booked budget on this GPU is at least
    ``budget_bytes`` (config/shares.budget_units)."""
    return budget_units(budget_bytes, total_bytes)


def units_cap(gpu: Gpu, reserve_bytes: int) -> int:
    """The units of this GPU that the replicas may hold: its memory less the reserve."""
    room = gpu.total_bytes - reserve_bytes
    return max(0, min(UNITS, room * UNITS // gpu.total_bytes))


def solve(problem: Problem) -> Plan:
    """The plan with the most weighted throughput; Infeasible when none meets every ask."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    models, gpus, reserve = problem.models, problem.gpus, problem.reserve
    if not gpus:
        raise Infeasible("no GPUs to plan for")
    smallest = min(g.total_bytes for g in gpus)
    cands: list[list[Candidate]] = []
    for m in models:
        usable = [
            c
            for c in m.candidates
            if m.load_rps is None or c.rate_within(m.p99_target_s, m.max_utilization)
        ]
        if not usable:
            raise Infeasible(
                f"{m.name}: no candidate meets the p99 target of {m.p99_target_s:g} s even at a "
                "low load (its idle p99 or saturation throughput); raise p99_target_s"
            )
        fits = [c for c in usable if share_units(c.budget_bytes, smallest) <= UNITS]
        if not fits:
            raise Infeasible(f"{m.name}: no candidate's budget fits the smallest GPU ({smallest})")
        cands.append(fits)
    n_gpu = len(gpus)
    # Variables: r[m,c,g] (int), y[m,c] (bin), s[m,k] (bin, load models), t[m,g] (load models).
    index: dict[tuple[str, ...], int] = {}

    def var(*key: object) -> int:
        k = tuple(str(x) for x in key)
        if k not in index:
            index[k] = len(index)
        return index[k]

    for i in range(len(models)):
        for c in range(len(cands[i])):
            var("y", i, c)
            for g in range(n_gpu):
                var("r", i, c, g)
                var("x", i, c, g)  # the rate its replicas on g carry, at most their p99's
    n = len(index)
    rows: list[tuple[dict[int, float], float, float]] = []
    lo, hi = np.zeros(n), np.full(n, np.inf)
    integral = np.zeros(n)
    for key, j in index.items():
        if key[0] in ("r", "y"):
            integral[j] = 1
        if key[0] == "y":
            hi[j] = 1
        if key[0] == "r":
            hi[j] = models[int(key[1])].max_replicas
    for i, m in enumerate(models):
        rows.append(({var("y", i, c): 1.0 for c in range(len(cands[i]))}, 1, 1))
        all_r = {var("r", i, c, g): 1.0 for c in range(len(cands[i])) for g in range(n_gpu)}
        rows.append((all_r, m.min_replicas, m.max_replicas))
        for c in range(len(cands[i])):
            for g in range(n_gpu):
                rows.append(({var("r", i, c, g): 1.0, var("y", i, c): -m.max_replicas}, -np.inf, 0))
        xs = {}
        for c, cand in enumerate(cands[i]):
            rate = cand.rate_within(m.p99_target_s, m.max_utilization)
            for g in range(n_gpu):
                xs[var("x", i, c, g)] = 1.0
                rows.append(({var("x", i, c, g): 1.0, var("r", i, c, g): -rate}, -np.inf, 0))
        if m.load_rps is not None:  # its load, carried within the p99 target
            rows.append((xs, m.load_rps, m.load_rps))
    for g, gpu in enumerate(gpus):
        mem: dict[int, float] = {}
        cores: dict[int, float] = {}
        busy: dict[int, float] = {}
        for i, m in enumerate(models):
            for c, cand in enumerate(cands[i]):
                j = var("r", i, c, g)
                mem[j] = share_units(cand.budget_bytes, smallest)
                cores[j] = m.num_cpus
                busy[var("x", i, c, g)] = cand.gpu_s_per_request
                if m.ingress_cpu_s_per_request > 0:
                    cores[var("x", i, c, g)] = m.ingress_cpu_s_per_request
        rows.append((mem, -np.inf, units_cap(gpu, reserve.memory_bytes)))
        # With the ingress's rates on the row, a hair under the cap, as GPU time's below.
        hair = 1e-5 if any(m.ingress_cpu_s_per_request > 0 for m in models) else -1e-9
        rows.append((cores, -np.inf, gpu.cores - reserve.cores - hair))
        # A hair under the cap: HiGHS keeps rows within 1e-6, the plan must keep the cap itself.
        rows.append((busy, -np.inf, 1.0 - reserve.gpu_time - 1e-5))
    gain = np.zeros(n)
    for i, m in enumerate(models):
        if m.load_rps is None:
            for c in range(len(cands[i])):
                for g in range(n_gpu):
                    gain[var("x", i, c, g)] = m.weight
    matrix = np.zeros((len(rows), n))
    for row_i, (coefs, _, _) in enumerate(rows):
        for j, v in coefs.items():
            matrix[row_i, j] = v
    cons = [LinearConstraint(matrix, [r[1] for r in rows], [r[2] for r in rows])]
    opts = {"mip_rel_gap": 0.0, "time_limit": 30.0}
    first = milp(-gain, constraints=cons, integrality=integral, bounds=Bounds(lo, hi), options=opts)
    if first.status == 2:
        raise Infeasible(_why_infeasible(problem))
    if first.status != 0 or first.x is None:  # the time limit: no plan proven the best
        raise Infeasible(f"the search did not finish in {opts['time_limit']:g} s: {first.message}")
    best = float(gain @ first.x)
    # Second pass: among the best plans, the one holding the fewest shares (room to spare). Its
    # throughput is the first pass's optimum; only the tidying is bounded (0.5 s, best found).
    units_cost = np.zeros(n)
    for key, j in index.items():
        if key[0] == "r":
            cand = cands[int(key[1])][int(key[2])]
            units_cost[j] = share_units(cand.budget_bytes, smallest)
    keep = LinearConstraint(gain.reshape(1, -1), best - 1e-7 * max(1.0, best), np.inf)
    second = milp(units_cost, constraints=[*cons, keep], integrality=integral,
                  bounds=Bounds(lo, hi), options={**opts, "time_limit": 0.5})  # fmt: skip
    x = second.x if second.x is not None else first.x
    return _read_plan(problem, cands, index, np.round(x, 6), smallest)


def _why_infeasible(problem: Problem) -> str:
    asks = "; ".join(
        f"{m.name}: at least {m.min_replicas} replica(s)"
        + (f", {m.load_rps:g} req/s within {m.p99_target_s:g} s" if m.load_rps else "")
        for m in problem.models
    )
    room = ", ".join(f"{g.name} ({g.total_bytes:,} bytes, {g.cores:g} cores)" for g in problem.gpus)
    costs = [
        f"{m.name} {m.ingress_cpu_s_per_request:g}"
        for m in problem.models
        if m.ingress_cpu_s_per_request > 0
    ]
    ingress = f", with the ingress's CPU s a request on the cores ({', '.join(costs)})"
    return (
        f"no plan fits: {asks}; on {room}, less the reserve "
        f"({problem.reserve.memory_bytes:,} bytes, {problem.reserve.cores:g} cores, "
        f"{problem.reserve.gpu_time:g} of GPU time) per GPU{ingress if costs else ''}. Lower a "
        "load or a minimum, raise a p99 target, or add GPUs"
    )


def _read_plan(
    problem: Problem,
    cands: list[list[Candidate]],
    index: dict[tuple[str, ...], int],
    x: np.ndarray,
    smallest: int,
) -> Plan:
    n_gpu = len(problem.gpus)
    chosen, rates = [], []  # rates: the requests a second each model's replicas carry, per GPU
    for i, m in enumerate(problem.models):
        c = max(range(len(cands[i])), key=lambda c: x[index[("y", str(i), str(c))]])
        reps = tuple(int(round(x[index[("r", str(i), str(c), str(g))]])) for g in range(n_gpu))
        per_gpu = [max(0.0, float(x[index[("x", str(i), str(c), str(g))]])) for g in range(n_gpu)]
        if m.load_rps is not None and sum(per_gpu) > 0:  # exactly its load, not the solver's float
            per_gpu = [rate * m.load_rps / sum(per_gpu) for rate in per_gpu]
        chosen.append((cands[i][c], reps))
        rates.append(per_gpu)
    _trim_to_gpu_time(problem, [cand for cand, _ in chosen], rates)
    plans = []
    for m, (cand, reps), per_gpu in zip(problem.models, chosen, rates, strict=True):
        total = sum(reps)
        tput = m.load_rps if m.load_rps is not None else sum(per_gpu)
        worst = tput / total if total else 0.0  # HAProxy splits evenly over the replicas
        units = share_units(cand.budget_bytes, smallest)
        plans.append(ModelPlan(m.name, cand, units, reps, tput, cand.p99_at(worst)))
    uses = []
    for g, gpu in enumerate(problem.gpus):
        units = sum(p.share_units * p.replicas[g] for p in plans)
        mem = sum(int(p.share_units / UNITS * gpu.total_bytes) * p.replicas[g] for p in plans)
        cores = sum(m.num_cpus * p.replicas[g] for m, p in zip(problem.models, plans, strict=True))
        ingress = sum(
            r[g] * m.ingress_cpu_s_per_request for r, m in zip(rates, problem.models, strict=True)
        )
        busy = sum(r[g] * p.candidate.gpu_s_per_request for r, p in zip(rates, plans, strict=True))
        even = sum(
            p.throughput_rps
            * p.replicas[g]
            / max(1, p.total_replicas)
            * p.candidate.gpu_s_per_request
            for p in plans
        )
        caps = (
            units_cap(gpu, problem.reserve.memory_bytes),
            gpu.cores - problem.reserve.cores,
            1.0 - problem.reserve.gpu_time,
        )
        uses.append(
            GpuUse(
                gpu=gpu,
                units=units,
                units_cap=caps[0],
                memory_bytes=mem,
                memory_cap_bytes=gpu.total_bytes - problem.reserve.memory_bytes,
                cores=cores,
                ingress_cores=ingress,
                cores_cap=caps[1],
                gpu_time=busy,
                gpu_time_cap=caps[2],
                gpu_time_even_split=even,
                binds=_binds(problem, plans, units, cores + ingress, busy, caps),
            )
        )
    objective = sum(m.weight * p.throughput_rps for m, p in zip(problem.models, plans, strict=True))
    return Plan(tuple(plans), tuple(uses), objective)


def _trim_to_gpu_time(problem: Problem, cands: list[Candidate], rates: list[list[float]]) -> None:
    """The solver keeps rows within its tolerance (about 1e-6), and a time-limited tidying pass
    returns its best incumbent: where a GPU's time comes out over its cap by that much, the
    weighted models' rates there are lowered to fit (stated loads are kept)."""
    cap = 1.0 - problem.reserve.gpu_time
    for g in range(len(problem.gpus)):
        busy = sum(r[g] * c.gpu_s_per_request for r, c in zip(rates, cands, strict=True))
        flexible = sum(
            r[g] * c.gpu_s_per_request
            for m, r, c in zip(problem.models, rates, cands, strict=True)
            if m.load_rps is None
        )
        if busy <= cap or flexible <= 0:
            continue
        keep = max(0.0, 1.0 - (busy - cap) / flexible) * (1 - 1e-12)
        for m, r in zip(problem.models, rates, strict=True):
            if m.load_rps is None:
                r[g] *= keep


def _binds(
    problem: Problem,
    plans: list[ModelPlan],
    units: int,
    cores: float,
    busy: float,
    caps: tuple[int, float, float],
) -> tuple[str, ...]:
    """The resources of a GPU that would refuse one more replica of any model (memory; cores,
    the ingress's among them), and GPU time when it is spent (within a thousandth)."""
    binds = []
    if all(units + p.share_units > caps[0] for p in plans):
        binds.append("memory")
    if all(cores + m.num_cpus > caps[1] + 1e-9 for m in problem.models):
        binds.append("cores")
    if busy >= caps[2] - 1e-3:
        binds.append("GPU time")
    return tuple(binds)
