"""JPEG decoding on the GPU for the image classifier: nvJPEG (through torchvision) in batches,
then the CPU path's crop and resize, bit for bit, on the device (imageresize.py).

On a GPU replica (``image_decode: auto`` with nvJPEG available, or ``gpu``) the request path
reads a JPEG's header only (files.py) and queues an ``EncodedImage`` (what nvJPEG does not take,
PNG and CMYK, Pillow decodes there, before the batch); ``GpuJpegDecoder`` decodes a batch's
JPEGs in chunks of at most ``DECODE_CHUNK_PIXELS`` pixels and ``DECODE_CHUNK_IMAGES`` images per
nvJPEG call and resizes each group of equal-sized images in one call. An image that nvJPEG
refuses comes back from the batch as a ``Redo``: its own request decodes it with Pillow off the
batch thread (the CPU path's 400 when Pillow cannot read it either), so no batch waits on it.

Memory (decoder_memory.py measures it): torchvision 0.26 creates its nvJPEG handle with
``nvjpegCreateEx(backend, NULL, NULL, ...)`` and its device buffer with
``nvjpegBufferDeviceCreate(handle, NULL, ...)``: NULL allocators, so nvJPEG's own device buffers
come from plain ``cudaMalloc``, outside PyTorch's caching allocator and its cap. The decoded
images themselves are ``torch::empty`` tensors, inside it. The chunk bounds keep nvJPEG's
buffers, which grow to the largest batch decoded and stay, at the size measured at start-up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from serve_app.adapters.image.files import EncodedImage
from serve_app.adapters.image.resize import resize_crops
from serve_app.gpu.snapshot import is_torch_oom

logger = logging.getLogger("serve_app")

# One nvJPEG call decodes at most this many pixels (a larger image goes alone) and images: the
# decoded chunk (3 bytes a pixel, inside the torch cap) and nvJPEG's buffers (outside it) stay
# bounded whatever the batch size.
DECODE_CHUNK_PIXELS = 1 << 24
DECODE_CHUNK_IMAGES = 256


def plan_chunks(pixels: Sequence[int], max_pixels: int, max_images: int) -> list[list[int]]:
    """Consecutive index runs of ``pixels`` for one nvJPEG call each: at most ``max_images``
    images and ``max_pixels`` pixels per run, except that an image larger than ``max_pixels``
    runs alone. Example: ``([4, 4, 4, 9, 1], 8, 8) -> [[0, 1], [2], [3], [4]]``."""
    chunks: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, n in enumerate(pixels):
        if current and (total + n > max_pixels or len(current) >= max_images):
            chunks.append(current)
            current, total = [], 0
        current.append(i)
        total += n
    if current:
        chunks.append(current)
    return chunks


def group_by_shape(shapes: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], list[int]]:
    """Indices of equal shapes, in first-seen order: each group is resized in one call."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, shape in enumerate(shapes):
        groups.setdefault(shape, []).append(i)
    return groups


def u8_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


DecodeBatch = Callable[[list[torch.Tensor]], list[torch.Tensor]]
"""Encoded JPEGs (1-D uint8 CPU tensors) -> decoded ``(3, H, W)`` uint8 RGB on the device."""


def nvjpeg_decoder(device: torch.device) -> DecodeBatch:
    """torchvision's batched nvJPEG decode onto ``device``, as RGB (greyscale repeated, like
    Pillow's ``convert("RGB")``)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(data: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))

    return decode


class GpuJpegDecoder:
    """Decodes ``EncodedImage`` JPEGs with nvJPEG and writes their crops into a batch tensor.

    ``device`` must be the one torch device object the replica uses throughout (with its
    index): torchvision keeps one nvJPEG decoder per process and replaces it, leaking the old
    one's buffers, whenever a call names another device. ``decode_batch`` stands in for
    ``nvjpeg_decoder(device)`` in tests.
    """

    def __init__(
        self,
        device: torch.device,
        size: int,
        chunk_pixels: int = DECODE_CHUNK_PIXELS,
        chunk_images: int = DECODE_CHUNK_IMAGES,
        decode_batch: DecodeBatch | None = None,
    ):
        self.device = device
        self.size = size
        self.chunk_pixels = chunk_pixels
        self.chunk_images = chunk_images
        self._decode_batch = decode_batch or nvjpeg_decoder(device)
        self.fallbacks = 0  # images nvJPEG refused, left to Pillow

    def decode_into(
        self, crops: torch.Tensor, rows: Sequence[tuple[int, EncodedImage]]
    ) -> list[int]:
        """Decode each ``(row, image)`` and write its crop into ``crops[row]``; the rows that
        nvJPEG could not decode (for Pillow to try). Out-of-memory errors propagate."""
        order = sorted(rows, key=lambda r: (r[1].height, r[1].width))
        failed: list[int] = []
        plan = plan_chunks([img.pixels for _, img in order], self.chunk_pixels, self.chunk_images)
        for chunk in plan:
            failed += self._crop_chunk(crops, [order[j] for j in chunk])
        self.fallbacks += len(failed)
        return failed

    def _crop_chunk(
        self, crops: torch.Tensor, members: list[tuple[int, EncodedImage]]
    ) -> list[int]:
        # A function of its own so that the chunk's decoded images are freed when it returns,
        # before the next chunk decodes.
        decoded = self._decode([img for _, img in members])
        rows = [row for (row, _), d in zip(members, decoded, strict=True) if d is not None]
        images = [d for d in decoded if d is not None]
        for idx in group_by_shape([tuple(d.shape) for d in images]).values():
            stacked = (
                images[idx[0]].unsqueeze(0)
                if len(idx) == 1
                else torch.stack([images[i] for i in idx])
            )
            targets = torch.tensor([rows[i] for i in idx], device=crops.device)
            crops.index_copy_(0, targets, resize_crops(stacked, self.size))
        return [row for (row, _), d in zip(members, decoded, strict=True) if d is None]

    def _decode(self, images: Sequence[EncodedImage]) -> list[torch.Tensor | None]:
        """One nvJPEG call for ``images``; when it fails, one call per image. None for an image
        that failed alone or came back in another size than its header's."""
        try:
            out = self._decode_batch([u8_tensor(img.data) for img in images])
        except RuntimeError as exc:
            if is_torch_oom(exc):
                raise
            if len(images) == 1:
                return [None]
            logger.info(
                "nvJPEG refused a chunk of %d images; decoding them one by one", len(images)
            )
            return [self._decode([img])[0] for img in images]
        return [
            d if tuple(d.shape) == (3, img.height, img.width) else None
            for d, img in zip(out, images, strict=True)
        ]
