"""The image classification backend (default: ResNet-50; any torchvision classifier by name).
Weights load from a local safetensors file, or a ``torch.load(weights_only=True)`` file.

Two decode paths: on the CPU path ``prepare`` decodes with Pillow on the request path; on the
GPU path (``image_decode``, gpudecode.py) it decodes with Pillow only what nvJPEG does not take
(PNG, CMYK), and ``predict`` decodes the batch's JPEGs with nvJPEG and crops them on the GPU
exactly as Pillow would (resize.py). Either way every header is read, and the request's pixels
summed against ``max_request_pixels``, before any pixel is decoded (files.read_headers); Pillow
decodes a large JPEG at the reduced size the crop needs (files.draft_for_crop), so the two paths'
crops of such a JPEG differ by that reduction. Pillow never runs inside ``predict``: a JPEG that
nvJPEG refuses in a batch comes back as a ``Redo`` for its request to decode off the batch.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from serve_app.adapters.contract import Redo, load_state_dict, pow2_sizes, resolve_dtype
from serve_app.adapters.image.decoder_memory import use_gpu_decode
from serve_app.adapters.image.files import (
    EncodedImage,
    ImageHeader,
    crop_opened,
    pillow_crop,
    read_headers,
    synthetic_jpeg,
    worst_case_size,
)
from serve_app.adapters.image.gpudecode import GpuJpegDecoder
from serve_app.adapters.image.resnet import ARCHS, build_resnet
from serve_app.config.args import AppArgs
from serve_app.errors import ConfigError
from serve_app.gpu.graphs import GraphMemory, GraphSet, bucket_for, graph_batch_sizes

logger = logging.getLogger("serve_app")

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
# Threads that decode the images of one request in parallel (Pillow releases the GIL while it
# decodes and resizes).
DECODE_THREADS = min(4, os.cpu_count() or 1)
# The JPEG that GPU warm-up batches carry: ImageNet's most common size.
TYPICAL_JPEG_SIZE = (500, 375)


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


def _where(item: EncodedImage) -> tuple[bytes, int]:
    return item.data, item.index


def _as_tensor(crop: np.ndarray) -> torch.Tensor:
    # Pillow's arrays are read-only, which torch.from_numpy warns about: copy those.
    return torch.from_numpy(np.require(crop, requirements="W"))


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


class ImageClassifier:
    """Top-k scores for JPEG/PNG images."""

    # Never on the event loop: even a small body can hold a PNG of millions of pixels, which
    # prepare decodes on either path.
    prepare_inline = False

    def __init__(self, args: AppArgs):
        self.args = args
        self.model: torch.nn.Module | None = None
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.labels: list[str] | None = None
        self._decode_pool: ThreadPoolExecutor | None = None
        self._gpu: GpuJpegDecoder | None = None
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
        gpu_decode = use_gpu_decode(self.args, device)  # before the weights: fail fast
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
        if gpu_decode:
            self._gpu = GpuJpegDecoder(device, self.args.image_size)
            self._pool()  # now, not lazily from two threads at once
            logger.info("image_decode: JPEGs decode on %s with nvJPEG, in batches", device)

    def prepare(self, inputs: Sequence[Any]) -> list[Any]:
        """Every header first (the request's pixel budget: files.read_headers), then each
        image's crop from Pillow (in threads for several), or, for a JPEG nvJPEG takes on the GPU
        path, an ``EncodedImage`` that ``predict`` decodes with the batch. BadRequest or
        PayloadTooLarge for an image, or a request, that cannot be served."""
        blobs = list(inputs)
        args = self.args
        headers = read_headers(
            blobs,
            args.image_size,
            args.max_image_pixels,
            args.max_request_pixels,
            gpu_path=self._gpu is not None,
        )
        items: list[Any] = [
            EncodedImage(blobs[h.index], h.index, h.image.width, h.image.height, gpu=True)
            if h.gpu
            else None
            for h in headers
        ]
        pillow = [h for h in headers if not h.gpu]
        if len(pillow) > 1 and DECODE_THREADS > 1:
            # map() yields in order, so the first bad image by index is the one reported
            crops = list(self._pool().map(self._crop, pillow))
        else:
            crops = [self._crop(h) for h in pillow]
        for h, crop in zip(pillow, crops, strict=True):
            items[h.index] = crop
        return items

    def _crop(self, header: ImageHeader) -> np.ndarray:
        where = f"input[{header.index}]"
        return crop_opened(header.image, where, self.args.image_size, self.args.max_image_pixels)

    def _pool(self) -> ThreadPoolExecutor:
        if self._decode_pool is None:
            self._decode_pool = ThreadPoolExecutor(DECODE_THREADS, "decode")
        return self._decode_pool

    def _preprocess(self, blob: bytes, index: int) -> np.ndarray:
        """The CPU path's decode and crop of one image (imagefile.pillow_crop)."""
        return pillow_crop(blob, index, self.args.image_size, self.args.max_image_pixels)

    def _forward(self, batch_u8: torch.Tensor) -> tuple[torch.Tensor]:
        """uint8 NHWC crops (on any device) -> logits: the part a CUDA graph holds."""
        assert self.model is not None, "setup() must run before predict()"
        return (self.model(to_model_input(batch_u8, self.device, self.dtype)),)

    def capture_graphs(
        self, max_batch_size: int, budget_s: float | None, memory: GraphMemory
    ) -> GraphSet:
        """CUDA graphs of the forward pass for batch buckets up to ``max_batch_size`` (for at
        most ``budget_s``: see ``GraphSet.capture_all``)."""
        size = self.args.image_size
        graphs = GraphSet(self._forward, memory)
        sizes = graph_batch_sizes(max_batch_size)
        self.graphs, self._graph_sizes = graphs, sizes
        graphs.capture_all(
            [
                (b, (torch.zeros((b, size, size, 3), dtype=torch.uint8, device=self.device),))
                for b in sizes
            ],
            budget_s,
        )
        return graphs

    def predict(self, items: Sequence[Any]) -> list[Any]:
        """Top-k scores per item, or a ``Redo`` for an image the GPU path left to Pillow
        (nvJPEG refused it); items are HWC uint8 crops or ``EncodedImage`` (GPU path)."""
        assert self.model is not None, "setup() must run before predict()"
        redo: dict[int, Redo] = {}
        if self._gpu is not None and any(isinstance(x, EncodedImage) for x in items):
            batch_u8, redo = self._gpu_batch(items)
        else:
            batch_u8 = torch.from_numpy(np.stack(items))
        if not redo:
            return self._classify(batch_u8)
        keep = [i for i in range(len(items)) if i not in redo]
        scored = iter(self._classify(batch_u8[keep]) if keep else [])
        return [redo[i] if i in redo else next(scored) for i in range(len(items))]

    def _gpu_batch(self, items: Sequence[Any]) -> tuple[torch.Tensor, dict[int, Redo]]:
        """The batch's crops on the device: nvJPEG for the JPEGs it takes, Pillow's crops from
        ``prepare`` copied in, and a ``Redo`` (a Pillow decode for the request to run off the
        batch) for each image nvJPEG refused or that only Pillow decodes."""
        assert self._gpu is not None
        size = self.args.image_size
        crops = torch.empty((len(items), size, size, 3), dtype=torch.uint8, device=self.device)
        redo: list[int] = []
        on_gpu: list[tuple[int, EncodedImage]] = []
        for i, item in enumerate(items):
            if not isinstance(item, EncodedImage):
                crops[i].copy_(_as_tensor(item))
            elif item.gpu:
                on_gpu.append((i, item))
            else:
                redo.append(i)
        redo += self._gpu.decode_into(crops, on_gpu)
        pillow = functools.partial
        return crops, {i: Redo(pillow(self._preprocess, *_where(items[i]))) for i in redo}

    def _classify(self, batch_u8: torch.Tensor) -> list[tuple[np.ndarray, np.ndarray]]:
        graphs = self.graphs
        # Captured buckets only: a shape still pending (or skipped) pads up to a larger one.
        bucket = (
            bucket_for(len(batch_u8), [b for b in self._graph_sizes if graphs.has(b)])
            if graphs is not None
            else None
        )
        if graphs is not None:
            own = bucket_for(len(batch_u8), self._graph_sizes)
            if own is not None and own != bucket:
                graphs.want(own)  # captured next, between batches
        with torch.inference_mode():
            if graphs is not None and bucket is not None:
                (logits,) = graphs.run(bucket, (batch_u8,))
            else:
                (logits,) = self._forward(batch_u8)
            probs = torch.softmax(logits.float(), dim=1)
            k = min(1000, probs.shape[1])
            scores, ids = probs.topk(k, dim=1)
            scores_np, ids_np = scores.cpu().numpy(), ids.cpu().numpy()
        return [(scores_np[i], ids_np[i]) for i in range(len(batch_u8))]

    def label(self, class_id: int) -> str:
        if self.labels and class_id < len(self.labels):
            return self.labels[class_id]
        return f"class_{class_id}"

    def worst_case_items(self, n: int) -> list[Any]:
        """CPU path: ``n`` crops. GPU path: ``n`` JPEGs whose decode needs the most memory:
        as many of the largest accepted JPEG (``max_image_pixels``, 4:4:4) as one nvJPEG chunk
        holds, then typical ones (each chunk is decoded and cropped before the next, so the
        peak is the largest chunk beside the batch's crops, whatever the rest carry)."""
        if self._gpu is None:
            size = self.args.image_size
            return [np.zeros((size, size, 3), dtype=np.uint8) for _ in range(n)]
        w, h = worst_case_size(self.args.max_image_pixels)
        fill = min(n, self._gpu.chunk_images, max(1, self._gpu.chunk_pixels // (w * h)))
        largest = EncodedImage(synthetic_jpeg(w, h), 0, w, h, gpu=True)
        return [largest] * fill + [self._typical_jpeg()] * (n - fill)

    def warmup_batches(self, max_batch_size: int) -> list[list[Any]]:
        if self._gpu is None:
            return [self.worst_case_items(b) for b in pow2_sizes(max_batch_size)]
        return [[self._typical_jpeg()] * b for b in pow2_sizes(max_batch_size)]

    def _typical_jpeg(self) -> EncodedImage:
        w, h = TYPICAL_JPEG_SIZE
        if w * h > self.args.max_image_pixels:
            w, h = worst_case_size(self.args.max_image_pixels)
        return EncodedImage(synthetic_jpeg(w, h), 0, w, h, gpu=True)

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.args.model_name,
            "object": "model",
            "owned_by": "serve_app",
            "task": "image-classification",
            "arch": self.args.arch,
            "image_size": self.args.image_size,
            "image_decode": "gpu" if self._gpu is not None else "cpu",
            "load_format": self.args.load_format,
        }

    def report(self) -> dict[str, Any]:
        return {}
