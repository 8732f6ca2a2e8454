"""Reading a request's images: the header checks both decode paths share, with the errors the
client sees, the request's pixel budget, the CPU path's Pillow decode (JPEGs drafted to the
size the crop needs) and crop, and which JPEGs nvJPEG may take.

Every request's headers are read first (``read_headers``; Pillow's ``Image.open`` is lazy), and
their pixels summed against ``max_request_pixels``, before any decode. The CPU path
(``crop_opened``) then decodes and crops on the request path. The GPU path also reads the JPEG
markers up to the first scan, a few tens of microseconds, and queues an ``EncodedImage`` for the
batch (gpudecode.py) for a JPEG nvJPEG takes. Both refuse the same images with the same
messages: a format other than JPEG or PNG (400), more than ``max_image_pixels`` (413), data
Pillow cannot read (400; for a JPEG nvJPEG refuses, from its request's Pillow decode after the
batch).
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from serve_app.adapters.image.resize import crop_box
from serve_app.errors import BadRequest, PayloadTooLarge, ServeAppError

JPEG_MAX_SIDE = 65500  # the largest side Pillow writes a JPEG with
_SOF_GPU = (0xC0, 0xC1, 0xC2)  # baseline, extended and progressive Huffman: what nvJPEG decodes
_RGB_IDS = (0x52, 0x47, 0x42)  # component ids 'R', 'G', 'B': no YCbCr transform


def open_header(blob: bytes, where: str, max_image_pixels: int) -> Any:
    """Open one image lazily (Pillow reads the header only), refusing other formats and more
    than ``max_image_pixels`` pixels."""
    from PIL import Image

    # Pillow refuses images over twice this limit while reading the header (and only warns
    # between 1x and 2x); the explicit check below gives every oversized image the same 413.
    Image.MAX_IMAGE_PIXELS = max_image_pixels
    opened = Image.open(io.BytesIO(blob))
    if opened.format not in ("JPEG", "PNG"):
        raise BadRequest(
            f"'{where}' is {opened.format}; only JPEG and PNG are accepted", param=where
        )
    w, h = opened.size
    if w * h > max_image_pixels:
        raise PayloadTooLarge(
            f"'{where}' is {w}x{h} = {w * h} pixels; at most "
            f"{max_image_pixels} (args.max_image_pixels)",
            param=where,
        )
    return opened


@contextlib.contextmanager
def image_errors(where: str, max_image_pixels: int) -> Iterator[None]:
    """Pillow's errors as the client sees them: a 413 for a decompression bomb, a 400 for
    anything else it raises on corrupt data; our own errors pass through."""
    from PIL import Image

    try:
        yield
    except ServeAppError:
        raise
    except Image.DecompressionBombError:
        raise PayloadTooLarge(
            f"'{where}' exceeds args.max_image_pixels ({max_image_pixels})", param=where
        ) from None
    except Exception:  # noqa: BLE001 - Pillow raises many types for corrupt data
        raise BadRequest(f"'{where}' is not a readable JPEG or PNG image", param=where) from None


def draft_for_crop(img: Any, size: int) -> None:
    """Let a JPEG decode at 1/2, 1/4 or 1/8 of its size (libjpeg's DCT scaling, through
    Pillow's ``draft``) while its short side stays at least the ``size * 256 / 224`` the crop
    resizes it to: a 6000 x 4000 photo then decodes as 750 x 500 at 224. Other formats, and
    JPEGs already near that size, are left as they are."""
    if img.format != "JPEG":
        return
    target = math.ceil(size * 256 / 224)
    w, h = img.size
    scale = next((s for s in (8, 4, 2) if min(w, h) // s >= target), 1)
    if scale > 1:
        img.draft("RGB", (w // scale, h // scale))


def crop_opened(img: Any, where: str, size: int, max_image_pixels: int) -> np.ndarray:
    """Decode an image ``open_header`` opened (drafted or not), then torchvision's ImageNet
    resize and crop (resize the short side to ``size * 256 / 224``, centre-crop ``size`` x
    ``size``); HWC uint8 RGB."""
    from PIL import Image

    with image_errors(where, max_image_pixels):
        img = img.convert("RGB")
    # Crop in source coordinates, then resize only the crop: resizing the whole image first
    # would let a 1 x 40,000,000 strip grow to billions of pixels.
    box = crop_box(img.width, img.height, size)
    img = img.resize((size, size), Image.Resampling.BILINEAR, box=box)
    return np.asarray(img, dtype=np.uint8)


def pillow_crop(blob: bytes, index: int, size: int, max_image_pixels: int) -> np.ndarray:
    """The CPU path for one image: its header checked, a JPEG drafted (``draft_for_crop``),
    then ``crop_opened``."""
    where = f"input[{index}]"
    with image_errors(where, max_image_pixels):
        img = open_header(blob, where, max_image_pixels)
        draft_for_crop(img, size)
    return crop_opened(img, where, size, max_image_pixels)


@dataclass(frozen=True)
class ImageHeader:
    """One image of a request after the header pass (``read_headers``).

    Attributes:
        index: its position in its request.
        image: Pillow's lazily opened image (drafted when Pillow will decode it).
        gpu: whether nvJPEG decodes it (the GPU path only).
        pixels: the pixels decoding it costs: the header's size for nvJPEG, the drafted size
            for Pillow.
    """

    index: int
    image: Any
    gpu: bool
    pixels: int


def read_headers(
    blobs: list[bytes], size: int, max_image_pixels: int, max_request_pixels: int, gpu_path: bool
) -> list[ImageHeader]:
    """Every image's header, checked (``open_header``) and drafted where Pillow decodes it,
    before any pixel is decoded; PayloadTooLarge when their pixels sum past
    ``max_request_pixels``, so that a request of many small-bodied, huge images costs
    microseconds, not seconds of decoding."""
    headers = []
    for i, blob in enumerate(blobs):
        where = f"input[{i}]"
        with image_errors(where, max_image_pixels):
            img = open_header(blob, where, max_image_pixels)
            gpu = gpu_path and img.format == "JPEG"
            gpu = gpu and gpu_decodable(jpeg_frame(blob), img.size, img.info)
            if not gpu:
                draft_for_crop(img, size)
        headers.append(ImageHeader(i, img, gpu, img.width * img.height))
    total = sum(h.pixels for h in headers)
    if total > max_request_pixels:
        raise PayloadTooLarge(
            f"the request's {len(blobs)} images are {total} pixels to decode; at most "
            f"{max_request_pixels} per request (args.max_request_pixels): send fewer or "
            "smaller images per request",
            param="input",
            code="request_pixels_exceeded",
        )
    return headers


@dataclass(frozen=True)
class EncodedImage:
    """One image of a request, header checked but not decoded (the GPU path's batch item).

    Attributes:
        data: the encoded bytes.
        index: its position in its request (error messages name ``input[index]``).
        width, height: its size as the header gives it.
        gpu: whether nvJPEG decodes it (an 8-bit Huffman JPEG, greyscale or YCbCr, with one
            frame and an end marker); PNG, CMYK and every other kind go through Pillow.
    """

    data: bytes
    index: int
    width: int
    height: int
    gpu: bool

    @property
    def pixels(self) -> int:
        return self.width * self.height


@dataclass(frozen=True)
class JpegFrame:
    """What a JPEG's markers up to its first scan say (``jpeg_frame``): the first frame
    header's marker, sample precision, size and components as ``(id, h, v, table)`` (sampling
    factors and quantisation table), how many frame headers there were, and whether an end
    marker follows the scan."""

    marker: int
    precision: int
    width: int
    height: int
    components: tuple[tuple[int, int, int, int], ...]
    frames: int
    has_end: bool

    @property
    def component_ids(self) -> tuple[int, ...]:
        return tuple(c[0] for c in self.components)


def jpeg_frame(data: bytes) -> JpegFrame | None:
    """The frame header of a JPEG, scanning its markers from SOI to the first SOS; None when the
    marker structure is broken before the scan. ``has_end``: an EOI marker follows the scan
    (Pillow refuses a JPEG that ends without one as truncated)."""
    if data[:2] != b"\xff\xd8":
        return None
    pos, frames, first = 2, 0, None
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            pos += 2
            continue
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker == 0xD9 or length < 2 or pos + 2 + length > len(data):
            return None
        if marker == 0xDA:
            if first is None:
                return None
            has_end = data.rfind(b"\xff\xd9", pos + 2 + length) != -1
            return JpegFrame(*first, frames=frames, has_end=has_end)
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            seg = data[pos + 4 : pos + 2 + length]
            count = seg[5] if len(seg) >= 6 else 0
            if count == 0 or len(seg) < 6 + 3 * count:
                return None
            frames += 1
            if first is None:
                parts = [seg[6 + 3 * i : 9 + 3 * i] for i in range(count)]
                comps = tuple((c[0], c[1] >> 4, c[1] & 15, c[2]) for c in parts)
                size = int.from_bytes(seg[3:5], "big"), int.from_bytes(seg[1:3], "big")
                first = (marker, seg[0], size[0], size[1], comps)
        pos += 2 + length
    return None


def gpu_decodable(frame: JpegFrame | None, size: tuple[int, int], info: dict[str, Any]) -> bool:
    """Whether nvJPEG should decode this JPEG: one 8-bit Huffman frame of the size Pillow read,
    with an end marker, greyscale or YCbCr (as libjpeg decides: JFIF, an Adobe transform 1, or
    component ids other than R, G, B) in a common subsampling (luma 1, 2 or 4 by 1 or 2, chroma
    1 by 1). Anything else, malformed headers included, goes to Pillow, which decides."""
    if frame is None or frame.frames != 1 or frame.marker not in _SOF_GPU:
        return False
    if frame.precision != 8 or (frame.width, frame.height) != size or not frame.has_end:
        return False
    if any(table > 3 for *_, table in frame.components):
        return False
    sampling = [(h, v) for _, h, v, _ in frame.components]
    if len(sampling) == 1:
        return sampling[0] == (1, 1)
    if len(sampling) != 3 or sampling[1:] != [(1, 1), (1, 1)]:
        return False
    if sampling[0][0] not in (1, 2, 4) or sampling[0][1] not in (1, 2):
        return False
    if "jfif" in info:
        return True
    if "adobe" in info:
        return info.get("adobe_transform") == 1
    return frame.component_ids != _RGB_IDS


def encoded_image(blob: bytes, index: int, max_image_pixels: int) -> EncodedImage:
    """The GPU path's request-time check: the header only, with the CPU path's errors."""
    where = f"input[{index}]"
    with image_errors(where, max_image_pixels):
        img = open_header(blob, where, max_image_pixels)
        gpu = img.format == "JPEG" and gpu_decodable(jpeg_frame(blob), img.size, img.info)
    return EncodedImage(blob, index, img.width, img.height, gpu)


def worst_case_size(max_image_pixels: int) -> tuple[int, int]:
    """The largest JPEG a request may carry: the square of at most ``max_image_pixels``
    pixels, or the widest strip when a square's side would pass JPEG's limit."""
    side = max(1, math.isqrt(max_image_pixels))
    if side <= JPEG_MAX_SIDE:
        return side, side
    return JPEG_MAX_SIDE, min(JPEG_MAX_SIDE, max_image_pixels // JPEG_MAX_SIDE)


@functools.lru_cache(maxsize=8)
def synthetic_jpeg(width: int, height: int, progressive: bool = False) -> bytes:
    """A JPEG of smooth colour gradients, 4:4:4 at quality 90 (the most coefficients a pixel
    carries), for calibration, warm-up and the decoder's memory probe."""
    from PIL import Image

    x = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    rgb = np.empty((height, width, 3), dtype=np.uint8)
    rgb[..., 0] = x
    rgb[..., 1] = y
    rgb[..., 2] = (x + y) / 2
    buf = io.BytesIO()
    Image.fromarray(rgb).save(
        buf, format="JPEG", quality=90, subsampling=0, progressive=progressive
    )
    return buf.getvalue()
