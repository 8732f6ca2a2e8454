"""The model contract: set up on a device, decode a request, predict a batch, encode a response.

A new model family is one new file that fills in these four steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from serve_app.config.args import AppArgs
from serve_app.errors import ConfigError
from serve_app.gpu.graphs import GraphMemoryLimit, GraphSet


@dataclass
class Decoded:
    """A decoded request: the items that go through the batch queue, and what encode needs."""

    items: list[Any]
    meta: dict[str, Any] = field(default_factory=dict)


class ModelAdapter(Protocol):
    """What a model family provides; see embeddings.py and image.py."""

    route: str
    """The POST route this adapter serves, e.g. ``/v1/embeddings``."""

    graphs: GraphSet | None
    """The CUDA graphs ``capture_graphs`` made, or None (a CPU, or not captured)."""

    decode_inline: bool
    """Whether ``decode`` is cheap enough to run on the event loop for a small body (tens of
    microseconds: JSON and a tokenizer call for embeddings; base64 and header checks for images
    on the GPU decode path, which sets it in ``setup``, while Pillow's CPU decode leaves it
    False); the replica runs it in a thread otherwise."""

    def setup(self, device: torch.device) -> None:
        """Load the model onto ``device`` (real or dummy weights, per the config)."""

    def decode(self, body: bytes, content_type: str, query: Mapping[str, str]) -> Decoded:
        """Validate and decode a request body; raise BadRequest / PayloadTooLarge / NotFound."""

    def predict(self, items: Sequence[Any]) -> list[Any]:
        """Run one batch; one output per item, in order."""

    def encode(self, outputs: list[Any], decoded: Decoded) -> dict[str, Any]:
        """Turn outputs into the JSON response body (numpy arrays allowed: orjson renders
        them)."""

    def worst_case_items(self, n: int) -> list[Any]:
        """``n`` decoded items of the largest size a request may carry (for calibration)."""

    def warmup_batches(self, max_batch_size: int) -> list[list[Any]]:
        """Batches covering the shapes traffic brings, run once before serving."""

    def capture_graphs(
        self,
        max_batch_size: int,
        budget_s: float | None = None,
        limit: GraphMemoryLimit | None = None,
    ) -> GraphSet:
        """Capture the forward pass as CUDA graphs for batches up to ``max_batch_size``, for at
        most ``budget_s`` (the rest stay pending: ``GraphSet.capture_all``), their memory within
        ``limit`` when given (``GraphSet``); later ``predict``
        calls replay them where a batch's shape has one (see graphs.py)."""

    def describe(self) -> dict[str, Any]:
        """What ``GET /v1/models`` shows about this model."""


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


def make_adapter(args: AppArgs) -> ModelAdapter:
    """The adapter for ``args.adapter``."""
    if args.adapter == "embeddings":
        from serve_app.adapters.embeddings.adapter import EmbeddingAdapter

        return EmbeddingAdapter(args)
    from serve_app.adapters.image.adapter import ImageClassifierAdapter

    return ImageClassifierAdapter(args)


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
