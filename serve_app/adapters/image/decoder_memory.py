"""What GPU image decoding costs a replica's memory, measured at start-up: is nvJPEG there
(``use_gpu_decode``), and how much it keeps outside the torch cap (``measure_decoder_bytes``),
which the image backend declares through its start-up hook (``hold_decoder_memory``)."""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass

import torch

from serve_app.adapters.image.files import synthetic_jpeg, worst_case_size
from serve_app.adapters.image.gpudecode import (
    DECODE_CHUNK_IMAGES,
    DECODE_CHUNK_PIXELS,
    DecodeBatch,
    nvjpeg_decoder,
    u8_tensor,
)
from serve_app.config.args import AppArgs
from serve_app.errors import StartupError
from serve_app.gpu.capping import HeldOutsideTorch, OutsideTorchHook
from serve_app.gpu.snapshot import DeviceMemory, is_torch_oom, memory_profiling

logger = logging.getLogger("serve_app")

# Room kept for nvJPEG's buffers beyond what the start-up probe measured (see reserve_bytes).
DECODER_MARGIN_FRACTION = 0.25
DECODER_MARGIN_BYTES = 64 * 1024**2


@functools.lru_cache(maxsize=8)
def nvjpeg_problem(device: torch.device) -> str | None:
    """Why JPEGs cannot be decoded on ``device`` (a CUDA device), or None when they can: a
    tiny decode through torchvision, which also creates its nvJPEG decoder there."""
    try:
        decode = nvjpeg_decoder(device)
    except Exception as exc:  # noqa: BLE001 - missing and broken installs alike
        return f"torchvision is not importable ({type(exc).__name__}: {str(exc)[:200]})"
    try:
        decode([u8_tensor(synthetic_jpeg(16, 16))])
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
    if args.image_decode == "cpu":
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


def hold_decoder_memory(args: AppArgs) -> OutsideTorchHook:
    """The image backend's start-up hook (serve_app.gpu.capping calls it before the cap): on a
    replica that decodes on the GPU (``use_gpu_decode``), grow nvJPEG's buffers to their worst
    case and say what they hold outside torch; None on one that does not.

    Raises (from the hook):
        StartupError: ``image_decode: gpu`` without nvJPEG, or NVML unreadable.
    """

    def hook(memory: DeviceMemory) -> HeldOutsideTorch | None:
        if not use_gpu_decode(args, memory.device):
            return None
        measured = measure_decoder_bytes(memory, args.max_image_pixels)
        return HeldOutsideTorch(
            measured_bytes=measured.raw_bytes, reserve_bytes=measured.reserve_bytes
        )

    return hook


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
        buffers 18% past what the probe had measured
        (benchmarks/results/gpu_tests/decode/image_decode_gpu.json)."""
        return self.raw_bytes + max(
            DECODER_MARGIN_BYTES, int(self.raw_bytes * DECODER_MARGIN_FRACTION)
        )


def measure_decoder_bytes(
    memory: DeviceMemory, max_image_pixels: int, decode: DecodeBatch | None = None
) -> DecoderMemory:
    """Run the decoder's worst-case calls (``decoder_probe_batches``) on ``memory``'s device and
    measure what nvJPEG keeps outside the torch allocator (``memory_profiling``: this process's
    NVML bytes, or the device's used bytes where NVML does not list the process). ``decode``
    stands in for nvJPEG in tests.

    Call it once per process, after the CUDA context exists and before the torch cap is set (the
    decoded images, torch tensors, need room for the moment); afterwards nvJPEG's buffers only
    grow past this if a call decodes more than a chunk allows, which ``GpuJpegDecoder`` never
    does. It empties torch's cache.

    Raises:
        StartupError: NVML could not be read.
    """
    decode = decode or nvjpeg_decoder(memory.device)

    def read() -> int:
        value = memory.used_bytes()
        if value is None:
            raise StartupError(
                "cannot read this process's GPU memory through NVML to measure nvJPEG's "
                "buffers; set args.image_decode: cpu"
            )
        return int(value)

    t0 = time.perf_counter()
    refused = 0
    with memory_profiling(memory, read) as profile:
        for batch in decoder_probe_batches(max_image_pixels):
            try:
                images = decode([u8_tensor(b) for b in batch])
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
            profile.sample()
    decoder = DecoderMemory(
        raw_bytes=profile.outside_torch_growth_bytes,
        before_bytes=profile.before_bytes,
        high_bytes=profile.high_bytes,
        reserved_delta_bytes=profile.reserved_after_bytes - profile.reserved_before_bytes,
        refused_images=refused,
        probe_s=time.perf_counter() - t0,
    )
    logger.info(
        "nvJPEG keeps %d bytes outside the torch allocator after its worst-case decodes "
        "(max_image_pixels %d; probe %.2f s)",
        decoder.raw_bytes,
        max_image_pixels,
        decoder.probe_s,
    )
    return decoder
