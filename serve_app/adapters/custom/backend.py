"""A user model as a ModelBackend: the user's ``setup`` and ``predict``, with what serve_app runs
around every backend (the cap before setup, calibration, the OOM split, the cache policy,
batching, the report, the controller, escapes and MPS) left as it is for our own families.

What it adds is the checks a user's class needs: ``setup`` that raises fails start-up naming the
class; ``predict`` that returns the wrong number of outputs, or raises, fails its requests with
a 500 whose message names the class and carries an error id (the log has the rest); a torch
out-of-memory error and a sticky CUDA error pass through untouched, so the OOM split and the
poisoned-context exit see them as they see our own.

CUDA graphs are opt-in (``cuda_graphs: true``) for a class that splits its predict into
``collate(batch) -> Tensor`` (first dimension the batch) and ``forward(x) -> Tensor`` (the device
part, rows independent): batches whose size and shape have a graph replay it, and the rest run
the user's ``predict``. Start-up checks both paths give the same outputs on its example inputs.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from serve_app.adapters.contract import pow2_sizes
from serve_app.adapters.custom.loader import UserClass
from serve_app.config.args import AppArgs
from serve_app.errors import BadRequest, InferenceError, StartupError
from serve_app.gpu.graphs import (
    GraphCaptureError,
    GraphMemory,
    GraphSet,
    bucket_for,
    graph_batch_sizes,
)
from serve_app.gpu.snapshot import is_torch_oom
from serve_app.serving.poison import sticky_cuda_error

logger = logging.getLogger("serve_app")
# A user's decode_request that raises one of these rejected the input: HTTP 400 naming it.
BAD_INPUT_ERRORS = (ValueError, TypeError, KeyError, IndexError)
# What a user model needs for CUDA graphs, on top of predict.
GRAPH_METHODS = ("collate", "forward", "example_inputs")
# How close forward(collate(batch)) must come to predict(batch) at start-up (float16 models).
GRAPH_MATCH_RTOL, GRAPH_MATCH_ATOL = 1e-2, 1e-3


class UserModelError(InferenceError):
    """A user model broke its contract or raised on a batch (HTTP 500): the message names the
    class and carries an error id, under which the log has the details."""

    def __init__(self, message: str):
        self.error_id = uuid.uuid4().hex[:12]
        super().__init__(f"{message}; error id {self.error_id} (see the server log)")


def plain(output: Any) -> Any:
    """An output orjson can write: a tensor becomes a numpy array (float32 for floating
    dtypes, which numpy may lack), or a number when it has no dimensions; the rest as is."""
    if isinstance(output, torch.Tensor):
        t = output.detach()
        if t.is_floating_point():
            t = t.float()
        return t.item() if t.dim() == 0 else t.cpu().numpy()
    return output


class UserModelBackend:
    """The device half of a user model (``args.adapter: module:Class``)."""

    graphs: GraphSet | None = None

    def __init__(self, args: AppArgs, user: UserClass, instance: Any, input_field: str):
        self.args = args
        self.user = user
        self.model = instance
        self.input_field = input_field
        # Decoding raw JSON inputs is free without the user's decode_request; with it, who
        # knows: a thread, as for image decoding.
        self.prepare_inline = "decode_request" not in user.has
        # Without example_inputs there are no worst-case batches: calibration is skipped
        # (startup/calibration reads this) and max_batch_size is the cap.
        self.calibrates = "example_inputs" in user.has
        self.output_check: Callable[[Any], Any] = plain
        """What each output goes through after ``plain`` and ``encode_response`` (the wire
        spec's own shape check, e.g. embeddings' float32 vectors)."""
        self.dim = 0  # an output's length once one was seen (wire: embeddings, predict)
        self.example_input: Callable[[Any], Any] | None = None
        """What each raw example input goes through before ``prepare`` (the wire spec's input
        shape: a rerank pair; a ValueError names what it got)."""
        self.device = torch.device("cpu")
        self.setup_s: float | None = None
        self._graph_sizes: list[int] = []

    def setup(self, device: torch.device) -> None:
        t0 = time.perf_counter()
        try:
            self.model.setup(device)
        except Exception as exc:
            if is_torch_oom(exc) or sticky_cuda_error(exc):
                raise  # the pipeline's message about the cap, or the poisoned context
            raise StartupError(
                f"{self.user.path}.setup({device}) raised {type(exc).__name__}: "
                f"{str(exc)[:300]}; fix the model's setup (it loads the model onto the device "
                "it is given, once per replica, under the replica's memory cap)"
            ) from exc
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.device = device
        self.setup_s = round(time.perf_counter() - t0, 3)

    def prepare(self, inputs: Sequence[Any]) -> list[Any]:
        """Each input through the user's ``decode_request``, or as it came; BadRequest naming
        the input the user's code rejected."""
        if "decode_request" not in self.user.has:
            return list(inputs)
        items = []
        for i, raw in enumerate(inputs):
            try:
                items.append(self.model.decode_request(raw))
            except BAD_INPUT_ERRORS as exc:
                where = f"{self.input_field}[{i}]"
                message = str(exc)[:300] or type(exc).__name__
                raise BadRequest(f"{where}: {message}", param=where) from None
        return items

    def predict(self, items: Sequence[Any]) -> list[Any]:
        batch = list(items)
        try:
            with torch.inference_mode():
                outputs = self._graphed(batch) if self.graphs is not None else None
                if outputs is None:
                    outputs = self.model.predict(batch)
        except Exception as exc:
            if is_torch_oom(exc) or sticky_cuda_error(exc):
                raise  # the OOM split (serving/oom) and the poisoned-context exit handle these
            err = UserModelError(f"{self.user.path}.predict raised {type(exc).__name__}")
            logger.exception("user model failed (error id %s)", err.error_id)
            raise err from None
        return self._outputs(outputs, len(batch))

    def _graphed(self, batch: list[Any]) -> list[Any] | None:
        """The batch through its CUDA graph (rows of ``forward``), or None when its size and
        shape have none yet (it is then captured next, between batches)."""
        assert self.graphs is not None
        x = self.model.collate(batch)
        rows = bucket_for(len(batch), self._graph_sizes)
        key = (rows, tuple(x.shape[1:]))
        if rows is None or not self.graphs.has(key):
            if rows is not None:
                self.graphs.want(key)
            return None
        (out,) = self.graphs.run(key, (x,))
        return list(out)

    def _forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model.forward(x),)

    def _outputs(self, outputs: Any, n: int) -> list[Any]:
        """The batch's outputs as the wire spec takes them: counted, made plain, through the
        user's ``encode_response`` and the spec's shape check."""
        done = self._rows(outputs, n)
        if "encode_response" in self.user.has:
            done = [plain(self.model.encode_response(o)) for o in done]
        return [self.output_check(o) for o in done]

    def _rows(self, outputs: Any, n: int) -> list[Any]:
        """``predict``'s outputs, one per input (a tensor or an array counts by its rows),
        made plain (``plain``); a UserModelError naming the class when they are not."""
        if isinstance(outputs, torch.Tensor | np.ndarray) and outputs.ndim >= 1:
            outputs = list(outputs)
        if not isinstance(outputs, list | tuple) or len(outputs) != n:
            got = (
                f"{len(outputs)} outputs"
                if isinstance(outputs, list | tuple)
                else f"a {type(outputs).__name__}"
            )
            err = UserModelError(
                f"{self.user.path}.predict returned {got} for a batch of {n} inputs; it must "
                "return a list with one output per input, in order"
            )
            logger.error("user model broke its contract (error id %s): %s", err.error_id, err)
            raise err
        return [plain(o) for o in outputs]

    def worst_case_items(self, n: int) -> list[Any]:
        """The user's ``example_inputs(n)``, prepared; [] without it (``calibrates`` is then
        False and calibration never asks)."""
        if not self.calibrates:
            return []
        raw = self.model.example_inputs(n)
        if not isinstance(raw, list | tuple) or len(raw) != n:
            got = len(raw) if isinstance(raw, list | tuple) else type(raw).__name__
            raise StartupError(
                f"{self.user.path}.example_inputs({n}) returned {got}; it must return a list "
                f"of {n} inputs, each the largest a request may carry"
            )
        if self.example_input is not None:
            try:
                raw = [self.example_input(r) for r in raw]
            except ValueError as exc:
                raise StartupError(
                    f"{self.user.path}.example_inputs({n}) gave an input wire: {self.args.wire} "
                    f"does not take ({exc}); return inputs as its requests carry them "
                    "(docs/custom-models.md)"
                ) from None
        try:
            return self.prepare(raw)
        except BadRequest as exc:
            raise StartupError(
                f"{self.user.path}.example_inputs({n}) gave an input its decode_request "
                f"rejects ({exc.message}); return inputs as a request carries them"
            ) from None

    def warmup_batches(self, max_batch_size: int) -> list[list[Any]]:
        """Batches of the example inputs, of each power-of-two size: the only shapes known."""
        if not self.calibrates:
            return []
        return [self.worst_case_items(b) for b in pow2_sizes(max_batch_size)]

    def capture_graphs(
        self, max_batch_size: int, budget_s: float | None, memory: GraphMemory
    ) -> GraphSet:
        """Graphs of ``forward`` for each batch bucket up to ``max_batch_size``, on the example
        inputs' shape, once ``forward(collate(batch))`` is seen to give ``predict(batch)``.

        Raises:
            GraphCaptureError: the class lacks a method graphs need, or the two paths differ.
        """
        missing = [m for m in GRAPH_METHODS if m not in self.user.has]
        if missing:
            raise GraphCaptureError(
                f"{self.user.path} has no {', '.join(missing)}: a user model's graphs capture "
                "forward(collate(batch)) on its example inputs (docs/custom-models.md)"
            )
        self._check_forward_matches_predict()
        sizes = graph_batch_sizes(max_batch_size)
        graphs = GraphSet(self._forward, memory)
        examples = []
        for b in sizes:
            x = self.model.collate(self.worst_case_items(b)).to(self.device)
            examples.append(((b, tuple(x.shape[1:])), (x,)))
        self.graphs, self._graph_sizes = graphs, sizes
        graphs.capture_all(examples, budget_s)
        return graphs

    def _check_forward_matches_predict(self) -> None:
        items = self.worst_case_items(2)
        with torch.inference_mode():
            eager = self._rows(self.model.predict(items), 2)
            x = self.model.collate(items).to(self.device)
            split = self._rows(self.model.forward(x), 2)
        try:
            same = all(
                np.allclose(
                    np.asarray(e, dtype=np.float64),
                    np.asarray(s, dtype=np.float64),
                    rtol=GRAPH_MATCH_RTOL,
                    atol=GRAPH_MATCH_ATOL,
                )
                for e, s in zip(eager, split, strict=True)
            )
        except (TypeError, ValueError):
            same = False
        if not same:
            raise GraphCaptureError(
                f"{self.user.path}: forward(collate(batch)) does not give predict(batch) on its "
                f"example inputs ({split[0]!r} against {eager[0]!r}); make forward return one "
                "row per input that is that input's output"
            )

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.args.model_name,
            "object": "model",
            "owned_by": "user",
            "task": "custom",
            "adapter": self.user.path,
            "wire": self.args.wire,
            # The class and its module's source digest: the calibration cache's key, so that a
            # changed model is measured again.
            "arch": f"{self.user.path}@{self.user.source_digest}",
            "calibrates": self.calibrates,
        }

    def report(self) -> dict[str, Any]:
        return {"user_model": self.user.path, "weights_phases_s": {"setup": self.setup_s}}
