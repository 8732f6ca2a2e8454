"""The model contract, in two halves (as text-embeddings-inference keeps its ``Backend`` apart
from its HTTP types, and LitServe's specs own their routes and models):

- a **wire spec** (``WireSpec``): what travels over HTTP. Its route, its request and response
  models (the OpenAPI operation), ``decode`` (a body to the request's raw inputs) and ``encode``
  (outputs to the response body). It knows nothing of devices.
- a **model backend** (``ModelBackend``): what runs on the device. ``setup``, ``prepare`` (raw
  inputs to model items: tokenizing, image decoding), ``predict`` of a batch, the worst-case
  items that calibration sizes the batch with, the warm-up batches, CUDA graphs, and what it
  keeps outside torch (``HeldOutsideTorch``, through a start-up hook).

``Model`` pairs them; it is all a replica serves. A family (``serve_app/adapters/<family>/``,
a ``Family``) builds one from an application's args, and says what its backend will keep outside
torch before anything loads; ``serve_app.adapters.family`` picks it by ``args.adapter``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from serve_app.adapters.wire import Operation
from serve_app.config.args import AppArgs
from serve_app.errors import ConfigError
from serve_app.gpu.capping import OutsideTorchHook
from serve_app.gpu.graphs import GraphMemory, GraphSet


@dataclass
class Decoded:
    """A decoded request.

    Attributes:
        inputs: the raw inputs the wire spec read (texts, image bytes), one per item.
        meta: what ``encode`` needs from the request (an encoding format, ``top_k``).
        items: the backend's prepared items, one per input, which go through the batch queue.
    """

    inputs: list[Any]
    meta: dict[str, Any] = field(default_factory=dict)
    items: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Redo:
    """A batch output for an item the batch could not run as it was (a JPEG nvJPEG refused):
    the replica calls ``prepare`` off the event loop and the batch thread, and queues what it
    returns in a later batch, so no batch waits on a slow path (it raises a ServeAppError
    naming the input when the item cannot be served at all)."""

    prepare: Callable[[], Any]


class WireSpec(Protocol):
    """The HTTP half of a model: one POST route."""

    route: str
    """The POST route it serves, e.g. ``/v1/embeddings``."""

    decode_inline: bool
    """Whether ``decode`` is cheap enough for the event loop on a small body (parsing JSON is;
    base64 of many images may not be)."""

    def decode(self, body: bytes, content_type: str, query: Mapping[str, str]) -> Decoded:
        """Validate a request body and read its inputs; raise BadRequest, NotFound,
        PayloadTooLarge or UnsupportedMediaType naming the field."""

    def encode(self, outputs: list[Any], decoded: Decoded) -> dict[str, Any] | list[Any]:
        """The response body for ``outputs`` (numpy arrays allowed: orjson renders them): a JSON
        object, or a JSON array where the wire format is one (TEI's ``/predict``)."""

    def openapi(self, max_body_bytes: int) -> Operation:
        """Its route's operation and schemas, narrowed to this application's settings."""


class ModelBackend(Protocol):
    """The device half of a model."""

    graphs: GraphSet | None
    """The CUDA graphs ``capture_graphs`` made, or None (a CPU, or not captured)."""

    prepare_inline: bool
    """Whether ``prepare`` is cheap enough for the event loop on a small body (tokenizing a
    short text is; decoding a JPEG is not). It may change in ``setup``."""

    def setup(self, device: torch.device) -> None:
        """Load the model onto ``device`` (real or dummy weights, per the config)."""

    def prepare(self, inputs: Sequence[Any]) -> list[Any]:
        """The model items for a request's raw inputs, in order; raise BadRequest naming
        ``input[i]`` for one that cannot be served (too long, not an image)."""

    def predict(self, items: Sequence[Any]) -> list[Any]:
        """Run one batch; one output per item, in order (an ``ItemError`` for an item that
        failed on its own, a ``Redo`` for one that must be prepared again)."""

    def worst_case_items(self, n: int) -> list[Any]:
        """``n`` items of the largest size a request may carry (for calibration)."""

    def warmup_batches(self, max_batch_size: int) -> list[list[Any]]:
        """Batches covering the shapes traffic brings, run before serving."""

    def capture_graphs(
        self, max_batch_size: int, budget_s: float | None, memory: GraphMemory
    ) -> GraphSet:
        """Capture the forward pass as CUDA graphs for batches up to ``max_batch_size``, for at
        most ``budget_s`` (the rest stay pending: ``GraphSet.capture_all``), within
        ``memory``'s limit; later ``predict`` calls replay them where a batch's shape has one."""

    def describe(self) -> dict[str, Any]:
        """What ``GET /v1/models`` shows about this model."""

    def report(self) -> dict[str, Any]:
        """Figures of its own for the replica's report (e.g. where its setup time went)."""


@dataclass
class Model:
    """What a replica serves: a wire spec and a model backend.

    Attributes:
        name: the model's name (``args.model_name``).
        spec: the HTTP half.
        backend: the device half.
    """

    name: str
    spec: WireSpec
    backend: ModelBackend

    @property
    def decode_inline(self) -> bool:
        """Whether a small body decodes on the event loop (both halves' steps are cheap)."""
        return self.spec.decode_inline and self.backend.prepare_inline

    def decode(self, body: bytes, content_type: str, query: Mapping[str, str]) -> Decoded:
        """The spec's decode, then the backend's ``prepare`` of its inputs into ``items``."""
        decoded = self.spec.decode(body, content_type, query)
        decoded.items = self.backend.prepare(decoded.inputs)
        return decoded

    def encode(self, outputs: list[Any], decoded: Decoded) -> dict[str, Any] | list[Any]:
        return self.spec.encode(outputs, decoded)


class Family(Protocol):
    """A model family's package."""

    def build(self, args: AppArgs) -> Model:
        """The model for an application's args; nothing touches a device yet."""

    def outside_torch_hook(self, args: AppArgs) -> OutsideTorchHook | None:
        """The backend's start-up hook for memory it keeps outside torch (serve_app.gpu.capping
        calls it after the CUDA context, before the cap), or None when it keeps none."""


def pow2_sizes(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit``, and ``limit`` itself."""
    sizes, n = [], 1
    while n < limit:
        sizes.append(n)
        n *= 2
    return [*sizes, max(1, limit)]


def resolve_dtype(args: AppArgs, device: torch.device) -> torch.dtype:
    if device.type != "cuda":
        return torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[
        args.dtype
    ]


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Weights from safetensors, or torch.load with weights_only=True (never a plain unpickle).

    Raises:
        ConfigError: the file cannot be read as weights; the message names ``args.model_path``.
    """
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - safetensors, pickle and zip errors alike
        raise ConfigError(
            f"args.model_path: cannot read weights from {str(path)!r} "
            f"({type(exc).__name__}: {str(exc)[:200]}); use a .safetensors file or a state dict "
            "saved with torch.save"
        ) from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ConfigError(
            f"args.model_path: {str(path)!r} holds a {type(obj).__name__}, not a state dict; "
            "save model.state_dict()"
        )
    return obj
