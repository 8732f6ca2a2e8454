"""Image classification (default: ResNet-50; any torchvision classifier by name).

Accepts JPEG or PNG bytes, as a raw body (``Content-Type: image/jpeg``) or base64 in JSON
(``{"input": "<base64>" | [...], "top_k": 5}``); returns the top-k labels and scores.
Weights load from a local safetensors file, or a ``torch.load(weights_only=True)`` file.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from serve_app.adapters.base import Decoded, pow2_sizes, resolve_dtype
from serve_app.adapters.jsonbody import check_model, parse_json_object, string_list
from serve_app.adapters.resnet import ARCHS, build_resnet
from serve_app.config import AppArgs
from serve_app.errors import (
    BadRequest,
    ConfigError,
    PayloadTooLarge,
    ServeAppError,
    UnsupportedMediaType,
)
from serve_app.graphs import GraphSet, bucket_for, graph_batch_sizes

logger = logging.getLogger("serve_app")

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
IMAGE_TYPES = ("image/jpeg", "image/png")
# Threads that decode the images of one request in parallel (Pillow releases the GIL while it
# decodes and resizes).
DECODE_THREADS = min(4, os.cpu_count() or 1)


@functools.lru_cache(maxsize=8)
def _norm_constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """MEAN and STD as (1, 3, 1, 1) tensors on ``device``, made once per device rather than
    copied to it with every batch."""
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    return mean, std


def to_model_input(
    batch_u8: torch.Tensor, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """NHWC uint8 crops -> normalised NCHW ``dtype`` on ``device`` (channels-last on a GPU).

    The bytes travel as uint8 (a quarter of float32's) and the arithmetic runs on the device,
    in float32 before the cast, so the result matches torchvision's CPU transform.
    """
    x = batch_u8.to(device, non_blocking=True).permute(0, 3, 1, 2).float()
    mean, std = _norm_constants(device)
    x = ((x / 255.0) - mean) / std
    fmt = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    return x.to(dtype).contiguous(memory_format=fmt)


def _torchvision() -> Any | None:
    try:
        import torchvision
    except Exception:  # noqa: BLE001 - a broken torchvision install is the same as none
        return None
    return torchvision


def build_model(arch: str) -> tuple[torch.nn.Module, list[str] | None]:
    """The architecture by name (random weights) and its ImageNet labels when known."""
    tv = _torchvision()
    if tv is not None:
        try:
            builder = tv.models.get_model_builder(arch)
        except ValueError:
            raise ConfigError(
                f"args.arch: {arch!r} is not a torchvision classifier; use a name from "
                "torchvision.models.list_models(), e.g. 'resnet50'"
            ) from None
        labels = None
        try:
            labels = list(tv.models.get_model_weights(arch).DEFAULT.meta["categories"])
        except Exception:  # noqa: BLE001 - labels are optional metadata
            labels = None
        return builder(weights=None), labels
    if arch not in ARCHS:
        raise ConfigError(
            f"args.arch: {arch!r} needs torchvision, which is not installed; install "
            f"torchvision or use one of the built-in {sorted(ARCHS)}"
        )
    logger.info("torchvision not installed: using serve_app's built-in %s", arch)
    return build_resnet(arch), None


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


class ImageClassifierAdapter:
    """``POST /v1/classify``: top-k labels for JPEG/PNG images."""

    route = "/v1/classify"

    def __init__(self, args: AppArgs):
        self.args = args
        self.model: torch.nn.Module | None = None
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.labels: list[str] | None = None
        self._decode_pool: ThreadPoolExecutor | None = None
        self.graphs: GraphSet | None = None
        self._graph_sizes: list[int] = []
        if args.load_format != "dummy":
            if not args.model_path:
                raise ConfigError(
                    "args.model_path: image classification needs a weights file (.safetensors "
                    "or a torch state dict); set model_path or use load_format: dummy"
                )
            if not Path(args.model_path).is_file():
                raise ConfigError(f"args.model_path: {args.model_path!r} is not a file")
        if args.labels_path and not Path(args.labels_path).is_file():
            raise ConfigError(f"args.labels_path: {args.labels_path!r} is not a file")

    def setup(self, device: torch.device) -> None:
        model, labels = build_model(self.args.arch)
        if self.args.load_format == "dummy":
            logger.warning(
                "load_format=dummy: %s with RANDOM weights (benchmarks and capacity planning)",
                self.args.arch,
            )
        else:
            assert self.args.model_path is not None
            state = load_state_dict(Path(self.args.model_path))
            try:
                model.load_state_dict(state)
            except RuntimeError as exc:
                raise ConfigError(
                    f"args.model_path: weights do not match arch {self.args.arch!r}: "
                    f"{str(exc)[:300]}"
                ) from None
        if self.args.labels_path:
            labels = Path(self.args.labels_path).read_text().splitlines()
        self.labels = labels
        self.dtype = resolve_dtype(self.args, device)
        fmt = torch.channels_last if device.type == "cuda" else torch.contiguous_format
        model = model.to(device=device, dtype=self.dtype).to(memory_format=fmt)  # type: ignore[call-overload]
        self.model = model.eval()
        self.device = device

    def decode(self, body: bytes, content_type: str, query: dict[str, str]) -> Decoded:
        ctype = content_type.split(";")[0].strip().lower()
        top_k = self.args.top_k
        if ctype in IMAGE_TYPES:
            blobs = [body]
            if "top_k" in query:
                top_k = self._top_k(query["top_k"])
        elif ctype in ("application/json", ""):
            doc = parse_json_object(body)
            check_model(doc, self.args.model_name)
            texts, _ = string_list(doc, "input", self.args.max_inputs_per_request)
            if "top_k" in doc:
                top_k = self._top_k(doc["top_k"])
            blobs = []
            for i, text in enumerate(texts):
                try:
                    blobs.append(base64.b64decode(text, validate=True))
                except (binascii.Error, ValueError):
                    raise BadRequest(
                        f"'input[{i}]' is not valid base64", param=f"input[{i}]"
                    ) from None
        else:
            raise UnsupportedMediaType(
                f"Content-Type {ctype!r} is not supported; send image/jpeg, image/png, or "
                "application/json with base64 images"
            )
        if len(blobs) > 1 and DECODE_THREADS > 1:
            if self._decode_pool is None:
                self._decode_pool = ThreadPoolExecutor(DECODE_THREADS, "decode")
            # map() yields in order, so the first bad image by index is the one reported
            items = list(self._decode_pool.map(self._preprocess, blobs, range(len(blobs))))
        else:
            items = [self._preprocess(blob, i) for i, blob in enumerate(blobs)]
        return Decoded(items=items, meta={"top_k": top_k})

    def _top_k(self, value: Any) -> int:
        # JSON gives an int; a query string gives its digits. Floats and booleans are refused
        # rather than truncated.
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(f"'top_k' must be an integer, got {value!r}", param="top_k")
        if not 1 <= value <= 1000:
            raise BadRequest(f"'top_k' must be between 1 and 1000, got {value}", param="top_k")
        return value

    def _open(self, blob: bytes, where: str) -> Any:
        """Decode one image to RGB, refusing other formats and too many pixels."""
        from PIL import Image

        # Pillow refuses images over twice this limit while reading the header (and only warns
        # between 1x and 2x); the explicit check below gives every oversized image the same 413.
        Image.MAX_IMAGE_PIXELS = self.args.max_image_pixels
        opened = Image.open(io.BytesIO(blob))
        if opened.format not in ("JPEG", "PNG"):
            raise BadRequest(
                f"'{where}' is {opened.format}; only JPEG and PNG are accepted", param=where
            )
        w, h = opened.size
        if w * h > self.args.max_image_pixels:
            raise PayloadTooLarge(
                f"'{where}' is {w}x{h} = {w * h} pixels; at most "
                f"{self.args.max_image_pixels} (args.max_image_pixels)",
                param=where,
            )
        return opened.convert("RGB")

    def _preprocess(self, blob: bytes, index: int) -> np.ndarray:
        """torchvision's ImageNet resize and crop: resize the short side to ``size * 256 / 224``
        and centre-crop ``size`` x ``size``; returns HWC uint8 (``to_model_input`` scales and
        normalises the batch on the device)."""
        from PIL import Image

        where = f"input[{index}]"
        try:
            img = self._open(blob, where)
        except ServeAppError:
            raise
        except Image.DecompressionBombError:
            raise PayloadTooLarge(
                f"'{where}' exceeds args.max_image_pixels ({self.args.max_image_pixels})",
                param=where,
            ) from None
        except Exception:  # noqa: BLE001 - Pillow raises many types for corrupt data
            raise BadRequest(
                f"'{where}' is not a readable JPEG or PNG image", param=where
            ) from None
        size = self.args.image_size
        # Crop in source coordinates, then resize only the crop: resizing the whole image first
        # would let a 1 x 40,000,000 strip grow to billions of pixels.
        scale = size * 256 / 224 / min(img.size)
        side = size / scale
        left, top = (img.width - side) / 2, (img.height - side) / 2
        img = img.resize(
            (size, size), Image.Resampling.BILINEAR, box=(left, top, left + side, top + side)
        )
        return np.asarray(img, dtype=np.uint8)

    def _forward(self, batch_u8: torch.Tensor) -> tuple[torch.Tensor]:
        """uint8 NHWC crops (on any device) -> logits: the part a CUDA graph holds."""
        assert self.model is not None, "setup() must run before predict()"
        return (self.model(to_model_input(batch_u8, self.device, self.dtype)),)

    def capture_graphs(self, max_batch_size: int) -> GraphSet:
        """CUDA graphs of the forward pass for batch buckets up to ``max_batch_size``."""
        size = self.args.image_size
        graphs = GraphSet(self._forward, self.device)
        sizes = graph_batch_sizes(max_batch_size)
        graphs.capture_all(
            [
                (b, (torch.zeros((b, size, size, 3), dtype=torch.uint8, device=self.device),))
                for b in sizes
            ]
        )
        self.graphs = graphs
        self._graph_sizes = [b for b in sizes if graphs.has(b)]
        return graphs

    def predict(self, items: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        assert self.model is not None, "setup() must run before predict()"
        batch_u8 = torch.from_numpy(np.stack(items))
        bucket = bucket_for(len(items), self._graph_sizes)
        with torch.inference_mode():
            if self.graphs is not None and bucket is not None:
                (logits,) = self.graphs.run(bucket, (batch_u8,))
            else:
                (logits,) = self._forward(batch_u8)
            probs = torch.softmax(logits.float(), dim=1)
            k = min(1000, probs.shape[1])
            scores, ids = probs.topk(k, dim=1)
            scores_np, ids_np = scores.cpu().numpy(), ids.cpu().numpy()
        return [(scores_np[i], ids_np[i]) for i in range(len(items))]

    def encode(self, outputs: list[Any], decoded: Decoded) -> dict[str, Any]:
        k = decoded.meta["top_k"]
        data = []
        for i, (scores, ids) in enumerate(outputs):
            top = [
                {"label": self._label(int(c)), "class_id": int(c), "score": float(s)}
                for s, c in zip(scores[:k], ids[:k], strict=True)
            ]
            data.append({"object": "classification", "index": i, "top_k": top})
        return {"object": "list", "model": self.args.model_name, "data": data}

    def _label(self, class_id: int) -> str:
        if self.labels and class_id < len(self.labels):
            return self.labels[class_id]
        return f"class_{class_id}"

    def worst_case_items(self, n: int) -> list[np.ndarray]:
        size = self.args.image_size
        return [np.zeros((size, size, 3), dtype=np.uint8) for _ in range(n)]

    def warmup_batches(self, max_batch_size: int) -> list[list[np.ndarray]]:
        return [self.worst_case_items(b) for b in pow2_sizes(max_batch_size)]

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.args.model_name,
            "object": "model",
            "owned_by": "serve_app",
            "task": "image-classification",
            "arch": self.args.arch,
            "image_size": self.args.image_size,
            "load_format": self.args.load_format,
        }
