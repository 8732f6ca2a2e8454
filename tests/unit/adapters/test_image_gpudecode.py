"""The GPU decode path's logic, on the CPU: crop geometry, Pillow-exact resize, JPEG header
checks, chunking and grouping, the batch's fallbacks and item errors, and the start-up choice.

No Ray, no GPU, no torchvision: where the GPU path needs nvJPEG, a stand-in decodes with Pillow
(``pillow_decode``), so the path's crops must equal the CPU path's exactly. The GPU test
(tests/gpu/test_image_decode_gpu.py) runs the same path with nvJPEG.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from serve_app import adapters
from serve_app.adapters.contract import Model, Redo
from serve_app.adapters.image import backend as image_mod
from serve_app.adapters.image import build
from serve_app.adapters.image import decoder_memory as imagedecode
from serve_app.adapters.image import resize as imageresize
from serve_app.adapters.image.decoder_memory import (
    decoder_probe_batches,
    hold_decoder_memory,
    use_gpu_decode,
)
from serve_app.adapters.image.files import (
    EncodedImage,
    encoded_image,
    gpu_decodable,
    jpeg_frame,
    pillow_crop,
    synthetic_jpeg,
    worst_case_size,
)
from serve_app.adapters.image.gpudecode import GpuJpegDecoder, group_by_shape, plan_chunks
from serve_app.adapters.image.resize import axis_weights, crop_box, resize_crops
from serve_app.config.args import parse_args
from serve_app.errors import (
    BadRequest,
    ConfigError,
    ItemError,
    PayloadTooLarge,
    ServeAppError,
    StartupError,
)

CPU = torch.device("cpu")
MAX_PIXELS = 40_000_000


@pytest.fixture(autouse=True)
def _builtin_resnet_and_pillow_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_mod, "_torchvision", lambda: None)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)


def photo(size: tuple[int, int], seed: int = 0, mode: str = "RGB") -> Image.Image:
    """Smooth gradients with soft detail: what a downscaled photo looks like to a decoder."""
    w, h = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rgb = np.stack(
        [
            127 + 100 * np.sin(x / (7 + seed) + y / 13),
            127 + 100 * np.cos(y / (5 + seed)),
            255 * x / max(1, w - 1),
        ],
        axis=-1,
    ) + rng.normal(0, 4, (h, w, 3))
    img = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))
    return img.convert(mode) if mode != "RGB" else img


def encode(img: Image.Image, fmt: str = "JPEG", **save: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **save)
    return buf.getvalue()


def pillow_decode(data: list[torch.Tensor]) -> list[torch.Tensor]:
    """A stand-in for nvJPEG: one Pillow decode per image, raising like torchvision does."""
    out = []
    for t in data:
        try:
            img = Image.open(io.BytesIO(t.numpy().tobytes())).convert("RGB")
        except Exception as exc:  # noqa: BLE001 - torchvision wraps every failure like this
            raise RuntimeError(f"Error while decoding JPEG images: {exc}") from None
        out.append(torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous())
    return out


class CountingDecoder:
    """``pillow_decode`` that records each call's batch size and can refuse chosen bytes."""

    def __init__(self, refuse: Callable[[bytes], bool] = lambda b: False):
        self.calls: list[int] = []
        self.refuse = refuse

    def __call__(self, data: list[torch.Tensor]) -> list[torch.Tensor]:
        self.calls.append(len(data))
        if any(self.refuse(t.numpy().tobytes()) for t in data):
            raise RuntimeError("Error while decoding JPEG images: Failed to decode batch: 7")
        return pillow_decode(data)


def cpu_adapter(**args: Any) -> Model:
    """A small image model set up on the CPU (seeded weights)."""
    base: dict[str, Any] = {
        "adapter": "image-classification",
        "arch": "resnet18",
        "load_format": "dummy",
        "image_size": 32,
    }
    base.update(args)
    adapter = build(parse_args(base))
    torch.manual_seed(0)
    adapter.backend.setup(CPU)
    return adapter


def gpu_adapter(
    decoder: CountingDecoder | None = None, chunk_pixels: int = 1 << 24, **args: Any
) -> Model:
    """``cpu_adapter`` with the GPU decode path switched on by hand."""
    adapter = cpu_adapter(**args)
    size = adapter.backend.args.image_size  # type: ignore[attr-defined]
    adapter.backend._gpu = GpuJpegDecoder(  # type: ignore[attr-defined]
        CPU, size, chunk_pixels, 256, decode_batch=decoder or CountingDecoder()
    )
    return adapter


def json_body(blobs: list[bytes]) -> bytes:
    return json.dumps({"input": [base64.b64encode(b).decode() for b in blobs]}).encode()


# ---- crop geometry and the Pillow-exact resize ----------------------------------------------


def test_crop_box_is_the_centred_square_of_the_256_over_224_resize() -> None:
    # 500 x 375 at 224: the short side 375 maps to 256, so the crop keeps 375 * 224 / 256
    # = 328.125 source pixels, centred.
    assert crop_box(500, 375, 224) == (85.9375, 23.4375, 414.0625, 351.5625)
    assert crop_box(375, 500, 224) == (23.4375, 85.9375, 351.5625, 414.0625)
    # 256 x 256 at 224: a whole-pixel crop of 224 at offset 16
    assert crop_box(256, 256, 224) == (16.0, 16.0, 240.0, 240.0)


def test_axis_weights_sum_to_one_in_fixed_point_and_copy_at_scale_one() -> None:
    first, w = axis_weights(500, 85.9375, 414.0625, 224)
    assert first == 85 and w.shape[0] == 224
    sums = w.sum(axis=1)
    # each weight rounds on its own: a row sums to 2**22 within one unit per tap
    assert np.all(np.abs(sums - (1 << 22)) <= w.shape[1])
    # a whole-pixel box at scale 1 is a copy: weight 2**22 on one source pixel
    first, w = axis_weights(256, 16.0, 240.0, 224)
    assert first == 16
    np.testing.assert_array_equal(w[:, : w.shape[0]], np.eye(224, dtype=np.int64) << 22)


SIZES = [
    (500, 375),  # landscape: horizontal pass first
    (375, 500),  # portrait, height shrinks by less than twice the width: horizontal first
    (120, 900),  # tall strip: Pillow 13 runs the vertical pass first
    (224, 224),
    (256, 256),  # whole-pixel crop at scale 1
    (33, 17),  # smaller than the crop: an upscale
    (4, 2000),
    (1999, 3),
    (641, 479),
]


@pytest.mark.parametrize("size", [32, 224])
@pytest.mark.parametrize("wh", SIZES)
def test_resize_crops_equal_pillow_bit_for_bit(wh: tuple[int, int], size: int) -> None:
    w, h = wh
    rng = np.random.default_rng(w * 7919 + h)
    arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)  # noise: every weight shows
    expected = np.asarray(
        Image.fromarray(arr).resize(
            (size, size), Image.Resampling.BILINEAR, box=crop_box(w, h, size)
        )
    )
    chw = torch.from_numpy(arr).permute(2, 0, 1)
    got = resize_crops(torch.stack([chw, chw]), size)
    assert got.shape == (2, size, size, 3) and got.dtype == torch.uint8
    np.testing.assert_array_equal(got[0].numpy(), expected)
    np.testing.assert_array_equal(got[1].numpy(), expected)


@pytest.mark.parametrize("wh", [(700, 500), (300, 1400)])
def test_resize_crops_in_small_blocks_give_the_same_pixels(
    wh: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    w, h = wh
    arr = np.random.default_rng(3).integers(0, 256, (3, h, w), dtype=np.uint8)
    images = torch.from_numpy(arr).unsqueeze(0).expand(3, -1, -1, -1)
    whole = resize_crops(images, 64)
    monkeypatch.setattr(imageresize, "RESAMPLE_BLOCK_ELEMENTS", 5_000)  # rows/columns in tens
    assert torch.equal(resize_crops(images, 64), whole)


def test_greyscale_crop_is_the_rgb_crop_of_repeated_channels() -> None:
    grey = photo((300, 200), mode="L")
    blob = encode(grey, "PNG")
    expected = pillow_crop(blob, 0, 48, MAX_PIXELS)
    chw = torch.from_numpy(np.array(grey)).unsqueeze(0).expand(3, -1, -1)
    np.testing.assert_array_equal(resize_crops(chw.unsqueeze(0), 48)[0].numpy(), expected)


# ---- chunks and groups ----------------------------------------------------------------------


def test_plan_chunks_bounds_pixels_and_images() -> None:
    assert plan_chunks([4, 4, 4, 9, 1], 8, 8) == [[0, 1], [2], [3], [4]]
    assert plan_chunks([1] * 5, 100, 2) == [[0, 1], [2, 3], [4]]
    assert plan_chunks([], 8, 8) == []
    assert plan_chunks([20], 8, 8) == [[0]]


def test_group_by_shape_keeps_first_seen_order() -> None:
    shapes = [(3, 2, 2), (3, 4, 4), (3, 2, 2), (3, 1, 1), (3, 4, 4)]
    assert list(group_by_shape(shapes).items()) == [
        ((3, 2, 2), [0, 2]),
        ((3, 4, 4), [1, 4]),
        ((3, 1, 1), [3]),
    ]


def test_decoder_probe_batches_fill_one_chunk_each() -> None:
    batches = decoder_probe_batches(1_000_000, chunk_pixels=4_000_000, chunk_images=8)
    assert [len(b) for b in batches] == [4, 1, 8]
    sizes = [[Image.open(io.BytesIO(b)).size for b in batch] for batch in batches]
    assert sizes[0] == [(1000, 1000)] * 4
    assert Image.open(io.BytesIO(batches[1][0])).info.get("progressive") == 1
    assert sizes[2] == [(707, 707)] * 8  # isqrt(4,000,000 / 8)
    for batch in sizes:
        assert len(plan_chunks([w * h for w, h in batch], 4_000_000, 8)) == 1


def test_worst_case_size() -> None:
    assert worst_case_size(40_000_000) == (6324, 6324)
    assert worst_case_size(10_000) == (100, 100)
    assert worst_case_size(10_000_000_000) == (65500, 65500)
    assert worst_case_size(5_000_000_000) == (65500, 65500)
    assert worst_case_size(100_000 * 65500) == (65500, 65500)
    assert worst_case_size(65500 * 70_000 - 1) == (65500, 65500)


# ---- JPEG headers ---------------------------------------------------------------------------


def test_jpeg_frame_reads_size_components_and_end() -> None:
    rgb = encode(photo((64, 48)), quality=90)
    frame = jpeg_frame(rgb)
    assert frame is not None
    assert (frame.marker, frame.precision, frame.width, frame.height) == (0xC0, 8, 64, 48)
    assert frame.component_ids == (1, 2, 3) and frame.frames == 1 and frame.has_end
    assert frame.components == ((1, 2, 2, 0), (2, 1, 1, 1), (3, 1, 1, 1))  # 4:2:0
    progressive = jpeg_frame(encode(photo((64, 48)), progressive=True))
    assert progressive is not None and progressive.marker == 0xC2
    truncated = jpeg_frame(rgb[: len(rgb) // 2])
    assert truncated is not None and not truncated.has_end
    assert jpeg_frame(b"\x89PNG\r\n\x1a\n") is None
    assert jpeg_frame(rgb[:20]) is None  # cut inside the header
    assert jpeg_frame(b"\xff\xd8\xff\xd9") is None  # an end before any scan


def test_jpeg_frame_counts_a_second_frame_header() -> None:
    rgb = encode(photo((64, 48)))
    sof = rgb.index(b"\xff\xc0")
    length = int.from_bytes(rgb[sof + 2 : sof + 4], "big")
    doubled = rgb[: sof + 2 + length] + rgb[sof : sof + 2 + length] + rgb[sof + 2 + length :]
    frame = jpeg_frame(doubled)
    assert frame is not None and frame.frames == 2


def _gpu_flag(blob: bytes) -> bool:
    return encoded_image(blob, 0, MAX_PIXELS).gpu


def test_which_images_go_to_nvjpeg() -> None:
    assert _gpu_flag(encode(photo((64, 48))))  # YCbCr 4:2:0 JFIF
    assert _gpu_flag(encode(photo((64, 48)), subsampling=0, quality=95))
    assert _gpu_flag(encode(photo((64, 48)), progressive=True))
    assert _gpu_flag(encode(photo((64, 48), mode="L")))  # greyscale: nvJPEG repeats Y
    assert not _gpu_flag(encode(photo((64, 48), mode="CMYK")))  # Adobe CMYK: Pillow
    assert not _gpu_flag(encode(photo((64, 48)), keep_rgb=True))  # RGB without YCbCr: Pillow
    assert not _gpu_flag(encode(photo((64, 48)), "PNG"))
    assert _gpu_flag(encode(photo((64, 48)), subsampling="4:2:2"))
    assert _gpu_flag(encode(photo((64, 48)), subsampling="4:1:1"))
    whole = encode(photo((64, 48)))
    assert not _gpu_flag(whole[: len(whole) - 200])  # no end marker: Pillow decides (a 400)
    assert not _gpu_flag(sampling_zero(whole))  # a malformed frame never reaches nvJPEG


def sampling_zero(jpeg: bytes) -> bytes:
    """``jpeg`` with its first component's sampling factors set to 0 x 0: Pillow opens it,
    libjpeg refuses to decode it."""
    bad = bytearray(jpeg)
    bad[bad.index(b"\xff\xc0") + 11] = 0x00  # SOF: marker, length, precision, size, count, id
    return bytes(bad)


def test_gpu_decodable_refuses_frames_pillow_reads_differently() -> None:
    blob = encode(photo((64, 48)))
    img = Image.open(io.BytesIO(blob))
    frame = jpeg_frame(blob)
    assert gpu_decodable(frame, img.size, img.info)
    assert not gpu_decodable(frame, (64, 47), img.info)
    assert not gpu_decodable(None, img.size, img.info)


# ---- request-time checks keep the CPU path's errors -----------------------------------------


def _error(fn: Callable[[], Any]) -> ServeAppError:
    with pytest.raises(ServeAppError) as info:
        fn()
    return info.value


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize(
    "blob",
    [
        b"this is not an image at all",
        b"",
        b"\x00" * 100,
        encode(Image.new("P", (20, 20), 3), "GIF"),
        encode(Image.new("RGB", (20, 20)), "BMP"),
        encode(photo((150, 100))),  # 15,000 pixels: over the limit below
        encode(photo((300, 100)), "PNG"),  # over twice the limit: Pillow's own refusal
    ],
)
def test_header_check_raises_what_the_cpu_path_raises(blob: bytes) -> None:
    limit = 10_000
    gpu_err = _error(lambda: encoded_image(blob, 3, limit))
    cpu_err = _error(lambda: pillow_crop(blob, 3, 32, limit))
    assert type(gpu_err) is type(cpu_err)
    assert gpu_err.to_json() == cpu_err.to_json()
    assert gpu_err.param == "input[3]"


def test_corrupt_jpeg_data_passes_the_header_check_and_fails_in_the_batch() -> None:
    whole = encode(photo((200, 150)))
    truncated = whole[: len(whole) // 2]
    item = encoded_image(truncated, 1, MAX_PIXELS)
    assert not item.gpu and (item.width, item.height) == (200, 150)
    err = _error(lambda: pillow_crop(truncated, 1, 32, MAX_PIXELS))
    assert isinstance(err, BadRequest) and err.param == "input[1]"


# ---- the GPU path through the adapter, with Pillow standing in for nvJPEG ---------------------


def test_gpu_path_decode_leaves_jpegs_to_the_batch_and_decodes_the_rest_first() -> None:
    adapter = gpu_adapter()
    blobs = [encode(photo((64, 48))), encode(photo((40, 40)), "PNG")]
    decoded = adapter.decode(json_body(blobs), "application/json", {})
    jpeg, png = decoded.items
    assert isinstance(jpeg, EncodedImage)
    assert (jpeg.index, jpeg.width, jpeg.height, jpeg.gpu, jpeg.data) == (0, 64, 48, True, blobs[0])
    # Pillow's decode of the PNG ran here, before any batch: the batch only copies its crop
    np.testing.assert_array_equal(png, pillow_crop(blobs[1], 1, 32, MAX_PIXELS))
    assert adapter.backend.describe()["image_decode"] == "gpu"
    assert adapter.decode_inline is False  # a small body can still hold a large PNG


def test_gpu_path_outputs_equal_the_cpu_path() -> None:
    blobs = [
        encode(photo((500, 375), 1), quality=90),
        encode(photo((375, 500), 2), quality=90),
        encode(photo((500, 375), 3), quality=90),  # same size as the first: one group
        encode(photo((120, 900), 4), progressive=True),
        encode(photo((300, 200), 5, mode="L")),
        encode(photo((200, 200), 6, mode="CMYK")),
        encode(photo((90, 70), 7), "PNG"),
    ]
    decoder = CountingDecoder()
    # At 224 no image here is large enough for Pillow's draft (a short side of 512 or more),
    # which nvJPEG has no counterpart of: both paths decode every pixel.
    gpu = gpu_adapter(decoder, image_size=224)
    cpu = cpu_adapter(image_size=224)
    body = json_body(blobs)
    gpu_out = gpu.backend.predict(gpu.decode(body, "application/json", {}).items)
    cpu_out = cpu.backend.predict(cpu.decode(body, "application/json", {}).items)
    assert decoder.calls == [5]  # the five nvJPEG kinds in one call; CMYK and PNG to Pillow
    for (gs, gi), (cs, ci) in zip(gpu_out, cpu_out, strict=True):
        np.testing.assert_array_equal(gi, ci)
        np.testing.assert_array_equal(gs, cs)


def test_chunks_bound_each_nvjpeg_call() -> None:
    decoder = CountingDecoder()
    adapter = gpu_adapter(decoder, chunk_pixels=3 * 64 * 48)
    items = [encoded_image(encode(photo((64, 48), i)), i, MAX_PIXELS) for i in range(7)]
    assert len(adapter.backend.predict(items)) == 7
    assert decoder.calls == [3, 3, 1]


def test_an_image_nothing_can_decode_fails_its_item_only() -> None:
    good = [encode(photo((64, 48), i)) for i in range(3)]
    # Bytes that pass no header check: built by hand, to make the stand-in nvJPEG refuse a batch.
    garbage = b"\xff\xd8" + bytes(64)
    decoder = CountingDecoder(refuse=lambda b: b == garbage)
    adapter = gpu_adapter(decoder)
    items = [
        encoded_image(good[0], 0, MAX_PIXELS),
        EncodedImage(garbage, 1, 64, 48, gpu=True),
        encoded_image(good[1], 0, MAX_PIXELS),  # another request's
        encoded_image(good[2], 2, MAX_PIXELS),
        encoded_image(sampling_zero(good[2]), 3, MAX_PIXELS),  # header fine: Pillow decides
    ]
    assert not items[4].gpu
    outputs = adapter.backend.predict(items)
    # the batch failed, then each image alone; the refused one, and the one only Pillow takes,
    # come back to their requests to decode off the batch, where Pillow fails them too
    assert decoder.calls == [4, 1, 1, 1, 1]
    for slot, index in ((1, 1), (4, 3)):
        out = outputs[slot]
        assert isinstance(out, Redo)
        expected = BadRequest(
            f"'input[{index}]' is not a readable JPEG or PNG image", param=f"input[{index}]"
        )
        assert _error(out.prepare).to_json() == expected.to_json()
    alone = cpu_adapter().backend.predict([pillow_crop(b, 0, 32, MAX_PIXELS) for b in good])
    for got, want in zip([outputs[0], outputs[2], outputs[3]], alone, strict=True):
        assert not isinstance(got, ItemError)
        np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-6)


def test_an_image_nvjpeg_refuses_but_pillow_reads_gets_pillow_crops() -> None:
    blob = encode(photo((64, 48), 1))
    decoder = CountingDecoder(refuse=lambda b: b == blob)
    adapter = gpu_adapter(decoder)
    (redo,) = adapter.backend.predict([encoded_image(blob, 0, MAX_PIXELS)])
    assert isinstance(redo, Redo)  # Pillow's decode runs for its request, not in the batch
    (out,) = adapter.backend.predict([redo.prepare()])
    (expected,) = cpu_adapter().backend.predict([pillow_crop(blob, 0, 32, MAX_PIXELS)])
    np.testing.assert_array_equal(out[1], expected[1])
    assert adapter.backend._gpu is not None and adapter.backend._gpu.fallbacks == 1


def test_a_wrong_size_from_the_decoder_goes_to_pillow() -> None:
    blob = encode(photo((64, 48), 1))
    item = EncodedImage(blob, 0, 64, 48, gpu=True)
    decoder = GpuJpegDecoder(
        CPU, 32, decode_batch=lambda data: [torch.zeros((3, 10, 10), dtype=torch.uint8)]
    )
    crops = torch.zeros((1, 32, 32, 3), dtype=torch.uint8)
    assert decoder.decode_into(crops, [(0, item)]) == [0]


def test_out_of_memory_in_the_decoder_propagates() -> None:
    def oom(data: list[torch.Tensor]) -> list[torch.Tensor]:
        raise RuntimeError("Error while decoding JPEG images: CUDA out of memory. Tried to ...")

    decoder = GpuJpegDecoder(CPU, 32, decode_batch=oom)
    item = encoded_image(encode(photo((64, 48))), 0, MAX_PIXELS)
    with pytest.raises(RuntimeError, match="out of memory"):
        decoder.decode_into(torch.zeros((1, 32, 32, 3), dtype=torch.uint8), [(0, item)])


def test_gpu_worst_case_items_are_the_largest_jpegs_one_chunk_holds() -> None:
    adapter = gpu_adapter(max_image_pixels=250_000, chunk_pixels=600_000)
    items = adapter.backend.worst_case_items(5)
    assert all(isinstance(x, EncodedImage) and x.gpu for x in items)
    assert [(x.width, x.height) for x in items[:2]] == [(500, 500)] * 2
    assert [(x.width, x.height) for x in items[2:]] == [(500, 375)] * 3  # typical
    assert Image.open(io.BytesIO(items[0].data)).size == (500, 500)
    assert [len(b) for b in adapter.backend.warmup_batches(3)] == [1, 2, 3]
    assert len(adapter.backend.predict(items)) == 5


def test_synthetic_jpeg_is_444_baseline_or_progressive() -> None:
    img = Image.open(io.BytesIO(synthetic_jpeg(40, 30)))
    assert img.size == (40, 30) and img.layer[0][1:3] == (1, 1)  # luma not subsampled: 4:4:4
    assert "progressive" not in img.info
    assert Image.open(io.BytesIO(synthetic_jpeg(40, 30, progressive=True))).info["progressive"]


# ---- start-up: which path, and the setting ------------------------------------------------------


def test_cpu_replica_decodes_with_pillow_and_not_inline() -> None:
    adapter = cpu_adapter()
    assert adapter.decode_inline is False
    assert adapter.backend.describe()["image_decode"] == "cpu"
    (item,) = adapter.decode(encode(photo((64, 48))), "image/jpeg", {}).items
    assert isinstance(item, np.ndarray) and item.shape == (32, 32, 3)


def test_image_decode_gpu_without_cuda_fails_at_setup_naming_the_setting() -> None:
    adapter = build(
        parse_args(
            {"adapter": "image-classification", "load_format": "dummy", "image_decode": "gpu"}
        )
    )
    with pytest.raises(StartupError, match="args.image_decode") as info:
        adapter.backend.setup(CPU)
    assert "'gpu'" in info.value.message and "auto" in info.value.message
    assert adapter.backend.model is None  # failed before loading weights


def test_use_gpu_decode_resolution_off_cuda() -> None:
    image = {"adapter": "image-classification", "load_format": "dummy"}
    assert use_gpu_decode(parse_args(image), CPU) is False
    assert use_gpu_decode(parse_args({**image, "image_decode": "cpu"}), CPU) is False
    # An embeddings replica never probes nvJPEG, whatever image_decode says.
    emb = parse_args({"adapter": "embeddings", "image_decode": "gpu"})
    assert adapters.family(emb).outside_torch_hook(emb) is None


class FakeMemory:
    """DeviceMemory's readings for the probe: torch's reserved bytes and the process's NVML bytes
    from the test's state (``used`` None: NVML unreadable)."""

    device = CPU

    def __init__(self, reserved: Callable[[], int], used: Callable[[], int | None]):
        self.reserved, self.used = reserved, used
        self.frees = 0

    def synchronize(self) -> None:
        pass

    def free_cache(self) -> None:
        self.frees += 1

    def reserved_bytes(self) -> int:
        return self.reserved()

    def used_bytes(self) -> int | None:
        return self.used()


def test_decoder_memory_hook_only_for_a_gpu_decode_replica() -> None:
    def never() -> int:
        raise AssertionError("NVML read for a replica that does not decode on the GPU")

    unread = FakeMemory(never, never)
    image = {"adapter": "image-classification", "load_format": "dummy"}
    assert hold_decoder_memory(parse_args(image))(unread) is None  # type: ignore[arg-type]
    cpu_decode = parse_args({**image, "image_decode": "cpu"})
    assert adapters.family(cpu_decode).outside_torch_hook(cpu_decode) is None
    with pytest.raises(StartupError, match="args.image_decode"):
        hold_decoder_memory(parse_args({**image, "image_decode": "gpu"}))(unread)  # type: ignore[arg-type]


def test_measure_decoder_bytes_arithmetic() -> None:
    # NVML grows by 96 MiB over the probe while torch's reserved bytes grow by 32 MiB: nvJPEG
    # kept 64 MiB outside torch. The progressive probe is refused, and counted.
    mib = 1 << 20
    state = {"calls": 0, "reserved": 10 * mib}

    def decode(data: list[torch.Tensor]) -> list[torch.Tensor]:
        if Image.open(io.BytesIO(data[0].numpy().tobytes())).info.get("progressive"):
            raise RuntimeError("Error while decoding JPEG images: Failed to decode batch")
        state["calls"] += 1
        state["reserved"] += 16 * mib
        return pillow_decode(data[:1])

    memory = FakeMemory(lambda: state["reserved"], lambda: 1000 * mib + 48 * mib * state["calls"])
    measured = imagedecode.measure_decoder_bytes(memory, 10_000, decode)  # type: ignore[arg-type]
    assert state["calls"] == 2
    assert measured.before_bytes == 1000 * mib and measured.high_bytes == 1096 * mib
    assert measured.reserved_delta_bytes == 32 * mib
    assert measured.raw_bytes == 64 * mib
    assert measured.refused_images == 1
    assert memory.frees == 3  # before the probe and after each decode that succeeded
    unreadable = FakeMemory(lambda: 0, lambda: None)
    with pytest.raises(StartupError, match="image_decode"):
        imagedecode.measure_decoder_bytes(unreadable, 10_000, decode)  # type: ignore[arg-type]


def test_image_decode_setting_is_validated() -> None:
    assert parse_args({}).image_decode == "auto"
    with pytest.raises(ConfigError, match="args.image_decode") as info:
        parse_args({"image_decode": "nvjpeg"})
    assert "'auto', 'cpu' or 'gpu'" in info.value.message


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_payload_too_large_on_the_gpu_path_is_raised_at_decode() -> None:
    adapter = gpu_adapter(max_image_pixels=10_000)
    with pytest.raises(PayloadTooLarge, match="max_image_pixels"):
        adapter.decode(encode(photo((200, 100))), "image/jpeg", {})
