"""Deterministic request payloads shared by the bench and the locustfile.

Everything is generated from a seeded RNG, so two runs with the same seed send byte-identical
bodies, and encoded images are cached so encoding never sits on the request path. Nothing is
generated at import time.
"""

from __future__ import annotations

import base64
import io
import json
import random
from collections.abc import Sequence
from functools import lru_cache
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw

TextKind = Literal["short", "long", "mixed"]
ImageFormat = Literal["jpeg", "png"]

TEXT_KINDS: tuple[str, ...] = ("short", "long", "mixed")
IMAGE_FORMATS: tuple[str, ...] = ("jpeg", "png")
IMAGE_CONTENT_TYPES: dict[str, str] = {"jpeg": "image/jpeg", "png": "image/png"}

# The model names serve_app answers to out of the box: `serve-app run` (configs/default.yaml and
# AppArgs.model_name) serves "all-MiniLM-L6-v2"; an image-classification app with no model_name
# answers to its arch, "resnet50". Any other name gets a 404, so every client default is these
# (tests/load_tests/test_payloads.py checks them against serve_app's config).
DEFAULT_EMBEDDINGS_MODEL = "all-MiniLM-L6-v2"
DEFAULT_IMAGE_MODEL = "resnet50"
DEFAULT_MODELS: dict[str, str] = {
    "embeddings": DEFAULT_EMBEDDINGS_MODEL,
    "image": DEFAULT_IMAGE_MODEL,
}

# Share of long texts in a "mixed" pool: mostly short queries with some documents, as in search.
MIXED_LONG_FRACTION = 0.3

VOCABULARY: tuple[str, ...] = tuple(
    """
    the a an of to in for on with by from at as about into over after under between through
    during without within along across behind beyond model server memory budget replica request
    response latency throughput queue batch token vector embedding image label score network
    cluster node device process kernel cache buffer tensor weight layer attention encoder sentence
    paragraph document search query result index record system service client user data value
    signal pattern river mountain forest ocean city village garden window kitchen library market
    harbor bridge station museum school hospital theater airport road valley island desert
    morning evening winter summer autumn spring weather storm cloud rain snow wind light shadow
    quiet bright careful simple rapid steady gentle heavy narrow broad ancient modern local
    global public private strong weak early late small large warm cold fresh clear dark green
    blue golden silver wooden stone paper glass metal cotton leather careful curious patient
    runs reads writes builds measures sends receives stores returns loads waits grows moves
    changes carries follows opens closes starts finishes explains describes compares improves
    reduces increases balances schedules allocates releases reports records observes predicts
    engineer teacher farmer doctor writer painter student traveler merchant sailor gardener
    musician scientist librarian baker carpenter pilot nurse driver neighbor friend family
    because while although when where since unless until before once however therefore also
    often rarely always never sometimes usually quickly slowly quietly carefully together
    """.split()
)


def _sentence(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(VOCABULARY) for _ in range(n_words)]
    words[0] = words[0].capitalize()
    return " ".join(words) + "."


def short_text(rng: random.Random) -> str:
    """A query-like text of 3 to 8 words, no trailing period."""
    return " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(3, 8)))


def long_text(rng: random.Random) -> str:
    """A document of 150 to 200 words in 3 to 5 paragraphs of 8-20-word sentences: long, but
    within MiniLM's 256-token limit (about 170 to 230 tokens), which serve_app enforces."""
    target_words = rng.randint(150, 200)
    n_paragraphs = rng.randint(3, 5)
    # Split the word budget into paragraphs, then each paragraph into sentences.
    cuts = sorted(rng.sample(range(30, target_words - 30), n_paragraphs - 1))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, target_words], strict=True)]
    paragraphs = []
    for size in sizes:
        sentences = []
        left = size
        while left > 0:
            n = min(left, rng.randint(8, 20))
            if 0 < left - n < 4:  # avoid a stub sentence at the end
                n = left
            sentences.append(_sentence(rng, n))
            left -= n
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs)


def texts(kind: str, n: int, seed: int = 0) -> list[str]:
    """`n` texts of `kind` ("short", "long" or "mixed"), identical for the same seed."""
    if kind not in TEXT_KINDS:
        raise ValueError(f"text kind {kind!r} is not one of {TEXT_KINDS}; pick one of those")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        is_long = kind == "long" or (kind == "mixed" and rng.random() < MIXED_LONG_FRACTION)
        out.append(long_text(rng) if is_long else short_text(rng))
    return out


@lru_cache(maxsize=64)
def image_bytes(size: int = 224, fmt: str = "jpeg", seed: int = 0) -> bytes:
    """An encoded `size` x `size` RGB image: a gradient, a few shapes and mild noise.

    Pure noise would compress unrealistically badly and a flat image unrealistically well; this
    lands near photo-like sizes (a 224 px JPEG at quality 90 is tens of KiB). Cached per argument.
    """
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"image format {fmt!r} is not one of {IMAGE_FORMATS}; pick one of those")
    if size < 8:
        raise ValueError(f"image size {size} px is too small; use at least 8")
    rng = np.random.default_rng(seed)
    axis = np.linspace(0.0, 1.0, size, dtype=np.float32)
    yy, xx = np.meshgrid(axis, axis, indexing="ij")
    c0, c1, c2 = rng.uniform(0, 255, size=(3, 3)).astype(np.float32)
    base = (
        c0[None, None, :] * (1 - xx)[..., None]
        + c1[None, None, :] * xx[..., None] * (1 - yy)[..., None]
        + c2[None, None, :] * (xx * yy)[..., None]
    )
    noise = rng.normal(0.0, 12.0, size=(size, size, 3)).astype(np.float32)
    pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels)
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = (int(v) for v in rng.integers(0, size, size=2))
        w, h = (int(v) for v in rng.integers(size // 10, size // 3 + 2, size=2))
        colour = tuple(int(v) for v in rng.integers(0, 256, size=3))
        if rng.random() < 0.5:
            draw.ellipse((x0, y0, x0 + w, y0 + h), fill=colour)
        else:
            draw.rectangle((x0, y0, x0 + w, y0 + h), fill=colour)
    buf = io.BytesIO()
    if fmt == "jpeg":
        img.save(buf, format="JPEG", quality=90)
    else:
        img.save(buf, format="PNG")
    return buf.getvalue()


@lru_cache(maxsize=64)
def image_b64(size: int = 224, fmt: str = "jpeg", seed: int = 0) -> str:
    """`image_bytes(size, fmt, seed)` as base64 text, cached."""
    return base64.b64encode(image_bytes(size, fmt, seed)).decode("ascii")


def embeddings_body(
    inputs: str | Sequence[str],
    model: str = DEFAULT_EMBEDDINGS_MODEL,
    encoding_format: str | None = None,
) -> bytes:
    """JSON body for `POST /v1/embeddings` (`encoding_format`: "float" or "base64" when given)."""
    payload: dict[str, object] = {
        "model": model,
        "input": inputs if isinstance(inputs, str) else list(inputs),
    }
    if encoding_format is not None:
        payload["encoding_format"] = encoding_format
    return json.dumps(payload).encode()


def classify_body(
    images_b64: str | Sequence[str], model: str = DEFAULT_IMAGE_MODEL, top_k: int = 5
) -> bytes:
    """JSON body for `POST /v1/classify` with base64-encoded images."""
    inputs = images_b64 if isinstance(images_b64, str) else list(images_b64)
    return json.dumps({"model": model, "input": inputs, "top_k": top_k}).encode()
