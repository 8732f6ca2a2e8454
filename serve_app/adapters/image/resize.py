"""The CPU path's crop and resize, bit for bit, as torch operations on any device.

The CPU path (image.py) crops with ``crop_box`` and resizes with Pillow's
``Image.resize((size, size), BILINEAR, box=box)``. Pillow's reducing bilinear is a triangle
filter widened by the scale (so it is antialiased), evaluated over the crop box in source
coordinates, with 22-bit fixed-point weights and a rounding to uint8 between its horizontal
and vertical passes (libImaging/Resample.c). ``axis_weights`` computes those integer weights and
``resize_crops`` runs the two passes as float64 matrix products, in Pillow's order: exact,
because every product and every sum is an integer below 2**53. The GPU path (imagedecode.py)
resizes nvJPEG's output with it, so the crops differ from the CPU path's only where the two JPEG
decoders differ.

torch's ``interpolate(mode="bilinear", antialias=True)`` uses the same filter, but it takes no
crop box: on a whole-pixel crop its grid would sit up to half a source pixel off Pillow's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

# float64 elements per resize block (32 MiB): a large image's first pass runs in row or column
# blocks, and small images a few at a time, so the working set stays bounded.
RESAMPLE_BLOCK_ELEMENTS = 1 << 22
_PRECISION_BITS = 22  # Pillow's fixed point for 8-bit resampling: 32 - 8 - 2


def crop_box(width: int, height: int, size: int) -> tuple[float, float, float, float]:
    """torchvision's ImageNet geometry as a box in source coordinates: the centred square that
    resizing the short side to ``size * 256 / 224`` and cropping ``size`` x ``size`` keeps."""
    scale = size * 256 / 224 / min(width, height)
    side = size / scale
    left, top = (width - side) / 2, (height - side) / 2
    return (left, top, left + side, top + side)


def axis_weights(in_size: int, in0: float, in1: float, out_size: int) -> tuple[int, np.ndarray]:
    """Pillow's bilinear weights for one axis: ``(first, weights)`` where output ``i`` is
    ``(sum_j src[first + j] * weights[i, j] + 2**21) >> 22``, clipped to 0..255.

    A transcription of ``precompute_coeffs`` and ``normalize_coeffs_8bpc`` in Pillow's
    Resample.c, in the same float operations and order (the box arrives there as C floats).
    """
    f0, f1 = np.float32(in0), np.float32(in1)
    scale = float(f1 - f0) / out_size
    filterscale = max(scale, 1.0)
    support = filterscale  # the bilinear filter's support is 1
    ksize = int(math.ceil(support)) * 2 + 1
    center = float(f0) + (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)
    count = np.minimum((center + support + 0.5).astype(np.int64), in_size) - xmin
    taps = np.arange(ksize, dtype=np.int64)
    x = np.abs(((taps[None, :] + xmin[:, None]) - center[:, None] + 0.5) * (1.0 / filterscale))
    k = np.where((x < 1.0) & (taps[None, :] < count[:, None]), 1.0 - x, 0.0)
    total = np.zeros(out_size, dtype=np.float64)
    for j in range(ksize):  # sequential, as in C: a pairwise sum could round differently
        total = total + k[:, j]
    k = np.where(total[:, None] != 0.0, k / np.where(total == 0.0, 1.0, total)[:, None], k)
    fixed = (0.5 + k * float(1 << _PRECISION_BITS)).astype(np.int64)
    first = int(xmin[0])
    used = int((xmin + count).max()) - first
    weights = np.zeros((out_size, used), dtype=np.int64)
    for j in range(ksize):
        live = taps[j] < count
        weights[np.nonzero(live)[0], (xmin - first + j)[live]] = fixed[live, j]
    return first, weights


@dataclass(frozen=True)
class _ResizePlan:
    x0: int
    x1: int
    y0: int
    y1: int
    wx_t: torch.Tensor  # (x1 - x0, size) float64
    wy: torch.Tensor  # (size, y1 - y0) float64
    horizontal_first: bool


@functools.lru_cache(maxsize=512)
def _resize_plan(width: int, height: int, size: int, device: torch.device) -> _ResizePlan:
    left, top, right, bottom = crop_box(width, height, size)
    x0, wx = axis_weights(width, left, right, size)
    y0, wy = axis_weights(height, top, bottom, size)
    return _ResizePlan(
        x0=x0,
        x1=x0 + wx.shape[1],
        y0=y0,
        y1=y0 + wy.shape[1],
        wx_t=torch.from_numpy(wx.T.astype(np.float64)).to(device),
        wy=torch.from_numpy(wy.astype(np.float64)).to(device),
        # Pillow 13 runs the vertical pass first when the height shrinks by more than twice
        # as many pixels as the width (ImagingResampleInner); the rounding between the passes
        # makes the order visible in the result.
        horizontal_first=not (height - size > 0 and height - size > (width - size) * 2),
    )


def _fixed_point_to_u8(acc: torch.Tensor) -> torch.Tensor:
    """Pillow's ``clip8((acc + 2**21) >> 22)`` on float64 sums of integers (exact)."""
    return acc.add_(1 << (_PRECISION_BITS - 1)).div_(1 << _PRECISION_BITS).floor_().clamp_(0, 255)


def resize_crops(images: torch.Tensor, size: int) -> torch.Tensor:
    """Same-size RGB images ``(G, 3, H, W)`` uint8 -> their ``(G, size, size, 3)`` uint8 crops,
    equal to the CPU path's Pillow crops of the same pixels, on the images' device.

    Work is split so that no float64 block holds much more than ``RESAMPLE_BLOCK_ELEMENTS``
    elements: a few images at a time, and a large image in row (or column) blocks.
    """
    g, _, height, width = images.shape
    plan = _resize_plan(width, height, size, images.device)
    src = images[:, :, plan.y0 : plan.y1, plan.x0 : plan.x1]
    rows, cols = plan.y1 - plan.y0, plan.x1 - plan.x0
    step = max(1, RESAMPLE_BLOCK_ELEMENTS // (3 * max(rows, size) * max(cols, size)))
    out = torch.empty((g, size, size, 3), dtype=torch.uint8, device=images.device)
    for s in range(0, g, step):
        part = src[s : s + step]
        n = part.shape[0]
        if plan.horizontal_first:
            block = max(1, RESAMPLE_BLOCK_ELEMENTS // (n * 3 * cols))
            first = [
                _fixed_point_to_u8(part[:, :, r : r + block].to(torch.float64) @ plan.wx_t)
                for r in range(0, rows, block)
            ]
            done = _fixed_point_to_u8(plan.wy @ torch.cat(first, dim=2))
        else:
            block = max(1, RESAMPLE_BLOCK_ELEMENTS // (n * 3 * rows))
            first = [
                _fixed_point_to_u8(plan.wy @ part[:, :, :, c : c + block].to(torch.float64))
                for c in range(0, cols, block)
            ]
            done = _fixed_point_to_u8(torch.cat(first, dim=3) @ plan.wx_t)
        out[s : s + step] = done.permute(0, 2, 3, 1).to(torch.uint8)
    return out
