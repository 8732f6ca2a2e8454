"""Fault hooks for tests: ways to make one replica misbehave on purpose, off unless enabled.

A replica serves ``POST /v1/_faults`` only when its process has ``SERVE_APP_FAULT_HOOKS=1``
(set it through the deployment's ``ray_actor_options.runtime_env.env_vars``, which only the GPU
tests and the fault suite do). Otherwise the path is unknown (404) like any other, and it is
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

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any

from serve_app import env
from serve_app.errors import BadRequest

HOOKS_VAR = "SERVE_APP_FAULT_HOOKS"
PATH = "/v1/_faults"


def enabled() -> bool:
    """Whether this process serves the fault hooks."""
    return env.get(HOOKS_VAR) == "1"


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
