"""JPEG decoding on the GPU (nvJPEG through torchvision) against the CPU path (Pillow), in-process.

1. The adapter on a GPU picks the GPU path (``image_decode: auto``), never on the event loop
   (a small body may hold a large PNG); ``image_decode: cpu`` keeps Pillow.
2. Crops: for JPEGs of several sizes and kinds (4:2:0, 4:2:2, 4:4:4, progressive, greyscale, a
   tall strip, smaller than the crop, two of one size), the GPU path's crops against the CPU
   path's: the resize alone is exact (resizing nvJPEG's own pixels on the GPU equals Pillow's
   resize of them, bit for bit), so the crops differ only where the two JPEG decoders' IDCT and
   chroma upsampling do. Tolerance, per image: mean |difference| <= 2 levels (the bound
   torchvision's own test sets for nvJPEG against libjpeg on full-size decodes) and 99.9 % of
   values within 12 levels.
   A CMYK JPEG takes the Pillow route (in ``prepare``, before the batch) and must be identical.
   The CPU reference decodes every pixel (no ``draft``), as nvJPEG does.
3. Logits: the fp16 classifier on both sets of crops: max |logit difference| <= 2 % of the
   largest |logit|; probabilities within 5 % of the top one; the same top class or one the
   other run scores within 2 % of its own top (the CUDA graph test's fp16 tolerance).
4. Bad images: one only Pillow takes and Pillow refuses fails its request in ``prepare``; in a
   batch, an image nvJPEG refuses comes back as a ``Redo`` (Pillow, off the batch) whose Pillow
   decode gives the CPU path's 400 when it cannot read it either; every other item is answered.
5. Memory, in a fresh process as at start-up: ``measure_decoder_bytes`` (nvJPEG's cudaMalloc
   buffers, outside the torch cap), then the decoder's worst-case work; what the process holds
   outside torch afterwards, and at any sampled moment, stays within that figure. Images nvJPEG
   refuses (if its hardware path will not take 6,324 x 6,324, say) are recorded, not failed:
   they come back as a ``Redo``.
6. Calibration's worst-case items (a 6,324 x 6,324 JPEG first) run through ``predict``.

Writes ``image_decode_gpu.json`` under ``$SERVE_APP_RESULTS_DIR`` (default
``benchmarks/results/gpu_tests``) before asserting. Run on the GPU host:
``python3 -m pytest -v -s -p no:cacheprovider tests/gpu/test_image_decode_gpu.py``.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("torchvision.io")

from serve_app.adapters.contract import Model, Redo  # noqa: E402
from serve_app.adapters.image import build  # noqa: E402
from serve_app.adapters.image.decoder_memory import (  # noqa: E402
    DecoderMemory,
    measure_decoder_bytes,
)
from serve_app.adapters.image.files import (  # noqa: E402
    EncodedImage,
    crop_opened,
    encoded_image,
    open_header,
    pillow_crop,
    synthetic_jpeg,
    worst_case_size,
)
from serve_app.adapters.image.gpudecode import GpuJpegDecoder, nvjpeg_decoder  # noqa: E402
from serve_app.adapters.image.resize import crop_box, resize_crops  # noqa: E402
from serve_app.config.args import parse_args  # noqa: E402
from serve_app.errors import BadRequest, ServeAppError  # noqa: E402

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
DEVICE = torch.device("cuda", 0)
SIZE = 224
MAX_PIXELS = 40_000_000  # the default args.max_image_pixels
MIB = 1 << 20
CROP_MEAN_MAX = 2.0
CROP_P999_MAX = 12.0
RETAINED_SLACK_BYTES = 32 * MIB  # kernels loaded on first use, NVML's 2 MiB granularity
PEAK_SLACK_BYTES = 64 * MIB
RESULTS: dict[str, Any] = {}


def record(results_dir: Path, key: str, value: Any) -> None:
    RESULTS[key] = value
    path = results_dir / "image_decode_gpu.json"
    path.write_text(json.dumps(RESULTS, indent=2, sort_keys=True, default=str))
    print(f"[image decode] {key}: {json.dumps(value, default=str)[:2000]}", flush=True)


def scene(size: tuple[int, int], seed: int, mode: str = "RGB") -> Image.Image:
    """A photo-like test image: smooth colour fields with luminance grain."""
    w, h = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack(
        [
            127 + 90 * np.sin(x / (9 + seed) + y / 17),
            127 + 90 * np.cos(y / (11 + seed)),
            40 + 175 * x / max(1, w - 1),
        ],
        axis=-1,
    )
    grain = rng.normal(0, 3, (h, w, 1))
    img = Image.fromarray(np.clip(base + grain, 0, 255).astype(np.uint8))
    return img.convert(mode) if mode != "RGB" else img


def encode(img: Image.Image, fmt: str = "JPEG", **save: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **save)
    return buf.getvalue()


# name, bytes, whether the GPU path sends it to nvJPEG
CASES: list[tuple[str, bytes, bool]] = [
    ("420_500x375", encode(scene((500, 375), 1), quality=90), True),
    ("420_375x500", encode(scene((375, 500), 2), quality=90), True),
    ("420_500x375_same_size", encode(scene((500, 375), 3), quality=90), True),
    ("444_640x480", encode(scene((640, 480), 4), quality=95, subsampling=0), True),
    ("422_800x600", encode(scene((800, 600), 5), subsampling="4:2:2"), True),
    ("progressive_1920x1080", encode(scene((1920, 1080), 6), progressive=True), True),
    ("tall_120x900", encode(scene((120, 900), 7)), True),  # Pillow's vertical pass first
    ("grey_300x200", encode(scene((300, 200), 8, mode="L")), True),
    ("small_100x80", encode(scene((100, 80), 9)), True),  # smaller than the crop
    ("square_224", encode(scene((224, 224), 10)), True),
    ("cmyk_200x200", encode(scene((200, 200), 11, mode="CMYK")), False),
]


def json_body(blobs: list[bytes]) -> bytes:
    return json.dumps({"input": [base64.b64encode(b).decode() for b in blobs]}).encode()


def u8(blob: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def full_probs(out: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    scores, ids = out
    probs = np.zeros(len(ids), dtype=np.float64)
    probs[ids] = scores
    return probs


def image_args(**extra: Any) -> Any:
    return parse_args(
        {"adapter": "image-classification", "load_format": "dummy", "dtype": "float16", **extra}
    )


@pytest.fixture(scope="module")
def adapter() -> Model:
    torch.cuda.set_device(DEVICE)
    torch.manual_seed(0)
    a = build(image_args())
    a.backend.setup(DEVICE)
    return a


@pytest.fixture(scope="module")
def crops(adapter: Model) -> dict[str, Any]:
    """The cases through both paths: the GPU path's items and crops, the CPU path's crops."""
    blobs = [blob for _, blob, _ in CASES]
    items = adapter.decode(json_body(blobs), "application/json", {}).items
    gpu_crops, redo = adapter.backend._gpu_batch(items)
    torch.cuda.synchronize(DEVICE)
    cpu_crops = np.stack([full_pillow_crop(b, i) for i, b in enumerate(blobs)])
    return {"items": items, "gpu": gpu_crops, "redo": redo, "cpu": cpu_crops}


def full_pillow_crop(blob: bytes, index: int) -> np.ndarray:
    """The CPU path's crop from every pixel (no draft), as nvJPEG decodes them."""
    where = f"input[{index}]"
    return crop_opened(open_header(blob, where, MAX_PIXELS), where, SIZE, MAX_PIXELS)


def test_adapter_on_a_gpu_decodes_jpegs_there(adapter: Model, results_dir: Path) -> None:
    cpu_only = build(image_args(image_decode="cpu"))
    cpu_only.backend.setup(DEVICE)
    record(
        results_dir,
        "paths",
        {
            "auto": adapter.backend.describe()["image_decode"],
            "cpu": cpu_only.backend.describe()["image_decode"],
        },
    )
    assert adapter.decode_inline is False and adapter.backend.describe()["image_decode"] == "gpu"
    assert cpu_only.decode_inline is False and cpu_only.backend.describe()["image_decode"] == "cpu"
    (item,) = cpu_only.decode(CASES[0][1], "image/jpeg", {}).items
    assert isinstance(item, np.ndarray) and item.shape == (SIZE, SIZE, 3)


def test_gpu_crops_match_the_cpu_path(
    adapter: Model, crops: dict[str, Any], results_dir: Path
) -> None:
    items, gpu, cpu = crops["items"], crops["gpu"].cpu().numpy(), crops["cpu"]
    decode = nvjpeg_decoder(DEVICE)
    stats: dict[str, Any] = {}
    for i, (name, blob, on_gpu) in enumerate(CASES):
        d = np.abs(gpu[i].astype(np.int16) - cpu[i].astype(np.int16))
        entry: dict[str, Any] = {
            "nvjpeg": isinstance(items[i], EncodedImage),
            "crop_mean_abs": float(d.mean()),
            "crop_p999_abs": float(np.percentile(d, 99.9)),
            "crop_max_abs": int(d.max()),
        }
        if on_gpu:
            # The resize alone: nvJPEG's own pixels, resized on the GPU and by Pillow.
            (full,) = decode([u8(blob)])
            h, w = full.shape[1:]
            on_device = resize_crops(full.unsqueeze(0), SIZE)[0].cpu().numpy()
            pixels = Image.fromarray(full.permute(1, 2, 0).cpu().numpy())
            by_pillow = np.asarray(
                pixels.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=crop_box(w, h, SIZE))
            )
            reference = np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"), dtype=np.int16)
            full_diff = np.abs(full.permute(1, 2, 0).cpu().numpy().astype(np.int16) - reference)
            entry.update(
                {
                    "resize_equal_pillow": bool(np.array_equal(on_device, by_pillow)),
                    "batch_vs_single_crop_max_abs": int(
                        np.abs(on_device.astype(np.int16) - gpu[i].astype(np.int16)).max()
                    ),
                    "full_decode_mean_abs": float(full_diff.mean()),
                    "full_decode_max_abs": int(full_diff.max()),
                }
            )
        stats[name] = entry
    record(results_dir, "crops", stats)
    assert crops["redo"] == {}
    for (name, _, on_gpu), item in zip(CASES, items, strict=True):
        entry = stats[name]
        assert isinstance(item, EncodedImage) == on_gpu, name
        if on_gpu:
            assert entry["crop_mean_abs"] <= CROP_MEAN_MAX, (name, entry)
            assert entry["crop_p999_abs"] <= CROP_P999_MAX, (name, entry)
        else:
            assert entry["crop_max_abs"] == 0, (name, entry)  # Pillow on both paths


def test_logits_match_the_cpu_path_within_fp16(
    adapter: Model, crops: dict[str, Any], results_dir: Path
) -> None:
    with torch.inference_mode():
        (gpu_logits,) = adapter.backend._forward(crops["gpu"])
        (cpu_logits,) = adapter.backend._forward(torch.from_numpy(crops["cpu"]).to(DEVICE))
    lg, lc = gpu_logits.float().cpu().numpy(), cpu_logits.float().cpu().numpy()
    rel = np.abs(lg - lc).max(axis=1) / np.abs(lc).max(axis=1)
    gpu_out = adapter.backend.predict(crops["items"])
    cpu_out = adapter.backend.predict(list(crops["cpu"]))
    prob_diff, top_ok = [], []
    for g, c in zip(gpu_out, cpu_out, strict=True):
        pg, pc = full_probs(g), full_probs(c)
        prob_diff.append(float(np.abs(pg - pc).max() / pc.max()))
        top_ok.append(bool(pc[np.argmax(pg)] >= 0.98 * pc.max()))
    record(
        results_dir,
        "logits",
        {
            "max_rel_logit_diff": [float(r) for r in rel],
            "max_prob_diff_over_top": prob_diff,
            "top_class_ok": top_ok,
        },
    )
    assert np.isfinite(lg).all() and np.isfinite(lc).all()
    assert (rel <= 0.02).all(), rel
    assert max(prob_diff) <= 0.05, prob_diff
    assert all(top_ok), top_ok


def test_bad_images_fail_their_own_request_only(adapter: Model, results_dir: Path) -> None:
    good = [blob for _, blob, _ in CASES[:3]]
    whole = good[1]
    broken = bytearray(whole)
    broken[broken.index(b"\xff\xc0") + 11] = 0x00  # luma sampling 0 x 0: libjpeg refuses
    for body, index in (
        (json_body([good[0], bytes(broken), good[2]]), 1),
        (whole[: len(whole) // 2], 0),
    ):
        # only Pillow takes these (sampling 0 x 0; no end marker): it refuses them in prepare
        with pytest.raises(BadRequest) as info:
            adapter.decode(body, "application/json" if index else "image/jpeg", {})
        assert info.value.param == f"input[{index}]"
    first = adapter.decode(json_body([good[0], good[2]]), "", {}).items
    png = encode(scene((90, 70), 12), "PNG")
    by_hand = [
        # Past any header check, to make nvJPEG itself refuse the chunk: Pillow cannot read the
        # first either (400); it reads the second (a PNG) and its crop is served.
        EncodedImage(b"\xff\xd8" + bytes(64), 5, 64, 48, gpu=True),
        EncodedImage(png, 6, 90, 70, gpu=True),
    ]
    items = [*first, *by_hand]
    assert [x.gpu for x in items] == [True, True, True, True]
    assert adapter.backend._gpu is not None
    fallbacks = adapter.backend._gpu.fallbacks
    outputs = adapter.backend.predict(items)
    refused = adapter.backend._gpu.fallbacks - fallbacks
    assert isinstance(outputs[2], Redo) and isinstance(outputs[3], Redo)
    with pytest.raises(ServeAppError) as info:
        outputs[2].prepare()
    record(results_dir, "bad_images", {"error": info.value.to_json(), "nvjpeg_refused": refused})
    expected = BadRequest("'input[5]' is not a readable JPEG or PNG image", param="input[5]")
    assert info.value.to_json() == expected.to_json()
    assert refused == 2  # the garbage and the PNG
    (png_out,) = adapter.backend.predict([outputs[3].prepare()])  # Pillow, off the batch
    cpu = [pillow_crop(b, 0, SIZE, MAX_PIXELS) for b in (good[0], good[2], png)]
    alone = adapter.backend.predict(cpu)
    for got, want in zip([outputs[0], outputs[1], png_out], alone, strict=True):
        assert not isinstance(got, Redo)
        pg, pc = full_probs(got), full_probs(want)
        assert np.abs(pg - pc).max() <= 0.05 * pc.max()


def test_calibration_items_run_through_predict(adapter: Model, results_dir: Path) -> None:
    t0 = time.perf_counter()
    items = adapter.backend.worst_case_items(3)
    made_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats(DEVICE)
    assert adapter.backend._gpu is not None
    fallbacks = adapter.backend._gpu.fallbacks
    t0 = time.perf_counter()
    outputs = adapter.backend.predict(items)
    torch.cuda.synchronize(DEVICE)
    record(
        results_dir,
        "calibration_items",
        {
            "largest": worst_case_size(MAX_PIXELS),
            "nvjpeg_refused": adapter.backend._gpu.fallbacks - fallbacks,  # those went to Pillow
            "make_s": round(made_s, 3),
            "predict_s": round(time.perf_counter() - t0, 3),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(DEVICE)),
        },
    )
    assert (items[0].width, items[0].height) == (6324, 6324)
    assert len(outputs) == 3 and not any(isinstance(o, Redo) for o in outputs)


def test_throughput_against_pillow(adapter: Model, results_dir: Path) -> None:
    """Recorded, not asserted: decode and crop per second, GPU path against one Pillow thread."""
    assert adapter.backend._gpu is not None
    same = [encode(scene((500, 375), 20 + i), quality=90) for i in range(16)]
    varied = [encode(scene((400 + i, 300 + 2 * i), 40 + i), quality=90) for i in range(64)]
    figures: dict[str, float] = {}
    for name, blobs, repeat in (("same_size", same * 16, 3), ("64_sizes", varied * 4, 3)):
        rows = [(i, encoded_image(b, i, MAX_PIXELS)) for i, b in enumerate(blobs)]
        out = torch.empty((len(rows), SIZE, SIZE, 3), dtype=torch.uint8, device=DEVICE)
        adapter.backend._gpu.decode_into(out, rows)  # warm
        torch.cuda.synchronize(DEVICE)
        t0 = time.perf_counter()
        for _ in range(repeat):
            adapter.backend._gpu.decode_into(out, rows)
        torch.cuda.synchronize(DEVICE)
        figures[f"gpu_{name}_batch_{len(rows)}_per_s"] = (
            repeat * len(rows) / (time.perf_counter() - t0)
        )
    t0 = time.perf_counter()
    for i, b in enumerate(same * 4):
        pillow_crop(b, i, SIZE, MAX_PIXELS)
    figures["pillow_one_thread_per_s"] = 64 / (time.perf_counter() - t0)
    record(results_dir, "throughput", figures)
    assert all(v > 0 for v in figures.values())


# ---- memory: a fresh process, as a replica at start-up -----------------------------------------


def _warm_torch_kernels() -> None:
    """Load the resize's kernels (and cuBLAS) before the baseline: they are not nvJPEG's."""
    wide = torch.randint(0, 256, (2, 3, 300, 400), dtype=torch.uint8, device=DEVICE)
    tall = torch.randint(0, 256, (1, 3, 2000, 150), dtype=torch.uint8, device=DEVICE)
    large = torch.randint(0, 256, (1, 3, 1500, 1500), dtype=torch.uint8, device=DEVICE)
    out = torch.empty((4, SIZE, SIZE, 3), dtype=torch.uint8, device=DEVICE)
    for images in (wide, tall, large):
        stacked = torch.stack(list(images))
        rows = torch.arange(len(stacked), device=DEVICE)
        out.index_copy_(0, rows, resize_crops(stacked, SIZE))
    torch.cuda.synchronize(DEVICE)
    del wide, tall, large, out
    torch.cuda.empty_cache()


def _memory_probe(out_path: str) -> None:
    """The start-up measurement, then the decoder's worst-case work with NVML sampled."""
    from serve_app.gpu import devices, nvml
    from serve_app.gpu.snapshot import DeviceMemory

    torch.cuda.set_device(DEVICE)
    torch.zeros(1, device=DEVICE)
    torch.cuda.synchronize(DEVICE)
    uuid = devices.uuid_for_torch_device(0)
    assert uuid is not None
    pid = os.getpid()
    source = "process"

    def used() -> int | None:
        nonlocal source
        value = nvml.process_used_bytes(pid, uuid)
        if isinstance(value, int):
            return value
        source = "device"
        mem = nvml.device_memory(uuid)
        return mem.used_bytes if isinstance(mem, nvml.GpuMemory) else None

    def non_torch() -> int:
        torch.cuda.synchronize(DEVICE)
        torch.cuda.empty_cache()
        value = used()
        assert value is not None
        return value - int(torch.cuda.memory_reserved(DEVICE))

    _warm_torch_kernels()
    baseline = non_torch()
    memory = measure_decoder_bytes(DeviceMemory(DEVICE, uuid), MAX_PIXELS)
    after_probe = non_torch()

    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            value = used()
            if value is not None:
                samples.append(value)
            time.sleep(0.0005)

    w, h = worst_case_size(MAX_PIXELS)
    typical = synthetic_jpeg(500, 375)
    workloads = {
        "calibration_256": [synthetic_jpeg(w, h)] + [typical] * 255,
        "typical_256": [typical] * 256,
        "progressive_largest": [synthetic_jpeg(w, h, progressive=True)],
        "chunk_of_256x256": [synthetic_jpeg(256, 256)] * 256,
        "mixed": [synthetic_jpeg(300 + 37 * i, 200 + 23 * i) for i in range(48)],
    }
    decoder = GpuJpegDecoder(DEVICE, SIZE)
    torch.cuda.reset_peak_memory_stats(DEVICE)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    timings = {}
    for name, blobs in workloads.items():
        rows = [(i, encoded_image(b, i, MAX_PIXELS)) for i, b in enumerate(blobs)]
        out = torch.empty((len(rows), SIZE, SIZE, 3), dtype=torch.uint8, device=DEVICE)
        t0 = time.perf_counter()
        failed = decoder.decode_into(out, rows)
        torch.cuda.synchronize(DEVICE)
        timings[name] = {"s": round(time.perf_counter() - t0, 4), "refused": len(failed)}
        del out
    stop.set()
    sampler.join()
    peak_reserved = int(torch.cuda.max_memory_reserved(DEVICE))
    total = int(torch.cuda.get_device_properties(DEVICE).total_memory)
    doc = {
        "nvml_source": source,
        "baseline_non_torch_bytes": baseline,
        "decoder": dataclasses.asdict(memory),
        "after_probe_non_torch_bytes": after_probe,
        "after_work_non_torch_bytes": non_torch(),
        "peak_sampled_used_bytes": max(samples) if samples else None,
        "samples": len(samples),
        "peak_reserved_bytes": peak_reserved,
        "device_total_bytes": total,
        "share_0_25_budget_bytes": int(0.25 * total),
        "workloads": timings,
    }
    Path(out_path).write_text(json.dumps(doc, indent=2))


def test_decoder_memory_is_measured_before_the_cap(tmp_path: Path, results_dir: Path) -> None:
    out = tmp_path / "memory.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("SERVE_APP_FAKE_NVML", None)
    proc = subprocess.run(
        [sys.executable, __file__, "--memory-probe", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    raw = int(doc["decoder"]["raw_bytes"])
    doc["raw_share_of_0_25_budget"] = raw / doc["share_0_25_budget_bytes"]
    record(results_dir, "memory", doc)
    baseline = int(doc["baseline_non_torch_bytes"])
    # nvJPEG's buffers come from cudaMalloc (see imagedecode.py): the probe finds some
    assert raw > 0, doc
    assert raw <= doc["share_0_25_budget_bytes"] // 10, doc
    # what the process keeps outside torch after all the decoder's work is within what the
    # replica sets aside for it at start-up (the probe's figure and its margin)
    reserve = DecoderMemory(**doc["decoder"]).reserve_bytes
    doc["reserve_bytes"] = reserve
    record(results_dir, "memory", doc)
    assert doc["after_work_non_torch_bytes"] <= baseline + reserve + RETAINED_SLACK_BYTES, doc
    # and at no sampled moment did it hold more than that beside torch's peak
    peak = doc["peak_sampled_used_bytes"]
    assert peak is not None and doc["samples"] > 10, doc
    assert peak <= baseline + reserve + doc["peak_reserved_bytes"] + PEAK_SLACK_BYTES, doc


if __name__ == "__main__" and sys.argv[1:2] == ["--memory-probe"]:
    _memory_probe(sys.argv[2])
