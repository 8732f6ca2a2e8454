"""A user model as a ModelBackend: the user's ``setup`` and ``predict``, with what serve_app runs
around every backend (the cap before setup, calibration, the OOM split, the cache policy,
batching, the report, the controller, escapes and MPS) left as it is for our own families.

What it adds is the checks a user's class needs: ``setup`` that raises fails start-up naming the
class; ``predict`` that returns the wrong number of outputs, or raises, fails its requests with
a 500 whose message names the class and carries an error id (the log has the rest); a torch
out-of-memory error and a sticky CUDA error pass through untouched, so the OOM split and the
poisoned-context exit see them as they see our own.
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
from serve_app.gpu.graphs import GraphCaptureError, GraphMemory, GraphSet
from serve_app.gpu.snapshot import is_torch_oom
from serve_app.serving.poison import sticky_cuda_error

logger = logging.getLogger("serve_app")
# A user's decode_request that raises one of these rejected the input: HTTP 400 naming it.
BAD_INPUT_ERRORS = (ValueError, TypeError, KeyError, IndexError)


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
        self.dim = 0  # an embedding-shaped output's length once one was seen (wire: embeddings)
        self.device = torch.device("cpu")
        self.setup_s: float | None = None

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
                outputs = self.model.predict(batch)
        except Exception as exc:
            if is_torch_oom(exc) or sticky_cuda_error(exc):
                raise  # the OOM split (serving/oom) and the poisoned-context exit handle these
            err = UserModelError(f"{self.user.path}.predict raised {type(exc).__name__}")
            logger.exception("user model failed (error id %s)", err.error_id)
            raise err from None
        return self._outputs(outputs, len(batch))

    def _outputs(self, outputs: Any, n: int) -> list[Any]:
        if isinstance(outputs, torch.Tensor | np.ndarray) and outputs.ndim >= 1:
            outputs = list(outputs)  # one row per input
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
        done = [plain(o) for o in outputs]
        if "encode_response" in self.user.has:
            done = [plain(self.model.encode_response(o)) for o in done]
        return [self.output_check(o) for o in done]

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
        return self.prepare(raw)

    def warmup_batches(self, max_batch_size: int) -> list[list[Any]]:
        """Batches of the example inputs, of each power-of-two size: the only shapes known."""
        if not self.calibrates:
            return []
        return [self.worst_case_items(b) for b in pow2_sizes(max_batch_size)]

    def capture_graphs(
        self, max_batch_size: int, budget_s: float | None, memory: GraphMemory
    ) -> GraphSet:
        raise GraphCaptureError(
            f"{self.user.path}: a user model's predict takes and returns Python lists, which a "
            "CUDA graph cannot hold"
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
