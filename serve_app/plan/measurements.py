"""The measurements file ``serve-app plan`` reads (JSON), its schema, and the solver's problem.

The schema is documented in docs/planning.md; ``examples/planning/rag-stack-measurements.json``
is a worked file whose ``sources`` cite the committed results each figure comes from. Nothing
here measures: ``serve-app plan --measure`` (serve_app.plan.measure) writes such a file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from serve_app.config.args import validation_messages
from serve_app.errors import ConfigError
from serve_app.gpu.budget import GRAPH_MIN_ROOM_BYTES, GRAPH_POOL_ROOM_SHARE
from serve_app.plan.solver import Candidate, Gpu, ModelAsk, Problem, Reserve

FORMAT = 1
# The most of a replica's measured saturation rate a plan asks of it: headroom below the peak for
# an open-loop p99 (issue 28 judges p99 at 80% of peak); the tail model alone leaves none.
MAX_UTILIZATION = 0.8
UTILIZATION_HELP = "the most of a replica's saturation rate a plan asks of it"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuSpec(_Strict):
    name: str = Field(min_length=1, max_length=200)
    total_bytes: int = Field(gt=0, description="NVML's total memory of one GPU")
    cores: float = Field(gt=0, description="the host's CPU cores that go with each such GPU")
    count: int = Field(default=1, ge=1, le=64)


class ReserveSpec(_Strict):
    memory_bytes: int = Field(default=0, ge=0, description="per GPU, kept free of budgets")
    cores: float = Field(
        default=0.0, ge=0, description="per GPU: Ray, the OS, an unmeasured ingress"
    )
    gpu_time: float = Field(default=0.0, ge=0, lt=1, description="per GPU, a fraction")


class CandidateSpec(_Strict):
    batch_size: int = Field(ge=1, le=65536)
    throughput_rps: float = Field(gt=0, description="one replica at saturation, requests/s")
    p99_idle_s: float = Field(gt=0, description="one replica's p99 at a low load")
    gpu_s_per_request: float = Field(ge=0, description="GPU busy seconds per request")


class ModelSpec(_Strict):
    context_bytes: int = Field(ge=0, description="CUDA context and memory outside torch")
    weights_bytes: int = Field(ge=0)
    graph_pool_bytes: int = Field(default=0, ge=0, description="CUDA graphs' pool")
    activation_peak_bytes: dict[int, int] = Field(description="batch size -> peak bytes")
    candidates: list[CandidateSpec] = Field(min_length=1)
    cpu_s_per_request: float = Field(gt=0, description="CPU seconds one request costs")
    ingress_cpu_s_per_request: float = Field(
        default=0.0, ge=0, description="CPU seconds one request costs the ingress (HAProxy)"
    )
    num_cpus: float = Field(default=1.0, gt=0)
    p99_target_s: float = Field(gt=0)
    load_rps: float | None = Field(default=None, gt=0, description="stated load; null: weight")
    weight: float = Field(default=1.0, gt=0)
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=16, ge=1, le=256)
    sources: dict[str, str] = Field(
        default_factory=dict, description="field -> where the figure comes from, or ASSUMPTION"
    )

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        missing = [
            c.batch_size for c in self.candidates if c.batch_size not in self.activation_peak_bytes
        ]
        if missing:
            raise ValueError(f"candidates at batch sizes {missing} have no activation_peak_bytes")
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas is larger than max_replicas")
        return self


class Measurements(_Strict):
    format: Literal[1] = 1
    mode: Literal["time-sliced", "mps"] = "time-sliced"
    margin_fraction: float = Field(default=0.1, ge=0, le=1, description="added to each budget")
    max_utilization: float = Field(
        default=MAX_UTILIZATION, gt=0, le=1, description=UTILIZATION_HELP
    )
    gpus: list[GpuSpec] = Field(min_length=1)
    reserve: ReserveSpec = Field(default_factory=ReserveSpec)
    models: dict[str, ModelSpec] = Field(min_length=1, description="application name -> model")
    notes: list[str] = Field(default_factory=list)


def budget_bytes(model: ModelSpec, batch_size: int, margin_fraction: float) -> int:
    """A replica's budget at a batch cap: context, weights, graph pool and the batch's peak,
    plus the margin (allocator fragmentation, what calibration's next step may need).

    A model measured with CUDA graphs (``graph_pool_bytes`` > 0) gets at least the room beside
    its weights that a replica needs to capture them (GRAPH_MIN_ROOM_BYTES, and twice the pool:
    the pool may hold GRAPH_POOL_ROOM_SHARE of the room). Under that a replica runs eagerly
    (serve_app.startup.capture), slower and with more CPU a request than it was measured at.
    """
    base = model.context_bytes + model.weights_bytes
    need = math.ceil(
        (base + model.graph_pool_bytes + model.activation_peak_bytes[batch_size])
        * (1 + margin_fraction)
    )
    if model.graph_pool_bytes <= 0:
        return need
    room = max(GRAPH_MIN_ROOM_BYTES, math.ceil(model.graph_pool_bytes / GRAPH_POOL_ROOM_SHARE))
    return max(need, math.ceil(base * (1 + margin_fraction)) + room)


def to_problem(m: Measurements) -> Problem:
    models = []
    for name, spec in m.models.items():
        cpu_bound = spec.num_cpus / spec.cpu_s_per_request
        cands = tuple(
            Candidate(
                batch_size=c.batch_size,
                budget_bytes=budget_bytes(spec, c.batch_size, m.margin_fraction),
                throughput_rps=min(c.throughput_rps, cpu_bound),
                p99_idle_s=c.p99_idle_s,
                gpu_s_per_request=c.gpu_s_per_request,
            )
            for c in spec.candidates
        )
        models.append(
            ModelAsk(
                name=name,
                candidates=cands,
                p99_target_s=spec.p99_target_s,
                load_rps=spec.load_rps,
                weight=spec.weight,
                min_replicas=spec.min_replicas,
                max_replicas=spec.max_replicas,
                num_cpus=spec.num_cpus,
                ingress_cpu_s_per_request=spec.ingress_cpu_s_per_request,
                max_utilization=m.max_utilization,
            )
        )
    gpus = tuple(Gpu(g.name, g.total_bytes, g.cores) for g in m.gpus for _ in range(g.count))
    r = m.reserve
    return Problem(tuple(models), gpus, Reserve(r.memory_bytes, r.cores, r.gpu_time))


def load_measurements(path: str | Path) -> Measurements:
    """Read and validate a measurements file; ConfigError naming each bad field."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{p}: cannot read the measurements ({exc})") from None
    try:
        return Measurements.model_validate(raw)
    except ValidationError as exc:
        lines = validation_messages(exc, prefix="")
        raise ConfigError(f"{p}: invalid measurements:\n  " + "\n  ".join(lines)) from None
