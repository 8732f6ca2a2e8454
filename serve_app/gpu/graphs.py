"""CUDA graphs for a replica's forward pass.

Launching a forward pass eagerly costs the replica's CPU (and its GIL) milliseconds whatever the
batch size; replaying the same pass captured as a CUDA graph costs a hundredth of that
(benchmarks/results/profile/replica/launch_probe.json). At the small batches that online traffic
brings, that launch *is* the cost of a batch.

``GraphSet`` captures a forward function once per input shape (a batch size bucket, and for
token models a length bucket) and replays it: the batch is copied into the first rows of static
input buffers, the graph runs, and the first rows of its static outputs come back. Rows past the
batch hold stale inputs; every model served here computes rows independently, so they cannot
change the batch's results. Shapes beyond the captured buckets run eagerly.

All graphs share one memory pool, captured largest first, so that the pool holds about one
forward pass's activations; it lives inside the replica's torch cap like any other allocation.

Capture must not hold a replica back from serving: start-up captures for at most
``cuda_graph_startup_budget_s`` (the largest shapes first, which size the pool), and the shapes
left are captured one at a time on the model thread once the replica serves, between batches
(``capture_next``, called by the batcher). Until its graph exists, a shape runs eagerly.
"""

from __future__ import annotations

import functools
import gc
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from serve_app.config.args import TOKEN_FAMILIES

if TYPE_CHECKING:
    from serve_app.config.args import AppArgs
    from serve_app.gpu.snapshot import DeviceMemory

logger = logging.getLogger("serve_app")

Tensors = tuple[torch.Tensor, ...]
# Eager runs on a side stream before each capture (cuDNN/cuBLAS choices, lazy kernel loading).
CAPTURE_WARMUP_RUNS = 2
# The largest graphed batch of the families whose batches are not packed by tokens.
DEFAULT_GRAPH_BATCH_LIMIT = 64


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


def steps_within(step: Callable[[], bool], budget_s: float | None) -> None:
    """Call ``step`` (one step of work; it returns whether more remain) until it is done, or
    until the next step would likely end past ``budget_s`` (the longest step so far is the
    estimate; a budget of 0 runs none). Start-up's graph capture and warm-up use it."""
    t0 = time.perf_counter()
    longest_s = 0.0
    more = True
    while more:
        if budget_s is not None and (
            budget_s <= 0 or time.perf_counter() - t0 + longest_s > budget_s
        ):
            break
        started_s = time.perf_counter()
        more = step()
        longest_s = max(longest_s, time.perf_counter() - started_s)


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

    def __init__(self, message: str, out_of_memory: bool = False, over_limit: bool = False):
        super().__init__(message)
        self.out_of_memory = out_of_memory
        self.over_limit = over_limit  # past the GraphMemoryLimit: not captured


@dataclass(frozen=True)
class GraphMemory:
    """Where a replica's CUDA graphs take their memory, and what they may cost.

    Attributes:
        memory: the device's readings and cache frees (the partition's ``DeviceMemory``).
        limit_bytes: what the graphs may cost in all: their pool and what capturing adds
            outside torch (kernels loaded on first launch, each graph's own device memory);
            None for no limit.
        outside_torch_bytes: the reading of the process's memory outside torch that counts the
            latter (``Partition.outside_torch_bytes``), or None.
    """

    memory: DeviceMemory
    limit_bytes: int | None = None
    outside_torch_bytes: Callable[[], int | None] | None = None


class GraphSet:
    """CUDA graphs of ``forward`` keyed by shape; see the module docstring."""

    def __init__(self, forward: Callable[..., Tensors], memory: GraphMemory):
        self.forward = forward
        self.memory = memory.memory
        self.device = memory.memory.device
        # What the captures may cost in all; a shape that would take them past it is not
        # captured and runs eagerly (``over_limit``).
        self.limit = memory
        self._outside_start: int | None = None  # bytes outside torch before the first capture
        self.outside_torch_bytes = 0  # what the captures added outside torch (``limit``)
        self._graphs: dict[Hashable, _Captured] = {}
        self._pool: Any = None
        self.capture_s = 0.0
        self.pool_bytes = 0  # reserved bytes the captures added (``capture``)
        self.skipped: list[Hashable] = []  # out of memory while captured
        self.over_limit: list[Hashable] = []  # would have taken the graphs past ``limit``
        self.replays = 0
        self._pending: deque[tuple[Hashable, Tensors]] = deque()
        self._wanted: set[Hashable] = set()  # pending shapes a batch needed (``want``)
        self.captured_at_start = 0  # graphs captured before serving (``capture_all``)

    def __len__(self) -> int:
        return len(self._graphs)

    def _outside_torch_bytes(self) -> int:
        """What the captures so far added to the process outside torch's allocator (kernels
        loaded on first launch, the graphs' own device memory): the growth of the limit's
        reading since the first capture, kept in ``outside_torch_bytes``; unchanged without a
        reading."""
        read = self.limit.outside_torch_bytes
        outside = read() if read is not None else None
        if outside is None:
            return self.outside_torch_bytes
        if self._outside_start is None:
            self._outside_start = outside
        self.outside_torch_bytes = max(self.outside_torch_bytes, outside - self._outside_start)
        return self.outside_torch_bytes

    def capture(self, key: Hashable, example: Tensors) -> None:
        """Capture ``forward(*example)`` under ``key``; a copy of ``example`` becomes the static
        inputs. What the static inputs and the pool's growth reserved (cached blocks given back
        before and after) is added to ``pool_bytes``.

        The capture is thread-local (``capture_error_mode="thread_local"``): a capture made
        while the replica serves runs on the model thread, and another thread's CUDA call (a
        memory reading) must not fail it.

        With a ``limit``, the eager warm-up's reserved growth (the inputs and one pass's
        activations, from an emptied cache) estimates what the capture needs. The pool holds
        about its largest pass, so the captures' cost after this one is about the larger of
        the pool and that estimate, plus what they added outside torch so far; a shape that
        would take it past ``limit.limit_bytes`` is not captured (``over_limit``).

        Raises:
            GraphCaptureError: the forward pass does something a graph cannot hold (a host
                synchronisation, a CPU tensor, ...), ran out of memory (``out_of_memory``), or
                would take the captures past their limit (``over_limit``).
        """
        t0 = time.perf_counter()
        try:
            self.memory.free_cache()
            outside = self._outside_torch_bytes()
            before = self.memory.reserved_bytes()
            static = tuple(t.clone() for t in example)
            stream = side_stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream), torch.inference_mode():
                for _ in range(CAPTURE_WARMUP_RUNS):
                    self.forward(*static)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            self.memory.synchronize()
            need = self.memory.reserved_bytes() - before
            projected = max(self.pool_bytes, need) + outside
            limit_bytes = self.limit.limit_bytes
            if limit_bytes is not None and projected > limit_bytes:
                del static
                self.memory.free_cache()
                self.capture_s += time.perf_counter() - t0
                raise GraphCaptureError(
                    f"capturing shape {key!r} would bring the graphs' memory to about "
                    f"{projected} bytes, past their limit of {limit_bytes}",
                    over_limit=True,
                )
            # The warm-up's blocks would stay cached outside the graphs' pool: give them back
            # so that, under the replica's cap, the capture can take the same room.
            self.memory.free_cache()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            # No cyclic garbage collection while capturing: collecting another graph (an
            # adapter and its GraphSet form a cycle) destroys it mid-capture, which CUDA does
            # not permit, and the capture fails (torch's own gc.collect before capture is off
            # by default since torch.compiler.config.force_cudagraph_gc).
            gc_was_on = gc.isenabled()
            gc.disable()
            try:
                with (
                    torch.inference_mode(),
                    torch.cuda.graph(
                        graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"
                    ),
                ):
                    outputs = self.forward(*static)
            finally:
                if gc_was_on:
                    gc.enable()
            self.memory.synchronize()
            self.memory.free_cache()
            self.pool_bytes += self.memory.reserved_bytes() - before
            self._outside_torch_bytes()
        except GraphCaptureError:
            raise
        except Exception as exc:  # noqa: BLE001 - any capture failure, named for the user
            from serve_app.gpu.snapshot import is_torch_oom

            raise GraphCaptureError(
                f"capturing shape {key!r}: {type(exc).__name__}: {str(exc)[:300]}",
                out_of_memory=is_torch_oom(exc),
            ) from None
        self._graphs[key] = _Captured(graph, static, tuple(outputs))
        self.capture_s += time.perf_counter() - t0

    def capture_all(
        self, examples: Sequence[tuple[Hashable, Tensors]], budget_s: float | None = None
    ) -> list[Hashable]:
        """Capture every ``(key, example)``, largest example first, so that the shared pool
        grows once to the largest pass and the smaller ones reuse it. A shape that runs out of
        memory is skipped (it will run eagerly); the skipped keys are returned.

        With ``budget_s``, no capture starts that would likely end past it (the longest
        capture so far is the estimate): the shapes left wait in ``pending``, still largest
        first, for ``capture_next`` once the replica serves. Until then they run eagerly.

        Raises:
            GraphCaptureError: a capture failed for another reason than memory.
        """
        self._pending = deque(sorted(examples, key=lambda kv: -sum(t.numel() for t in kv[1])))
        if self._pending:
            steps_within(self.capture_next, budget_s)
        self.captured_at_start = len(self)
        return self.skipped

    @property
    def pending(self) -> int:
        """Shapes still to capture (``capture_next``)."""
        return len(self._pending)

    def capture_next(self) -> bool:
        """Capture the next pending shape, if any (out of memory or over the graphs' memory
        limit: skipped, it runs eagerly); whether shapes remain. The replica's model thread calls it
        between batches.

        Raises:
            GraphCaptureError: a capture failed for another reason than memory.
        """
        if not self._pending:
            return False
        key, example = self._pending.popleft()
        try:
            self.capture(key, example)
        except GraphCaptureError as exc:
            if exc.over_limit:
                self.over_limit.append(key)
                return bool(self._pending)
            if not exc.out_of_memory:
                self._pending.clear()
                raise
            self.skipped.append(key)
            self.memory.free_cache()
        return bool(self._pending)

    def want(self, key: Hashable) -> None:
        """A batch of shape ``key`` ran without its graph: if that shape is pending, it is
        captured next. Traffic's own shapes go first, so that a replica that starts under load
        (a scale-up, a replacement) does not run its busiest shapes eagerly, at several times
        a replay's CPU, while dozens of other shapes take their turn between batches."""
        if key in self._wanted or self.has(key):
            return
        for i, (k, example) in enumerate(self._pending):
            if k == key:
                del self._pending[i]
                self._pending.appendleft((k, example))
                self._wanted.add(key)
                return

    @property
    def wanted_next(self) -> bool:
        """Whether the next pending shape is one a batch needed (``want``)."""
        return bool(self._pending) and self._pending[0][0] in self._wanted

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
            "graphs": len(self),
            "graphs_at_start": self.captured_at_start,
            "pending": len(self._pending),
            "skipped_out_of_memory": len(self.skipped),
            "skipped_over_limit": len(self.over_limit),
            "limit_bytes": self.limit.limit_bytes,
            "outside_torch_bytes": self.outside_torch_bytes,
            "capture_s": round(self.capture_s, 3),
            "pool_bytes": self.pool_bytes,
        }


def graph_batch_limit(args: AppArgs) -> int:
    """The largest batch captured as a CUDA graph: ``cuda_graph_max_batch_size`` (by default
    ``calibration_max_batch_size`` for the text families, else ``DEFAULT_GRAPH_BATCH_LIMIT``),
    within ``max_batch_size`` when that is set."""
    limit = args.cuda_graph_max_batch_size or (
        args.memory.calibration_max_batch_size
        if args.adapter in TOKEN_FAMILIES
        else DEFAULT_GRAPH_BATCH_LIMIT
    )
    return min(limit, args.max_batch_size or limit)


def text_batch_shape(
    graphs: GraphSet | None,
    sizes: Sequence[int],
    lengths: Sequence[int],
    n_items: int,
    longest: int,
    max_positions: int,
    pad_multiple: int,
) -> tuple[tuple[int, int] | None, int]:
    """How a batch of ``n_items`` token sequences, the longest ``longest``, runs: the graph to
    replay (its (rows, width) key) or None for eager, and the width to pad to (the graph's, or
    ``longest`` rounded up to ``pad_multiple`` within ``max_positions``). A bucket without a
    graph yet is asked for, to be captured between batches."""
    rows, width = bucket_for(n_items, sizes), bucket_for(longest, lengths)
    if graphs is not None and rows is not None and width is not None:
        if graphs.has((rows, width)):
            return (rows, width), width
        graphs.want((rows, width))
    padded = -(-longest // pad_multiple) * pad_multiple
    return None, max(longest, min(padded, max_positions))
