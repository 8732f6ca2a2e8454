"""The in-process ceiling: each model alone in one process, items/s per batch size (the model as
a replica runs it: fp16 and channels-last on a GPU), and one CPU thread's decode or tokenize
rate for the benchmark's payloads. The throughput rows are read against it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from load_tests.benchmarks.throughput.payload import MODELS
from load_tests.harness.run import error_doc, log


def time_it(fn: Callable[[], Any], sync: Callable[[], None], min_s: float) -> float:
    """Seconds per call of fn (after two warm-up calls), timed over at least min_s; calls are
    queued in growing groups between synchronisations, as a serving loop would issue them."""
    for _ in range(2):
        fn()
    sync()
    n, group = 0, 1
    t0 = time.perf_counter()
    while True:
        for _ in range(group):
            fn()
        n += group
        sync()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s and n >= 3:
            return elapsed / n
        group = min(group * 2, 32)


def ceiling_worker(spec: Mapping[str, Any]) -> dict[str, Any]:
    """In one process, the model alone: items/s per batch size, plus one CPU thread's
    decode/tokenize rate for the same payloads."""
    import torch

    from load_tests import payloads

    cuda = spec["device"] == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch sees no CUDA device")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.float16 if cuda else torch.float32
    torch.backends.cudnn.benchmark = True

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    out: dict[str, Any] = {}
    for name in spec["models"]:
        doc: dict[str, Any] = {
            "device": str(device),
            "dtype": str(dtype).replace("torch.", ""),
            "items_per_s": {},
        }
        out[name] = doc
        try:
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            if MODELS[name]["kind"] == "image":
                model = build_resnet50().to(device, dtype).eval()
                if cuda:
                    model = model.to(memory_format=torch.channels_last)
                doc["layout"] = "channels_last" if cuda else "contiguous"
                for b in spec["batches"]:
                    x = torch.randn(b, 3, 224, 224, device=device, dtype=dtype)
                    if cuda:
                        x = x.to(memory_format=torch.channels_last)

                    def fwd(x: Any = x, model: Any = model) -> None:
                        with torch.inference_mode():
                            model(x)

                    per = time_it(fwd, sync, spec["min_s"])
                    doc["items_per_s"][str(b)] = b / per
                blobs = [payloads.image_bytes(224, "jpeg", s) for s in range(4)]
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < spec["cpu_min_s"]:
                    preprocess_image(blobs[n % 4])
                    n += 1
                doc["cpu_preprocess_items_per_s_one_thread"] = n / (time.perf_counter() - t0)
            else:
                from transformers import AutoConfig, AutoModel, AutoTokenizer

                tok = AutoTokenizer.from_pretrained(minilm_dir())
                model = AutoModel.from_config(AutoConfig.from_pretrained(minilm_dir()))
                model = model.to(device, dtype).eval()
                mixed = spec.get("texts")
                texts = mixed or payloads.texts("short", max(spec["batches"]), 0)
                doc["tokens_per_s"] = {}
                doc["workload"] = "mixed" if mixed else "short"
                doc["texts"] = len(mixed) if mixed else None
                for b in spec["batches"]:
                    if mixed:  # every text, in length order: the least padding of any batcher
                        batches = length_sorted_batches(tok, mixed, b)
                    else:
                        batches = [texts[:b]]
                    encs = [tok(t, padding=True, return_tensors="pt").to(device) for t in batches]

                    def embed(encs: Any = encs, model: Any = model) -> None:
                        with torch.inference_mode():
                            for enc in encs:
                                h = model(**enc).last_hidden_state
                                m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
                                pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                                torch.nn.functional.normalize(pooled.float(), p=2, dim=1)

                    per = time_it(embed, sync, spec["min_s"])
                    n_texts = sum(len(t) for t in batches)
                    real_tokens = sum(int(e["attention_mask"].sum()) for e in encs)
                    doc["items_per_s"][str(b)] = n_texts / per
                    doc["tokens_per_s"][str(b)] = real_tokens / per
                    doc["tokens_per_text_padded"] = max(int(e["input_ids"].shape[1]) for e in encs)
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < spec["cpu_min_s"]:
                    tok(texts[n % len(texts)])
                    n += 1
                doc["cpu_preprocess_items_per_s_one_thread"] = n / (time.perf_counter() - t0)
            doc["items_per_s_max"] = max(doc["items_per_s"].values())
            if cuda:
                doc["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
            model = None  # free it before the next model
            doc["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - one model's failure must not hide the other
            doc.update(status="error", **error_doc(exc))
        log(
            f"ceiling {name}: "
            + ", ".join(f"batch {b}: {v:,.0f}/s" for b, v in doc["items_per_s"].items())
            + (f"  ({doc.get('error')})" if doc.get("status") == "error" else "")
        )
    return out


def length_sorted_batches(tok: Any, texts: list[str], batch: int) -> list[list[str]]:
    """``texts`` (repeated to fill at least one batch) sorted by token count, in batches of
    ``batch``: one pass over them is what the ceiling times."""
    pool = texts * max(1, -(-batch // max(1, len(texts))))
    lengths = [len(ids) for ids in tok(pool)["input_ids"]]
    ordered = [t for _, t in sorted(zip(lengths, pool, strict=True), key=lambda x: x[0])]
    return [ordered[i : i + batch] for i in range(0, len(ordered), batch)]


def preprocess_image(blob: bytes, size: int = 224) -> Any:
    """JPEG/PNG bytes -> normalised CHW float32, the same steps as serve_app's image adapter:
    RGB, the centre square that becomes a size x size crop after resizing the short side to
    size*256/224, resized in one bilinear step, then ImageNet mean/std."""
    import io

    import numpy as np
    from PIL import Image

    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32)
    img = Image.open(io.BytesIO(blob)).convert("RGB")
    scale = size * 256 / 224 / min(img.size)
    side = size / scale
    left, top = (img.width - side) / 2, (img.height - side) / 2
    img = img.resize(
        (size, size), Image.Resampling.BILINEAR, box=(left, top, left + side, top + side)
    )
    arr = (np.asarray(img, dtype=np.float32) / 255.0 - mean) / std
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def build_resnet50() -> Any:
    """torchvision's ResNet-50 with random weights (serve_app's copy where torchvision is
    missing, as on the CPU test machine; same module layout)."""
    try:
        import torchvision

        return torchvision.models.resnet50(weights=None)
    except Exception:  # noqa: BLE001 - no or broken torchvision
        from serve_app.adapters.image.resnet import build_resnet

        return build_resnet("resnet50")


def minilm_dir() -> str:
    from serve_app.adapters.embeddings.modeldir import SKELETON_DIR

    return str(SKELETON_DIR)
