"""Fault hooks for tests: ways to make one replica misbehave on purpose, off unless enabled.

A replica mounts ``POST /v1/_faults`` (``FaultHooks.mount``) only when its process has
``SERVE_APP_FAULT_HOOKS=1`` (serve_app.env.doubles; set it through the deployment's
``ray_actor_options.runtime_env.env_vars``, which only the GPU tests and the fault suites do).
Otherwise this module is never imported, the path is unknown (404) like any other, and it is
never in the OpenAPI document. The body is JSON:

- ``{"kind": "raw_alloc", "bytes": N}``: ``cuMemAlloc`` of N bytes through the driver API,
  past PyTorch's allocator and its cap, held until ``raw_free``. Answers whether the driver
  refused it (under MPS enforcement it must, past the replica's limit) and the CUDA result.
- ``{"kind": "raw_free"}``: free every raw allocation.
- ``{"kind": "device_assert"}``: a device-side assert on the model's device, in the thread
  that runs batches, which poisons the process's CUDA context for good. The replica then ends
  its process (poison.exit_if_sticky), so the hook's request gets no answer; only an error
  that is not sticky (none expected) is answered, as ``error``. Send it to one replica's own
  port, not through HAProxy, which would replay the unanswered request on a second replica.
  On a CPU replica (the others need a GPU) it raises the same error as a simulation.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from serve_app import env
from serve_app.errors import BadRequest
from serve_app.gpu.partition import Partition
from serve_app.serving import poison
from serve_app.serving.http import Handler, guarded, json_response, read_body

logger = logging.getLogger("serve_app")
HOOKS_VAR = env.FAULT_HOOKS_VAR
PATH = "/v1/_faults"


@dataclass
class RawAllocations:
    """Device memory taken with cuMemAlloc, outside PyTorch (the escape the tests provoke)."""

    pointers: list[tuple[int, int]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def _driver() -> Any:
        return ctypes.CDLL("libcuda.so.1")

    def alloc(self, nbytes: int, device: Any) -> dict[str, Any]:
        """``cuMemAlloc`` in the device's primary context (made current by torch)."""
        import torch

        torch.cuda.set_device(device)
        torch.cuda.synchronize(device)
        lib = self._driver()
        ptr = ctypes.c_uint64()
        rc = int(lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)))
        if rc == 0:
            with self._lock:
                self.pointers.append((int(ptr.value), nbytes))
        return {"refused": rc != 0, "cuda_result": rc, "held_bytes": self.held_bytes}

    def free_all(self, device: Any) -> dict[str, Any]:
        import torch

        torch.cuda.set_device(device)
        lib = self._driver()
        with self._lock:
            pointers, self.pointers = self.pointers, []
        for ptr, _ in pointers:
            lib.cuMemFree_v2(ctypes.c_uint64(ptr))
        return {"freed": len(pointers), "held_bytes": self.held_bytes}

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(n for _, n in self.pointers)


SIMULATED_ASSERT = "CUDA error: device-side assert triggered (simulated: a CPU replica)"


def device_assert(device: Any) -> None:
    """Index past a tensor's end on the GPU: a device-side assert, sticky for the context. On a
    CPU replica, the error torch raises on a GPU is raised instead (a simulation, said in its
    text), so that the replica's exit path runs in the CPU fault suite too."""
    import torch

    if torch.device(device).type != "cuda":
        raise torch.AcceleratorError(SIMULATED_ASSERT)
    x = torch.zeros(4, device=device)
    idx = torch.tensor([1 << 20], device=device)
    x[idx].sum().item()  # raises torch.AcceleratorError (device-side assert triggered)


def parse(body: Any) -> tuple[str, int]:
    """``(kind, bytes)`` from a hook's JSON body; BadRequest naming the field otherwise."""
    if not isinstance(body, dict) or body.get("kind") not in (
        "raw_alloc",
        "raw_free",
        "device_assert",
    ):
        raise BadRequest(
            'body must be {"kind": "raw_alloc" | "raw_free" | "device_assert"}',
            param="kind",
        )
    nbytes = body.get("bytes", 0)
    if body["kind"] == "raw_alloc" and (not isinstance(nbytes, int) or nbytes <= 0):
        raise BadRequest('raw_alloc needs "bytes": a positive integer', param="bytes")
    return str(body["kind"]), int(nbytes or 0)


class FaultHooks:
    """The replica's ``POST /v1/_faults`` handler; each hook runs on the model thread
    (``executor``), as a batch would."""

    def __init__(
        self,
        partition: Partition,
        executor: Executor,
        replica_id: str,
        timeout_s: float,
        headers: Mapping[str, str],
    ):
        self.partition = partition
        self.executor = executor
        self.replica_id = replica_id
        self.timeout_s = timeout_s
        self.headers = headers
        self.raw = RawAllocations()

    def mount(self, routes: dict[str, dict[str, Handler]], protected: set[str]) -> None:
        """Add the hook's route (behind auth, when keys are on)."""
        logger.warning("fault hooks ON at %s (%s=1): tests only", PATH, HOOKS_VAR)
        routes[PATH] = {"POST": self.handle}
        protected.add(PATH)

    async def handle(self, request: Request) -> Response:
        return await guarded(self._handle(request), self.timeout_s)

    async def _handle(self, request: Request) -> Response:
        try:
            body = orjson.loads(await read_body(request, 4096))
        except orjson.JSONDecodeError:
            body = None
        kind, nbytes = parse(body)
        device = self.partition.device
        if not self.partition.on_gpu and kind != "device_assert":  # simulated on a CPU
            raise BadRequest(f"fault hook {kind} needs a replica on a GPU", param="kind")
        loop = asyncio.get_running_loop()
        out: dict[str, Any] = {"kind": kind, "pid": os.getpid(), "replica_id": self.replica_id}
        if kind == "raw_alloc":
            out.update(await loop.run_in_executor(self.executor, self.raw.alloc, nbytes, device))
        elif kind == "raw_free":
            out.update(await loop.run_in_executor(self.executor, self.raw.free_all, device))
        else:
            try:
                await loop.run_in_executor(self.executor, device_assert, device)
            except Exception as exc:  # noqa: BLE001 - the hook's whole point: report it
                # Sticky (the normal case): the process ends here, the hook's request unanswered
                # like a batch's would be. Anything else is reported.
                poison.exit_if_sticky(exc, "the device_assert fault hook", self.replica_id)
                out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return json_response(out, headers=self.headers)
