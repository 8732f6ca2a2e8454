"""A replica's report: its partition's memory figures and how it serves (batches, calibration,
start-up, CUDA graphs, its queue), posted to the registry every REPORT_PERIOD_S and shown by
``GET /v1/memory`` and ``serve-app status``."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import ray
import torch

from serve_app.gpu.partition import PartitionFigures
from serve_app.serving.batcher import Batcher
from serve_app.serving.gcwatch import GcFigures
from serve_app.startup.pipeline import Started
from serve_app.startup.warmpool import PoolReport

REPORT_PERIOD_S = 1.0
REPORT_MAX_AGE_S = 5.0


@dataclass
class BatchStats:
    """What the replica's batches did."""

    batches: int = 0
    batched_items: int = 0
    largest_batch: int = 0
    oom_recoveries: int = 0
    busy_s: float = 0.0  # time the model thread spent running batches

    def count(self, items: int, took_s: float) -> None:
        self.batches += 1
        self.batched_items += items
        self.largest_batch = max(self.largest_batch, items)
        self.busy_s += took_s


@dataclass
class FirstRequest:
    """When the replica answered its first request."""

    since_process_s: float | None = None  # process start to the first answer
    since_imports_s: float | None = None  # serve_app's import (the replica's start) to it

    def seen(self, started: Started) -> bool:
        """Record now as the first answer; False when one was recorded before."""
        if self.since_process_s is not None:
            return False
        now = time.time()
        self.since_process_s = round(now - started.process_started_s, 3)
        self.since_imports_s = round(now - started.imports_started_s, 3)
        return True


class ReplicaReport(PartitionFigures):
    """One replica's report (integer bytes, seconds as floats)."""

    replica_id: str
    app: str
    application: str  # the Serve application (``app`` is the model's name)
    route: str  # the model's route below the application's prefix
    model_card: dict[str, Any]  # what GET /v1/models shows of the model (serving/index)
    pid: int
    node_id: str
    calibrated_batch_size: int | None
    calibration_source: str | None
    calibration_peak_bytes: int | None
    calibration_next_size: int | None
    calibration_next_outcome: int | str | None
    max_batch_size: int
    oom_recoveries: int
    batches: int
    batched_items: int
    largest_batch: int
    batch_busy_s: float
    warmup_s: float | None
    warmup_pending: int
    startup_phases_s: dict[str, float]
    model: dict[str, Any]
    first_request_s: float | None
    first_request_since_imports_s: float | None
    process_started_at_s: float
    imports_started_at_s: float
    preloaded_worker: bool
    worker_waited_s: float | None
    torch_threads: int
    warm_workers: PoolReport | None
    cuda_graphs: int
    cuda_graphs_at_start: int
    cuda_graphs_pending: int
    cuda_graph_capture_s: float | None
    cuda_graph_pool_bytes: int | None
    cuda_graph_limit_bytes: int | None
    cuda_graph_outside_torch_bytes: int | None
    cuda_graphs_over_limit: int
    cuda_graph_replays: int
    queued_items: int
    rejected_requests: int
    expired_requests: int
    reported_at_s: float
    gc: GcFigures | None  # collections and their pauses by generation (serving/gcwatch)


def replica_report(
    *,
    replica_id: str,
    application: str,
    started: Started,
    batch_cap: int,
    stats: BatchStats,
    first: FirstRequest,
    batcher: Batcher[Any, Any],
    warm_workers: PoolReport | None,
) -> ReplicaReport:
    """The report of a replica that started as ``started``."""
    calib = started.cap.calibration
    backend = started.model.backend
    graph_set = backend.graphs
    graphs = graph_set.describe() if graph_set is not None else None
    warmup = started.warmup
    return ReplicaReport(
        **started.partition.report(),
        replica_id=replica_id,
        app=started.model.name,
        application=application,
        route=started.model.spec.route,
        model_card=backend.describe(),
        pid=os.getpid(),
        node_id=ray.get_runtime_context().get_node_id(),
        calibrated_batch_size=calib.batch_size if calib else None,
        calibration_source=started.cap.source,
        calibration_peak_bytes=calib.peak_bytes if calib else None,
        calibration_next_size=calib.first_failure_size if calib else None,
        calibration_next_outcome=calib.first_failure if calib else None,
        max_batch_size=batch_cap,
        oom_recoveries=stats.oom_recoveries,
        batches=stats.batches,
        batched_items=stats.batched_items,
        largest_batch=stats.largest_batch,
        batch_busy_s=round(stats.busy_s, 6),
        warmup_s=round(warmup.seconds, 3) if warmup else None,
        warmup_pending=len(warmup.pending) if warmup else 0,
        startup_phases_s=started.phases_s,
        model=backend.report(),
        first_request_s=first.since_process_s,
        first_request_since_imports_s=first.since_imports_s,
        process_started_at_s=started.process_started_s,
        imports_started_at_s=started.imports_started_s,
        preloaded_worker=started.preloaded,
        worker_waited_s=started.waited_s,
        torch_threads=torch.get_num_threads(),
        warm_workers=warm_workers,
        cuda_graphs=graphs["graphs"] if graphs else 0,
        cuda_graphs_at_start=graphs["graphs_at_start"] if graphs else 0,
        cuda_graphs_pending=graphs["pending"] if graphs else 0,
        cuda_graph_capture_s=graphs["capture_s"] if graphs else None,
        cuda_graph_pool_bytes=graphs["pool_bytes"] if graphs else None,
        cuda_graph_limit_bytes=graphs["limit_bytes"] if graphs else None,
        cuda_graph_outside_torch_bytes=graphs["outside_torch_bytes"] if graphs else None,
        cuda_graphs_over_limit=graphs["skipped_over_limit"] if graphs else 0,
        cuda_graph_replays=graph_set.replays if graph_set is not None else 0,
        queued_items=batcher.queued,
        rejected_requests=batcher.rejected_requests,
        expired_requests=batcher.expired_requests,
        reported_at_s=time.time(),
        gc=started.gc.describe() if started.gc else None,
    )
