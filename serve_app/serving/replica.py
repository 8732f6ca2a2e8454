"""The model deployment: it is the HTTP ingress itself (no extra DeploymentHandle hop), runs the
adapter under its memory cap with dynamic batching, and reports its figures."""

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import ray
import torch
from ray import serve
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from serve_app import env
from serve_app.config.args import AppArgs, parse_args
from serve_app.control.monitor import WatchedReplica, get_or_create_monitor
from serve_app.control.policy import replica_autoscaling_stats
from serve_app.errors import (
    BadRequest,
    InsufficientMemory,
    ItemError,
    NotFound,
    Overloaded,
)
from serve_app.gpu import calibcache
from serve_app.gpu.budget import format_bytes
from serve_app.ops.status import by_node_and_gpu, cluster_view, placement_groups
from serve_app.serving import poison, readiness
from serve_app.serving.auth import PROTECTED_PATHS, ApiKeys
from serve_app.serving.batcher import Batcher
from serve_app.serving.http import Ingress, error_response, guarded, json_response, read_body
from serve_app.serving.metrics import ReplicaMetrics
from serve_app.serving.oom import (
    ItemTooLarge,
    is_torch_oom,
    lowered_batch_cap,
    predict_with_oom_split,
)
from serve_app.serving.openapi import build_openapi
from serve_app.serving.registry import get_registry
from serve_app.startup import warmpool
from serve_app.startup.pipeline import start_replica
from serve_app.testing import faults

logger = logging.getLogger("serve_app")
REPORT_PERIOD_S = 1.0
REPORT_MAX_AGE_S = 5.0

# Bodies up to this size decode on the event loop when the adapter says its decode is cheap
# (decode_inline); larger ones, and every body of an adapter whose decode is not, go to a thread.
INLINE_DECODE_MAX_BYTES = 64 * 1024
# Under load, the batcher's step between batches captures the shapes that batches wanted
# (GraphSet.want) for up to this long, and does nothing else: a replica that starts under load
# gets its busy shapes graphed at once, while the rest of start-up's deferred work (graphs of
# other shapes, warm-up batches) waits for an idle moment. Doing that rest under load, one step
# every 0.5 s, cost 8 MiniLM replicas on one H200 more than half their throughput at one text
# per request for the first minute (docs/controller.md).
WANTED_CAPTURE_S = 0.25
EMPTY_QUERY: dict[str, str] = {}


# Ray's per-request access log line took about 15% of a loaded replica's event loop in the
# profile (docs/benchmarks.md); it is off by default and a config turns it back on with
# `logging_config: {enable_access_log: true}` on the deployment.
# Serve's health check (check_health: a tiny GPU operation that raises once the CUDA context is
# poisoned; it waits for the batch the GPU is running, a few seconds at most) every 5 s with a
# 5 s timeout: three failures in a row, ~20 s after a replica hangs, and Serve replaces it
# (force-stopped: launch.FORCE_STOP_UNHEALTHY_VAR). HAProxy takes it out of rotation sooner, on
# its own check of /-/healthz (launch.HAPROXY_HEALTH_CHECK_DEFAULTS).
@serve.deployment(
    name="model",
    max_ongoing_requests=512,
    health_check_period_s=5.0,
    health_check_timeout_s=5.0,
    logging_config={"enable_access_log": False},
)
@serve.ingress()
class ModelServer:
    """One model replica: decode, batch, predict under the cap, encode."""

    def __init__(self, args: dict[str, Any] | AppArgs):
        self.args = args if isinstance(args, AppArgs) else parse_args(args)
        ctx = serve.get_replica_context()
        self.replica_id = str(ctx.replica_id.unique_id) if ctx else f"local-{os.getpid()}"
        assigned = ray.get_runtime_context().get_assigned_resources()
        # Everything up to serving: partition (first: under MPS it must precede CUDA), weights,
        # graphs, calibration, warm-up (startup.start_replica).
        started = start_replica(self.args, float(assigned.get("GPU", 0.0)))
        self.partition = started.partition
        self.adapter = started.adapter
        self.batch_cap = started.batch_cap
        self.calibration: Any = started.calibration
        self.calibration_source = started.calibration_source
        self._calibration_entry = started.calibration_entry
        self.warmup = started.warmup  # its batches left pending run between batches
        self.startup_phases_s = started.phases_s
        self._process_started_s = started.process_started_s
        self._imports_started_s = started.imports_started_s
        self._preloaded = started.preloaded
        self._waited_s = started.waited_s
        self.first_request_s: float | None = None  # process start to the first answer
        # the start of serve_app's import (the replica's own start) to the first answer
        self.first_request_since_imports_s: float | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="predict")
        self._capture_lock = threading.Lock()  # graph capture between batches vs check_health
        self._served_by = {"x-serve-app-replica": self.replica_id}
        self._api_keys = ApiKeys(env.api_keys())  # from the environment, never the config
        self._batcher: Batcher[Any, Any] = Batcher(
            self._run_batch,
            self._executor,
            self.batch_cap,
            self.args.batch_wait_timeout_s,
            max_queued_items=self.args.max_queued_items,
            queue_deadline_s=self.args.queue_deadline_s,
            idle_work=self._work_between_batches if self._start_up_left() else None,
        )
        self.oom_recoveries = 0
        self.batches = 0
        self.batched_items = 0
        self.largest_batch = 0
        self.batch_busy_s = 0.0  # time the model worker spent running batches
        self.started_at_s = time.time()
        self._stop = threading.Event()
        self._registry = get_registry()
        self._metrics = ReplicaMetrics()
        if self.partition.gpu_uuid is not None:
            # The node's NVML sampler: the report's GPU totals, and this replica's bytes
            # watched against its budget (escapes).
            self._watch_budget(get_or_create_monitor())
        threading.Thread(target=self._report_loop, name="report", daemon=True).start()
        # The next replica on this node, a scale-up or a replacement, starts in a worker that
        # is already running with the imports done (warmpool).
        self._warm_workers = warmpool.start_keeper(self.args.warm_workers)
        logger.info(
            "replica %s ready: %s on %s, max batch %d",
            self.replica_id,
            self.args.model_name,
            self.partition.device,
            self.batch_cap,
        )

    def _start_up_left(self) -> bool:
        """Whether start-up left work for between batches: CUDA graphs to capture, warm-up
        batches to run (their start-up budgets ran out)."""
        graphs = self.adapter.graphs  # a GraphSet is falsy while it holds no graph yet
        return bool(
            (graphs is not None and graphs.pending) or (self.warmup and self.warmup.pending)
        )

    def _work_between_batches(self, busy: bool = False) -> bool:
        """The batcher's work between batches (on the model thread); whether more remains.

        Idle (nothing queued): one CUDA graph capture, shapes that batches wanted
        (GraphSet.want) first, else one warm-up batch. Busy (the batcher's step under load):
        only the captures of wanted shapes, for up to WANTED_CAPTURE_S. The rest waits for an
        idle moment: under load, traffic warms the shapes it brings itself, and a warm-up
        batch of a shape it does not bring (up to max_batch_size inputs of max_input_tokens)
        would hold this replica's queue and, on a shared GPU, its neighbours' kernels.
        """
        graphs = self.adapter.graphs
        if graphs is not None and (graphs.wanted_next if busy else graphs.pending):
            t0 = time.perf_counter()
            with self._capture_lock:
                more = graphs.capture_next()
                while (
                    busy
                    and more
                    and graphs.wanted_next
                    and time.perf_counter() - t0 < WANTED_CAPTURE_S
                ):
                    more = graphs.capture_next()
            self.partition.refit("CUDA graph capture between batches")
            if not more:
                info = graphs.describe()
                logger.info(
                    "CUDA graphs: all %d captured (%d at start-up, %d out of memory, %d over "
                    "their memory limit), %.2f s of capture, %s pool",
                    info["graphs"],
                    info["graphs_at_start"],
                    info["skipped_out_of_memory"],
                    info["skipped_over_limit"],
                    info["capture_s"],
                    format_bytes(max(0, info["pool_bytes"])),
                )
        elif not busy and self.warmup is not None and self.warmup.pending:
            more_warmup = self.warmup.step()
            self.partition.refit("a warm-up batch")
            if not more_warmup:
                logger.info(
                    "warm-up: done, %d batches in %.2f s",
                    self.warmup.ran,
                    self.warmup.seconds,
                )
        return self._start_up_left()

    def _watch_budget(self, monitor: Any) -> None:
        budget = self.partition.budget
        if budget is None or self.partition.gpu_uuid is None:
            return
        monitor.watch.remote(
            WatchedReplica(
                replica_id=self.replica_id,
                app=self.args.model_name,
                pid=os.getpid(),
                gpu_uuid=self.partition.gpu_uuid,
                budget_bytes=budget.budget_bytes,
                enforcement=self.partition.enforcement,
            )
        )

    # ---- batching -------------------------------------------------------------------------

    def _run_batch(self, items: list[Any]) -> list[Any]:
        started_s = time.perf_counter()
        failed_sizes: list[int] = []

        def on_oom(failed_batch_size: int) -> None:
            self.oom_recoveries += 1
            failed_sizes.append(failed_batch_size)
            self.partition.free_cache()

        try:
            outputs = predict_with_oom_split(
                items, self.adapter.predict, is_oom=is_torch_oom, on_oom=on_oom
            )
        except Exception as exc:
            # A poisoned CUDA context: end the process here, in the predict thread, before the
            # batch's requests are answered, so HAProxy replays them elsewhere (poison.py).
            poison.exit_if_sticky(exc, "a batch", self.replica_id)
            raise
        if failed_sizes and not any(isinstance(o, ItemTooLarge) for o in outputs):
            # The batch, not one oversized item, was too big: lower the cap for next time.
            # (An item too large on its own says nothing about the batch size, so the cap stays.)
            self._lower_batch_cap(failed_sizes[0])
        self.batches += 1
        self.batched_items += len(items)
        self.largest_batch = max(self.largest_batch, len(items))
        self.partition.after_batch()  # the cache policy, and the refit of the torch cap
        self.batch_busy_s += time.perf_counter() - started_s
        return outputs

    def _lower_batch_cap(self, failed_batch_size: int) -> None:
        entry, self._calibration_entry = self._calibration_entry, None
        if entry is not None:  # the first OOM: the next start with this key measures again
            calibcache.invalidate(entry, f"a batch of {failed_batch_size} ran out of memory")
        new_cap = lowered_batch_cap(self.batch_cap, failed_batch_size)
        if new_cap < self.batch_cap:
            logger.warning(
                "OOM on a batch of %d under the cap: batch cap %d -> %d",
                failed_batch_size,
                self.batch_cap,
                new_cap,
            )
            self.batch_cap = new_cap
            self._batcher.max_batch_size = new_cap

    # ---- HTTP -----------------------------------------------------------------------------

    def __serve_build_asgi_app__(self) -> Ingress:
        """The replica's HTTP app (see http.py): its adapter's route and the common ones."""
        served = self.adapter.route
        routes: dict[str, dict[str, Any]] = {
            path: {"POST": self._infer if path == served else self._not_served}
            for path in ("/v1/embeddings", "/v1/classify")
        }
        routes.update(
            {
                "/v1/models": {"GET": self.models},
                "/healthz": {"GET": self.healthz},
                "/readyz": {"GET": self.readyz},
                "/v1/memory": {"GET": self.memory},
                "/openapi.json": {"GET": self.openapi},
                "/docs": {"GET": self.docs},
            }
        )
        self._openapi = build_openapi(
            served,
            self.args.model_name,
            self.args.max_body_bytes,
            auth=self._api_keys.enabled,
            max_inputs=self.args.max_inputs_per_request,
            dimensions=self.adapter.describe().get("dimensions"),
        )
        protected = set(PROTECTED_PATHS)
        if faults.enabled():  # tests only: SERVE_APP_FAULT_HOOKS=1 in the replica's env
            logger.warning(
                "fault hooks ON at %s (SERVE_APP_FAULT_HOOKS=1): tests only", faults.PATH
            )
            routes[faults.PATH] = {"POST": self._fault}
            protected.add(faults.PATH)
            self._raw = faults.RawAllocations()
        return Ingress(routes, self._api_keys, protected)

    async def _fault(self, request: Request) -> Response:
        return await guarded(self._fault_body(request), self.args.request_timeout_s)

    async def _fault_body(self, request: Request) -> Response:
        try:
            body = orjson.loads(await read_body(request, 4096))
        except orjson.JSONDecodeError:
            body = None
        kind, nbytes = faults.parse(body)
        device = self.partition.device
        if not self.partition.on_gpu and kind != "device_assert":  # simulated on a CPU
            raise BadRequest(f"fault hook {kind} needs a replica on a GPU", param="kind")
        loop = asyncio.get_running_loop()
        out: dict[str, Any] = {"kind": kind, "pid": os.getpid(), "replica_id": self.replica_id}
        if kind == "raw_alloc":
            out.update(await loop.run_in_executor(self._executor, self._raw.alloc, nbytes, device))
        elif kind == "raw_free":
            out.update(await loop.run_in_executor(self._executor, self._raw.free_all, device))
        else:
            try:
                await loop.run_in_executor(self._executor, faults.device_assert, device)
            except Exception as exc:  # noqa: BLE001 - the hook's whole point: report it
                # Sticky (the normal case): the process ends here, the hook's request unanswered
                # like a batch's would be. Anything else is reported.
                poison.exit_if_sticky(exc, "the device_assert fault hook", self.replica_id)
                out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return json_response(out, headers=self._served_by)

    async def _infer(self, request: Request) -> Response:
        try:
            self._batcher.check_room()  # a full queue: 503 before the body is even decoded
        except Overloaded as err:
            return error_response(err)
        return await guarded(self._infer_body(request), self.args.request_timeout_s)

    async def _infer_body(self, request: Request) -> Response:
        body = await read_body(request, self.args.max_body_bytes)
        content_type = request.headers.get("content-type", "")
        query = request.query_params if request.scope.get("query_string") else EMPTY_QUERY
        if self.adapter.decode_inline and len(body) <= INLINE_DECODE_MAX_BYTES:
            decoded = self.adapter.decode(body, content_type, query)
        else:
            decoded = await asyncio.to_thread(self.adapter.decode, body, content_type, query)
        results = await self._batcher.submit(decoded.items)
        for r in results:
            if isinstance(r, ItemError):  # an item the batch could not decode: a 4xx first,
                raise r.error  # as the CPU path, where decoding fails before any batch
        for r in results:
            if isinstance(r, ItemTooLarge):
                budget = self.partition.budget
                cap = format_bytes(budget.cap_bytes) if budget else "n/a"
                raise InsufficientMemory(
                    f"input[{r.index}] does not fit in this replica's GPU memory budget "
                    f"({cap}) even on its own; send a smaller input",
                    param=f"input[{r.index}]",
                )
        response = json_response(self.adapter.encode(results, decoded), headers=self._served_by)
        if self.first_request_s is None:
            now = time.time()
            self.first_request_s = round(now - self._process_started_s, 3)
            self.first_request_since_imports_s = round(now - self._imports_started_s, 3)
            logger.info(
                "first request answered %.2f s after the process started", self.first_request_s
            )
        return response

    async def _not_served(self, request: Request) -> Response:
        path = request.scope["path"]
        return error_response(
            NotFound(
                f"{path} is not served here; this application serves "
                f"{self.adapter.route} for model {self.args.model_name!r}",
                code="route_not_served",
            )
        )

    async def models(self, request: Request) -> Response:
        return json_response({"object": "list", "data": [self.adapter.describe()]})

    async def healthz(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """200 while every deployment has a RUNNING replica (readiness.decide); ``?verbose=1``
        adds every deployment's counts."""
        state = await asyncio.to_thread(readiness.current)
        verbose = request.query_params.get("verbose", "") not in ("", "0", "false")
        return json_response(state.to_json(verbose), 200 if state.ready else 503)

    async def memory(self, request: Request) -> Response:
        await self._publish()  # the registry runs calls concurrently: ours must land first
        reports = by_node_and_gpu(await self._registry.all.remote(REPORT_MAX_AGE_S))
        view = await asyncio.to_thread(cluster_view, reports)
        return json_response(
            {
                "object": "memory_report",
                "replicas": reports,
                "placement": placement_groups(reports),
                "gpus": view.gpus,
                "controller": view.controller,
                "escapes": view.escapes,
                "errors": view.errors,
            }
        )

    async def openapi(self, request: Request) -> Response:
        return json_response(self._openapi)

    async def docs(self, request: Request) -> Response:
        from fastapi.openapi.docs import get_swagger_ui_html

        root = request.scope.get("root_path", "")
        html: HTMLResponse = get_swagger_ui_html(
            openapi_url=f"{root}/openapi.json", title="serve_app - Swagger UI"
        )
        return html

    # ---- health and reporting -------------------------------------------------------------

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Memory figures for the headroom controller (see autoscale.HeadroomPolicy)."""
        part = self.partition
        budget = part.budget
        peak = 0
        if part.on_gpu and budget is not None:
            peak = int(torch.cuda.max_memory_reserved(part.device)) + budget.overhead_bytes
        return await replica_autoscaling_stats(
            budget_bytes=budget.budget_bytes if budget else 0,
            peak_bytes=peak,
            gpu_uuid=part.gpu_uuid,
            gpu_fraction=part.gpu_fraction,
            nvml_process_bytes=part.process_bytes(),
        )

    def check_health(self) -> None:
        """A tiny GPU operation: a sticky CUDA error makes this raise, and Serve replaces us.
        Never during a CUDA graph capture between batches (``_capture_lock``): its device-wide
        synchronisation has no place beside a capture, which lasts tens of milliseconds."""
        if self.partition.on_gpu:
            with self._capture_lock:
                x = torch.ones(1, device=self.partition.device)
                torch.cuda.synchronize(self.partition.device)
                ok = float(x.add_(1).item()) == 2.0
            if not ok:
                raise RuntimeError("GPU health check computed a wrong value")

    def report(self) -> dict[str, Any]:
        figures = self.partition.report()
        calib = self.calibration
        graph_set = self.adapter.graphs
        graphs = graph_set.describe() if graph_set is not None else None
        figures.update(
            {
                "replica_id": self.replica_id,
                "app": self.args.model_name,
                "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id(),
                "calibrated_batch_size": calib.batch_size if calib else None,
                "calibration_source": self.calibration_source,
                "calibration_peak_bytes": calib.peak_bytes if calib else None,
                "calibration_next_size": calib.first_failure_size if calib else None,
                "calibration_next_outcome": calib.first_failure if calib else None,
                "max_batch_size": self.batch_cap,
                "oom_recoveries": self.oom_recoveries,
                "batches": self.batches,
                "batched_items": self.batched_items,
                "largest_batch": self.largest_batch,
                "batch_busy_s": round(self.batch_busy_s, 6),
                "warmup_s": round(self.warmup.seconds, 3) if self.warmup else None,
                "warmup_pending": len(self.warmup.pending) if self.warmup else 0,
                "startup_phases_s": self.startup_phases_s,
                "weights_phases_s": getattr(self.adapter, "setup_phases_s", None),
                "encoder": getattr(self.adapter, "encoder", None),
                "first_request_s": self.first_request_s,
                "first_request_since_imports_s": self.first_request_since_imports_s,
                "process_started_at_s": self._process_started_s,
                "imports_started_at_s": self._imports_started_s,
                "preloaded_worker": self._preloaded,
                "worker_waited_s": self._waited_s,
                "torch_threads": torch.get_num_threads(),
                "warm_workers": self._warm_workers.describe() if self._warm_workers else None,
                "cuda_graphs": graphs["graphs"] if graphs else 0,
                "cuda_graphs_at_start": graphs["graphs_at_start"] if graphs else 0,
                "cuda_graphs_pending": graphs["pending"] if graphs else 0,
                "cuda_graph_capture_s": graphs["capture_s"] if graphs else None,
                "cuda_graph_pool_bytes": graphs["pool_bytes"] if graphs else None,
                "cuda_graph_limit_bytes": graphs["limit_bytes"] if graphs else None,
                "cuda_graph_outside_torch_bytes": graphs["outside_torch_bytes"] if graphs else None,
                "cuda_graphs_over_limit": graphs["skipped_over_limit"] if graphs else 0,
                "cuda_graph_replays": graph_set.replays if graph_set is not None else 0,
                "queued_items": self._batcher.queued,
                "rejected_requests": self._batcher.rejected_requests,
                "expired_requests": self._batcher.expired_requests,
                "reported_at_s": time.time(),
            }
        )
        return figures

    def _publish(self) -> Any:
        """Post this replica's report; the returned ref resolves once the registry has it."""
        report = self.report()
        self._metrics.update(report)
        return self._registry.put.remote(self.replica_id, report)

    def _report_loop(self) -> None:
        while not self._stop.wait(REPORT_PERIOD_S):
            try:
                self._publish()
            except Exception:  # noqa: BLE001 - reporting must never take the replica down
                logger.exception("memory report failed")

    def __del__(self) -> None:
        # __init__ may have failed part-way (e.g. the model did not fit): stop what exists.
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        batcher = getattr(self, "_batcher", None)
        if batcher is not None:
            batcher.close()
        keeper = getattr(self, "_warm_workers", None)
        if keeper is not None:
            keeper.stop()
