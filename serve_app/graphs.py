"""CUDA graphs for a replica's forward pass.

Launching a forward pass eagerly costs the replica's CPU (and its GIL) a few milliseconds
whatever the batch size: about 3.8 ms for ResNet-50 and 2.9 ms for MiniLM on the H200 host.
Replaying the same pass captured as a CUDA graph costs about 0.02 ms of CPU, and at batch 1 it
is done in 0.9 ms and 0.3 ms (``docs/results/profile/replica/launch_probe.json``). At the
small batches that online traffic brings, that launch *is* the cost of a batch.

``GraphSet`` captures a forward function once per input shape (a batch size bucket, and for
token models a length bucket) and replays it: the batch is copied into the first rows of static
input buffers, the graph runs, and the first rows of its static outputs come back. Rows past the
batch hold stale inputs; every model served here computes rows independently, so they cannot
change the batch's results. Shapes beyond the captured buckets run eagerly.

All graphs share one memory pool, captured largest first, so that the pool holds about one
forward pass's activations; it lives inside the replica's torch cap like any other allocation.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from serve_app.config import AppArgs

logger = logging.getLogger("serve_app")

Tensors = tuple[torch.Tensor, ...]
# Eager runs on a side stream before each capture (cuDNN/cuBLAS choices, lazy kernel loading).
CAPTURE_WARMUP_RUNS = 2


def graph_batch_sizes(limit: int) -> list[int]:
    """Batch buckets up to ``limit``: 1, 2, 4, then powers of two and the points halfway
    between them (8, 12, 16, 24, 32, 48, 64, 96, ...), so that padding a batch up to its bucket
    adds less than half to it above 8. ``limit`` itself is always a bucket."""
    if limit < 1:
        return []
    sizes, n = [], 1
    while n < limit:
        sizes.append(n)
        if n >= 8 and n + n // 2 < limit:
            sizes.append(n + n // 2)
        n *= 2
    return sorted({*sizes, limit})


@functools.cache
def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream on which every capture, and its eager warm-up, runs in this
    process: cuBLAS keeps a workspace per stream it has run on, so a new stream per capture
    left one workspace per shape in the pool."""
    return torch.cuda.Stream(device)


def bucket_for(n: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds ``n``, or None when ``n`` is larger than all of them."""
    fitting = [b for b in buckets if b >= n]
    return min(fitting) if fitting else None


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: Tensors
    outputs: Tensors


class GraphCaptureError(RuntimeError):
    """A forward pass could not be captured as a CUDA graph."""

    def __init__(self, message: str, out_of_memory: bool = False):
        super().__init__(message)
        self.out_of_memory = out_of_memory


class GraphSet:
    """CUDA graphs of ``forward`` keyed by shape; see the module docstring."""

    def __init__(self, forward: Callable[..., Tensors], device: torch.device):
        self.forward = forward
        self.device = device
        self._graphs: dict[Hashable, _Captured] = {}
        self._pool: Any = None
        self.capture_s = 0.0
        self.skipped: list[Hashable] = []
        self.replays = 0

    def __len__(self) -> int:
        return len(self._graphs)

    def capture(self, key: Hashable, example: Tensors) -> None:
        """Capture ``forward(*example)`` under ``key``; ``example`` becomes the static inputs.

        Raises:
            GraphCaptureError: the forward pass does something a graph cannot hold (a host
                synchronisation, a CPU tensor, ...), or ran out of memory (``out_of_memory``).
        """
        t0 = time.perf_counter()
        try:
            static = tuple(t.clone() for t in example)
            stream = side_stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream), torch.inference_mode():
                for _ in range(CAPTURE_WARMUP_RUNS):
                    self.forward(*static)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            torch.cuda.synchronize(self.device)
            # The warm-up's blocks would stay cached outside the graphs' pool: give them back
            # so that, under the replica's cap, the capture can take the same room.
            torch.cuda.empty_cache()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(graph, pool=self._pool, stream=stream):
                outputs = self.forward(*static)
        except Exception as exc:  # noqa: BLE001 - any capture failure, named for the user
            from serve_app.oom import is_torch_oom

            raise GraphCaptureError(
                f"capturing shape {key!r}: {type(exc).__name__}: {str(exc)[:300]}",
                out_of_memory=is_torch_oom(exc),
            ) from None
        self._graphs[key] = _Captured(graph, static, tuple(outputs))
        self.capture_s += time.perf_counter() - t0

    def capture_all(self, examples: Sequence[tuple[Hashable, Tensors]]) -> list[Hashable]:
        """Capture every ``(key, example)``, largest example first, so that the shared pool
        grows once to the largest pass and the smaller ones reuse it. A shape that runs out of
        memory is skipped (it will run eagerly); the skipped keys are returned.

        Raises:
            GraphCaptureError: a capture failed for another reason than memory.
        """
        skipped: list[Hashable] = []
        for key, example in sorted(examples, key=lambda kv: -sum(t.numel() for t in kv[1])):
            try:
                self.capture(key, example)
            except GraphCaptureError as exc:
                if not exc.out_of_memory:
                    raise
                skipped.append(key)
                torch.cuda.empty_cache()
        self.skipped = skipped
        return skipped

    def has(self, key: Hashable) -> bool:
        return key in self._graphs

    def run(self, key: Hashable, inputs: Tensors) -> Tensors:
        """Replay the graph under ``key`` on ``inputs`` (each with at most the static rows and
        the same trailing shape); the outputs' first ``len(inputs[0])`` rows.

        The outputs are views of the graph's static buffers: copy or consume them before the
        next ``run``.
        """
        captured = self._graphs[key]
        rows = inputs[0].shape[0]
        for dst, src in zip(captured.inputs, inputs, strict=True):
            dst[:rows].copy_(src, non_blocking=True)
        captured.graph.replay()
        self.replays += 1
        return tuple(out[:rows] for out in captured.outputs)

    def describe(self) -> dict[str, Any]:
        return {
            "graphs": len(self._graphs),
            "skipped_out_of_memory": len(self.skipped),
            "capture_s": round(self.capture_s, 3),
        }


def graph_batch_limit(args: AppArgs) -> int:
    """The largest batch captured as a CUDA graph: ``cuda_graph_max_batch_size``, within
    ``max_batch_size`` when that is set."""
    return min(
        args.cuda_graph_max_batch_size, args.max_batch_size or args.cuda_graph_max_batch_size
    )
