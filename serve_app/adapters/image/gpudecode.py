"""JPEG decoding on the GPU for the image classifier: nvJPEG (through torchvision) in batches,
then the CPU path's crop and resize, bit for bit, on the device (imageresize.py).

On a GPU replica (``image_decode: auto`` with nvJPEG available, or ``gpu``) the request path only
reads an image's header (image.py) and queues an ``EncodedImage``; ``GpuJpegDecoder`` decodes a
batch's JPEGs in chunks of at most ``DECODE_CHUNK_PIXELS`` pixels and ``DECODE_CHUNK_IMAGES``
images per nvJPEG call and resizes each group of equal-sized images in one call. An image that
nvJPEG refuses goes to Pillow; one that Pillow refuses too gets an ``ItemError`` in its slot,
which fails its own request with the CPU path's 400 and no other.

Memory (see ``measure_decoder_bytes``): torchvision 0.26 creates its nvJPEG handle with
``nvjpegCreateEx(backend, NULL, NULL, ...)`` and its device buffer with
``nvjpegBufferDeviceCreate(handle, NULL, ...)``: NULL allocators, so nvJPEG's own device buffers
come from plain ``cudaMalloc``, outside PyTorch's caching allocator and its cap. The decoded
images themselves are ``torch::empty`` tensors, inside it. The chunk bounds keep nvJPEG's
buffers, which grow to the largest batch decoded and stay, at the size measured at start-up.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from serve_app.adapters.image.files import EncodedImage, synthetic_jpeg, worst_case_size
from serve_app.adapters.image.resize import resize_crops
from serve_app.config.args import AppArgs
from serve_app.errors import StartupError
from serve_app.serving.oom import is_torch_oom

logger = logging.getLogger("serve_app")

# One nvJPEG call decodes at most this many pixels (a larger image goes alone) and images: the
# decoded chunk (3 bytes a pixel, inside the torch cap) and nvJPEG's buffers (outside it) stay
# bounded whatever the batch size.
DECODE_CHUNK_PIXELS = 1 << 24
DECODE_CHUNK_IMAGES = 256
# Room kept for nvJPEG's buffers beyond what the start-up probe measured (see reserve_bytes).
DECODER_MARGIN_FRACTION = 0.25
DECODER_MARGIN_BYTES = 64 * 1024**2


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


def _u8_tensor(data: bytes) -> torch.Tensor:
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
            out = self._decode_batch([_u8_tensor(img.data) for img in images])
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


# ---- start-up: is nvJPEG there, and what does it hold outside the torch cap ----------------


@functools.lru_cache(maxsize=8)
def nvjpeg_problem(device: torch.device) -> str | None:
    """Why JPEGs cannot be decoded on ``device`` (a CUDA device), or None when they can: a
    tiny decode through torchvision, which also creates its nvJPEG decoder there."""
    try:
        decode = nvjpeg_decoder(device)
    except Exception as exc:  # noqa: BLE001 - missing and broken installs alike
        return f"torchvision is not importable ({type(exc).__name__}: {str(exc)[:200]})"
    try:
        decode([_u8_tensor(synthetic_jpeg(16, 16))])
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - e.g. torchvision built without nvJPEG
        return f"torchvision cannot decode JPEGs on {device} ({str(exc)[:200]})"
    return None


def use_gpu_decode(args: AppArgs, device: torch.device) -> bool:
    """Whether this replica decodes JPEGs on the GPU: ``args.image_decode`` resolved on
    ``device``. ``auto``: when ``device`` is CUDA and nvJPEG works; ``cpu``: never; ``gpu``:
    always.

    Raises:
        StartupError: ``gpu`` on a replica without CUDA or without nvJPEG; the message names
            ``args.image_decode``.
    """
    if args.adapter != "image-classification" or args.image_decode == "cpu":
        return False
    if device.type != "cuda":
        problem: str | None = "this replica runs on the CPU (it sees no CUDA device)"
    else:
        problem = nvjpeg_problem(device)
    if problem is None:
        return True
    if args.image_decode == "gpu":
        raise StartupError(
            f"args.image_decode is 'gpu' but {problem}; set image_decode: auto (the GPU when "
            "it can) or cpu, or run the replica on a GPU with torchvision's nvJPEG"
        )
    logger.info("image_decode auto: images decode on the CPU (%s)", problem)
    return False


def startup_decoder_memory(
    args: AppArgs, device: torch.device, used_bytes: Callable[[], int | None]
) -> DecoderMemory | None:
    """At a replica's start-up, before its torch cap: ``measure_decoder_bytes`` when it will
    decode on the GPU (``use_gpu_decode``), else None.

    Raises:
        StartupError: ``image_decode: gpu`` without nvJPEG, or NVML unreadable.
    """
    if not use_gpu_decode(args, device):
        return None
    return measure_decoder_bytes(device, args.max_image_pixels, used_bytes)


def decoder_probe_batches(
    max_image_pixels: int,
    chunk_pixels: int = DECODE_CHUNK_PIXELS,
    chunk_images: int = DECODE_CHUNK_IMAGES,
) -> list[list[bytes]]:
    """The nvJPEG calls that need the most of its memory at these limits: a chunk filled with
    the largest images, the largest image progressive (nvJPEG's other path), and a chunk of
    ``chunk_images`` images that fill ``chunk_pixels`` between them."""
    width, height = worst_case_size(max_image_pixels)
    fill = max(1, min(chunk_images, chunk_pixels // (width * height)))
    small = max(1, math.isqrt(min(chunk_pixels // chunk_images, max_image_pixels)))
    return [
        [synthetic_jpeg(width, height)] * fill,
        [synthetic_jpeg(width, height, progressive=True)],
        [synthetic_jpeg(small, small)] * chunk_images,
    ]


@dataclass(frozen=True)
class DecoderMemory:
    """Device memory that nvJPEG keeps outside PyTorch's allocator (``measure_decoder_bytes``).

    Attributes:
        raw_bytes: how much more the process's NVML bytes grew than torch's reserved bytes did
            over the probe decodes: nvJPEG's ``cudaMalloc`` buffers and the library's own state,
            kept for the life of the process. It belongs with the CUDA context in the replica's
            non-torch overhead, before the torch cap is set.
        before_bytes: the NVML reading before the probe.
        high_bytes: the highest NVML reading after each probe decode (torch's cache emptied).
        reserved_delta_bytes: torch's reserved bytes after the probe minus before.
        refused_images: probe images nvJPEG refused (at run time such images go to Pillow).
        probe_s: seconds the probe took (encoding its images included).
    """

    raw_bytes: int
    before_bytes: int
    high_bytes: int
    reserved_delta_bytes: int
    refused_images: int
    probe_s: float

    @property
    def reserve_bytes(self) -> int:
        """What the replica sets aside outside its torch cap for nvJPEG: ``raw_bytes`` and a
        margin (DECODER_MARGIN_*). On the H200, a mix of sizes after the probe grew nvJPEG's
        buffers 111 MB (18%) past what the probe had measured
        (docs/results/gpu_tests/decode/image_decode_gpu.json)."""
        return self.raw_bytes + max(
            DECODER_MARGIN_BYTES, int(self.raw_bytes * DECODER_MARGIN_FRACTION)
        )


def measure_decoder_bytes(
    device: torch.device, max_image_pixels: int, used_bytes: Callable[[], int | None]
) -> DecoderMemory:
    """Run the decoder's worst-case calls (``decoder_probe_batches``) on ``device`` and measure
    what nvJPEG keeps outside the torch allocator, through ``used_bytes`` (this process's NVML
    bytes, or the device's used bytes when NVML does not list the process).

    Call it once per process, after the CUDA context exists and before the torch cap is set (the
    decoded images, torch tensors, need room for the moment); afterwards nvJPEG's buffers only
    grow past this if a call decodes more than a chunk allows, which ``GpuJpegDecoder`` never
    does. It empties torch's cache.

    Raises:
        StartupError: ``used_bytes`` could not read NVML.
    """
    decode = nvjpeg_decoder(device)

    def read() -> int:
        value = used_bytes()
        if value is None:
            raise StartupError(
                "cannot read this process's GPU memory through NVML to measure nvJPEG's "
                "buffers; set args.image_decode: cpu"
            )
        return int(value)

    t0 = time.perf_counter()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before, reserved_before = read(), int(torch.cuda.memory_reserved(device))
    high, refused = before, 0
    for batch in decoder_probe_batches(max_image_pixels):
        try:
            images = decode([_u8_tensor(b) for b in batch])
        except RuntimeError as exc:
            if is_torch_oom(exc):
                raise
            refused += len(batch)
            logger.warning(
                "nvJPEG refused a probe batch of %d images (%s); at run time such images "
                "go to Pillow",
                len(batch),
                str(exc)[:200],
            )
            continue
        del images
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        high = max(high, read())
    reserved_delta = int(torch.cuda.memory_reserved(device)) - reserved_before
    memory = DecoderMemory(
        raw_bytes=max(0, high - before - reserved_delta),
        before_bytes=before,
        high_bytes=high,
        reserved_delta_bytes=reserved_delta,
        refused_images=refused,
        probe_s=time.perf_counter() - t0,
    )
    logger.info(
        "nvJPEG keeps %d bytes outside the torch allocator after its worst-case decodes "
        "(max_image_pixels %d; probe %.2f s)",
        memory.raw_bytes,
        max_image_pixels,
        memory.probe_s,
    )
    return memory
