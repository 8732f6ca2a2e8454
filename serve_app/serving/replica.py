"""The model deployment: it is the HTTP ingress itself (no extra DeploymentHandle hop), serves
the routes its model's wire spec declares, runs the backend under its memory cap with dynamic
batching, and reports its figures."""

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
import torch
from ray import ObjectRef, serve
from starlette.requests import Request
from starlette.responses import Response

from serve_app import adapters, env
from serve_app.adapters.contract import Redo
from serve_app.config.args import AppArgs, parse_args
from serve_app.control.escapes import WatchedReplica
from serve_app.control.monitor import MonitorHandle, get_or_create_monitor
from serve_app.control.stats import replica_autoscaling_stats
from serve_app.errors import InsufficientMemory, ItemError, NotFound, Overloaded, Unauthorized
from serve_app.gpu import calibcache
from serve_app.gpu.budget import format_bytes
from serve_app.serving import hung, idle, listing, poison, readiness, requestid
from serve_app.serving.auth import load_api_keys, protected_paths
from serve_app.serving.batcher import Batcher
from serve_app.serving.http import (
    BodyBytes,
    BodyHold,
    Handler,
    Ingress,
    error_response,
    guarded,
    json_response,
    read_body,
)
from serve_app.serving.idle import LeftoverStartup
from serve_app.serving.metrics import ReplicaMetrics
from serve_app.serving.oom import (
    ItemTooLarge,
    is_torch_oom,
    lowered_batch_cap,
    predict_with_oom_split,
)
from serve_app.serving.openapi import build_openapi, swagger_page
from serve_app.serving.registry import get_registry
from serve_app.serving.report import (
    REPORT_PERIOD_S,
    BatchStats,
    FirstRequest,
    ReplicaReport,
    replica_report,
)
from serve_app.startup import warmpool
from serve_app.startup.calibration import length_packing
from serve_app.startup.pipeline import start_replica

logger = logging.getLogger("serve_app")

# Bodies up to this size decode on the event loop when the model says its decode is cheap
# (Model.decode_inline); larger ones, and every body of a model whose decode is not, go to a
# thread. The costliest 4 KiB body prepares in about 2 ms of the H200 host's CPU (a 64 KiB
# one took 34 ms: issue 25), so no body holds the loop longer.
INLINE_DECODE_MAX_BYTES = 4 * 1024
EMPTY_QUERY: dict[str, str] = {}


# Ray's per-request access log line is off (a measurable share of a loaded replica's event loop;
# `logging_config: {enable_access_log: true}` on the deployment turns it on). Serve's health
# check (check_health) every 5 s with a 5 s timeout: three failures in a row and Serve replaces
# the replica (force-stopped); HAProxy takes it out of rotation sooner, on its own check.
def _redo(output: Any) -> Any:
    return output.prepare if isinstance(output, Redo) else None


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
        requestid.attach_to_serve()  # our log lines in the replica's Serve log, with request ids
        self.args = args if isinstance(args, AppArgs) else parse_args(args)
        # From the environment, never the config; first, so that a key variable that yields no
        # key stops the replica before any model work (it never serves open).
        self._api_keys = load_api_keys()
        ctx = serve.get_replica_context()
        self.replica_id = str(ctx.replica_id.unique_id) if ctx else f"local-{os.getpid()}"
        self.application = ctx.app_name if ctx else ""
        assigned = ray.get_runtime_context().get_assigned_resources()
        # Everything up to serving: partition (first: under MPS it must precede CUDA), weights,
        # graphs, calibration, warm-up (startup.pipeline).
        self.started = start_replica(self.args, float(assigned.get("GPU", 0.0)))
        self.partition = self.started.partition
        self.model = self.started.model
        self.batch_cap = self.started.cap.batch_cap
        self._calibration_entry = self.started.cap.entry
        self.stats = BatchStats()
        self.first = FirstRequest()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="predict")
        self._leftover = LeftoverStartup(
            self.model.backend.graphs, self.started.warmup, self.partition
        )
        self._served_by = {"x-serve-app-replica": self.replica_id}
        self._batcher: Batcher[Any, Any] = Batcher(
            self._run_batch,
            self._executor,
            self.batch_cap,
            self.args.batch_wait_timeout_s,
            max_queued_items=self.args.max_queued_items,
            queue_deadline_s=self.args.queue_deadline_s,
            idle_work=self._leftover.step if self._leftover.left() else None,
            **length_packing(self.args, self.model.backend, self.batch_cap),
        )
        self._body_bytes = BodyBytes(
            self.args.max_body_bytes_in_flight, self._batcher.retry_after_s
        )
        self._readiness = readiness.CachedReadiness()
        self._stop = threading.Event()
        self._registry = get_registry()
        self._metrics = ReplicaMetrics()
        self._batcher.on_queued = self._metrics.queued
        # Start-up's leftovers now, not at our first request (which may come only under load).
        if self._leftover.left():
            idle.before_traffic(self._leftover.step, self._executor, lambda: self._batcher.started)
        if self.partition.gpu_uuid is not None:
            # The node's NVML sampler: the report's GPU totals; our bytes against our budget.
            self._watch_budget(get_or_create_monitor())
        # Warm workers for the next replica here (warmpool), once the registry's worker is up.
        up = lambda: ray.get(self._registry.all.remote(0.0), timeout=60.0)  # noqa: E731
        delay_s = self.args.warm_workers_delay_s  # their imports kept off the first seconds
        self._warm_workers = warmpool.start_keeper(self.args.warm_workers, up, delay_s)
        threading.Thread(target=self._report_loop, name="report", daemon=True).start()
        hung.start_reaper(self._stop)  # a hung neighbour on this node: its requests replayed
        ready = (self.replica_id, self.model.name, self.partition.device, self.batch_cap)
        logger.info("replica %s ready: %s on %s, max batch %d", *ready)

    def _watch_budget(self, monitor: MonitorHandle) -> None:
        budget = self.partition.budget
        if budget is None or self.partition.gpu_uuid is None:
            return
        monitor.watch.remote(
            WatchedReplica(
                replica_id=self.replica_id,
                app=self.model.name,
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
            self.stats.oom_recoveries += 1
            failed_sizes.append(failed_batch_size)
            self.partition.free_cache()

        try:
            outputs = predict_with_oom_split(
                items, self.model.backend.predict, is_oom=is_torch_oom, on_oom=on_oom
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
        self.partition.after_batch()  # the cache policy, and the refit of the torch cap
        took_s = time.perf_counter() - started_s
        self.stats.count(len(items), took_s)
        self._metrics.batch_done(items, took_s)
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
        """The replica's HTTP app (see http.py): its wire spec's route and the common ones."""
        spec = self.model.spec
        inference = {spec.route, *adapters.ROUTES.values(), adapters.CUSTOM_ROUTE}
        routes: dict[str, dict[str, Handler]] = {
            path: {"POST": self._infer if path == spec.route else self._not_served}
            for path in inference
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
        protected = set(protected_paths(inference))
        self._openapi = build_openapi(
            spec.route,
            spec.openapi(self.args.max_body_bytes),
            self.model.name,
            protected=protected if self._api_keys.enabled else None,
        )
        if env.doubles().fault_hooks:  # tests only
            from serve_app.testing.faults import FaultHooks

            hooks = FaultHooks(
                self.partition,
                self._executor,
                self.replica_id,
                self.args.request_timeout_s,
                self._served_by,
            )
            hooks.mount(routes, protected)
        return Ingress(routes, self._api_keys, protected)

    async def _infer(self, request: Request) -> Response:
        since_s = time.perf_counter()
        try:
            self._batcher.check_room()  # a full queue: 503 before the body is even decoded
        except Overloaded as err:
            return error_response(err)
        hold = self._body_bytes.hold()  # the body's bytes, held until the response is ready
        try:
            response = await guarded(self._infer_body(request, hold), self.args.request_timeout_s)
        finally:
            hold.release()  # on every path: an answer, an error, a timeout, a disconnect
        self._metrics.request_done(since_s)
        return response

    async def _infer_body(self, request: Request, hold: BodyHold) -> Response:
        body = await read_body(request, self.args.max_body_bytes, hold)
        content_type = request.headers.get("content-type", "")
        query = request.query_params if request.scope.get("query_string") else EMPTY_QUERY
        decode_since_s = time.perf_counter()
        if self.model.decode_inline and len(body) <= INLINE_DECODE_MAX_BYTES:
            decoded = self.model.decode(body, content_type, query)
        else:
            decoded = await asyncio.to_thread(self.model.decode, body, content_type, query)
        self._metrics.decoded(decode_since_s, len(body), len(decoded.items))
        # an item the batch hands back (contract.Redo) is prepared again in a thread, requeued
        results = await self._batcher.submit_redoing(decoded.items, _redo)
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
        encode_since_s = time.perf_counter()
        response = json_response(self.model.encode(results, decoded), headers=self._served_by)
        self._metrics.encoded(encode_since_s)
        if self.first.seen(self.started):
            logger.info(
                "first request answered %.2f s after the process started",
                self.first.since_process_s,
            )
        return response

    async def _not_served(self, request: Request) -> Response:
        path = request.scope["path"]
        return error_response(
            NotFound(
                f"{path} is not served here; this application serves "
                f"{self.model.spec.route} for model {self.model.name!r}",
                code="route_not_served",
            )
        )

    async def models(self, request: Request) -> Response:
        """Every serve_app model under this application's prefix, this one first, each with
        its route (serving/index): at ``route_prefix: /``, every model on the base URL."""
        await self._publish()  # as in memory(): ours must be in the registry's answer
        base = request.scope.get("root_path", "")
        body = await listing.models_body(self._registry, self.report(), self.application, base)
        return json_response(body)

    async def healthz(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """200 once each application's first roll-out is done and while every deployment has
        a RUNNING replica (readiness.decide; cached about a second); ``?verbose=1`` adds every
        deployment's counts, and needs a key when keys are set."""
        verbose = request.query_params.get("verbose", "") not in ("", "0", "false")
        if verbose and self._api_keys.enabled:
            try:
                self._api_keys.check(request.headers.raw)
            except Unauthorized as err:
                return error_response(err)
        state = await self._readiness.get()
        return json_response(state.to_json(verbose), 200 if state.ready else 503)

    async def memory(self, request: Request) -> Response:
        await self._publish()  # the registry runs calls concurrently: ours must land first
        return json_response(await listing.memory_body(self._registry))

    async def openapi(self, request: Request) -> Response:
        return json_response(self._openapi)

    async def docs(self, request: Request) -> Response:
        return swagger_page(request.scope.get("root_path", ""))

    # ---- health and reporting -------------------------------------------------------------

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Memory figures for the headroom controller (see control/policy.HeadroomPolicy)."""
        part = self.partition
        budget = part.budget
        peak = 0
        if part.on_gpu and budget is not None:
            peak = part.memory.peak_reserved_bytes() + budget.overhead_bytes
        return await replica_autoscaling_stats(
            budget_bytes=budget.budget_bytes if budget else 0,
            peak_bytes=peak,
            gpu_uuid=part.gpu_uuid,
            gpu_fraction=part.gpu_fraction,
            nvml_process_bytes=part.process_bytes(),
        )

    def check_health(self) -> None:
        """A tiny GPU operation: a sticky CUDA error makes this raise, and Serve replaces us;
        never beside a CUDA graph capture (a device-wide sync). The first runs after Serve's GC
        freeze and before any request: the frozen objects are counted then, once (gcwatch)."""
        if self.started.gc is not None:
            self.started.gc.read_frozen()
        if self.partition.on_gpu:
            with self._leftover.lock:
                x = torch.ones(1, device=self.partition.device)
                torch.cuda.synchronize(self.partition.device)
                ok = float(x.add_(1).item()) == 2.0
            if not ok:
                raise RuntimeError("GPU health check computed a wrong value")

    def report(self) -> ReplicaReport:
        return replica_report(
            replica_id=self.replica_id,
            application=self.application,
            started=self.started,
            batch_cap=self.batch_cap,
            stats=self.stats,
            first=self.first,
            batcher=self._batcher,
            warm_workers=self._warm_workers.describe() if self._warm_workers else None,
        )

    def _publish(self) -> ObjectRef[None]:
        """Post this replica's report; the returned ref resolves once the registry has it."""
        report = self.report()
        self._metrics.update(report)
        return self._registry.put.remote(self.replica_id, report)

    def _report_loop(self) -> None:
        # The first report at once, so that /v1/models and /v1/memory list a new replica from
        # its first request on (any replica answers them from the registry).
        while True:
            try:
                self._publish()
            except Exception:  # noqa: BLE001 - reporting must never take the replica down
                logger.exception("memory report failed")
            if self._stop.wait(REPORT_PERIOD_S):
                return

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
