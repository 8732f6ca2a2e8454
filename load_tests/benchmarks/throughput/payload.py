"""The request each setup is loaded with, written to a file that wrk and the open-loop client
both read (so both send the same bytes), and an answer of the size serve_app gives to it.

MiniLM: short texts (3 to 8 words, load_tests.payloads), one or N per request as JSON, floats in
the answer by default or ``encoding_format: base64``; or, with the ``mixed`` workload, 64
seeded bodies of N queries or N passages (load_tests.workloads.texts states their lengths),
written one a line to a ``.bodies`` file that both clients send in turn. A text payload
carries the tokenizer's mean tokens per request, so that rows give tokens/s. ResNet-50: one
224 px JPEG (about 17 KiB) as the raw body (``Content-Type: image/jpeg``), or N of them base64
in JSON.

The no-op server that measures the clients' own ceiling answers each payload with ``response``:
a body shaped like serve_app's answer (N vectors of 384 float32 in their shortest form, or
base64, or N top-5 lists), because reading a 70 KiB answer costs a client more than reading
``{}``. Its size is close to, not exactly, the real one; rows record both.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from load_tests import payloads
from load_tests.harness.bodies import BODIES_SUFFIX, encode_bodies

# The models the benchmark serves: serve_app's adapter kind, model name and route for each.
MODELS: dict[str, dict[str, str]] = {
    "resnet50": {"kind": "image", "model_name": "resnet50", "route": "/v1/classify"},
    "minilm": {"kind": "embeddings", "model_name": "all-MiniLM-L6-v2", "route": "/v1/embeddings"},
}

ENCODINGS: tuple[str, ...] = ("float", "base64")
TEXT_WORKLOADS: tuple[str, ...] = ("short", "mixed")
MIXED_BODIES = 64  # distinct request bodies of the mixed workload, sent in turn
NOOP_PATH = "/noop"
EMBEDDING_DIM = 384  # MiniLM-L6
TOP_K = 5  # serve_app's default top_k


@dataclass(frozen=True)
class Payload:
    """One request body and how to send it. ``key`` names it in rows and file names."""

    key: str
    model: str | None  # None: the no-op request
    inputs_per_request: int
    path: str
    content_type: str
    body: bytes = field(repr=False)
    description: str
    response: bytes = field(default=b"{}", repr=False)
    # Several bodies sent in turn (``body`` is the first); () when there is only ``body``.
    bodies: tuple[bytes, ...] = field(default=(), repr=False)
    workload: str = "short"
    # Text payloads: every text of the bodies, and MiniLM's mean tokens per request over them.
    texts: tuple[str, ...] = field(default=(), repr=False)
    tokens_per_request: float | None = None

    @property
    def headers(self) -> Mapping[str, str]:
        return {"Content-Type": self.content_type}

    @property
    def all_bodies(self) -> tuple[bytes, ...]:
        return self.bodies or (self.body,)

    def write(self, directory: Path) -> Path:
        """The body in ``directory/<key>.body``, or the bodies one a line in
        ``directory/<key>.bodies`` (created once, reused)."""
        if len(self.all_bodies) > 1:
            path = directory / f"{self.key}{BODIES_SUFFIX}"
            return _write(path, encode_bodies(self.all_bodies))
        return _write(directory / f"{self.key}.body", self.body)

    def write_response(self, directory: Path) -> Path:
        """``response`` in ``directory/<key>.response``, for the no-op server."""
        return _write(directory / f"{self.key}.response", self.response)


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)
    return path


def model_payload(
    model: str,
    inputs_per_request: int,
    encoding_format: str = "float",
    seed: int = 0,
    workload: str = "short",
) -> Payload:
    """The request of ``model`` ("minilm" or "resnet50") with ``inputs_per_request`` inputs;
    ``workload`` "mixed" (text models only) gives MIXED_BODIES bodies of queries or passages."""
    if model not in MODELS:
        raise ValueError(f"model {model!r} is not one of {sorted(MODELS)}")
    if inputs_per_request < 1:
        raise ValueError(f"inputs per request {inputs_per_request} must be >= 1")
    if encoding_format not in ENCODINGS:
        raise ValueError(f"encoding format {encoding_format!r} is not one of {ENCODINGS}")
    if workload not in TEXT_WORKLOADS:
        raise ValueError(f"workload {workload!r} is not one of {TEXT_WORKLOADS}")
    m = MODELS[model]
    n = inputs_per_request
    if workload != "short" and m["kind"] != "embeddings":
        raise ValueError(f"workload {workload!r} is for the text models; {model} takes images")
    if m["kind"] == "embeddings":
        from load_tests.workloads.texts import request_texts, token_counts

        if workload == "mixed":
            requests = request_texts("mixed", MIXED_BODIES, n, seed)
            each = f"{n} queries or {n} passages" if n > 1 else "one query or one passage"
            what = f"{MIXED_BODIES} bodies of {each}"
            key = f"{model}-x{n}-mixed-{encoding_format}"
        else:
            requests = [payloads.texts("short", n, seed)]
            what = f"{n} short text{'s' if n > 1 else ''}"
            key = f"{model}-x{n}-{encoding_format}"
        enc = encoding_format if encoding_format != "float" else None
        bodies = tuple(
            payloads.embeddings_body(t[0] if n == 1 else t, m["model_name"], enc) for t in requests
        )
        texts = tuple(t for r in requests for t in r)
        return Payload(
            key=key,
            model=model,
            inputs_per_request=n,
            path=m["route"],
            content_type="application/json",
            body=bodies[0],
            description=f"{what} as JSON, {encoding_format} out",
            response=embeddings_response(n, encoding_format, m["model_name"], seed),
            bodies=bodies if len(bodies) > 1 else (),
            workload=workload,
            texts=texts,
            tokens_per_request=sum(token_counts(texts)) / len(requests),
        )
    if n == 1:
        blob = payloads.image_bytes(224, "jpeg", seed)
        return Payload(
            key=f"{model}-x1-raw",
            model=model,
            inputs_per_request=1,
            path=m["route"],
            content_type="image/jpeg",
            body=blob,
            description=f"one 224 px JPEG ({len(blob) / 1024:.1f} KiB) as the raw body",
            response=classify_response(1, m["model_name"], seed),
        )
    images = [payloads.image_b64(224, "jpeg", seed + i) for i in range(n)]
    body = payloads.classify_body(images, m["model_name"])
    return Payload(
        key=f"{model}-x{n}-b64",
        model=model,
        inputs_per_request=n,
        path=m["route"],
        content_type="application/json",
        body=body,
        description=f"{n} 224 px JPEGs base64 in JSON ({len(body) / 1024:.0f} KiB)",
        response=classify_response(n, m["model_name"], seed),
    )


def noop_payload() -> Payload:
    """``POST /noop`` with ``{}``: the plain Ray Serve no-op's request."""
    return Payload(
        key="noop",
        model=None,
        inputs_per_request=1,
        path=NOOP_PATH,
        content_type="application/json",
        body=b"{}",
        description="POST {} to the no-op route",
        response=b'{"ok":true}',
    )


def embeddings_response(n: int, encoding_format: str, model_name: str, seed: int = 0) -> bytes:
    """An answer shaped like serve_app's to ``n`` texts: unit float32 vectors written in their
    shortest exact form (or base64 of their little-endian bytes), and the usage counts."""
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        vec = rng.standard_normal(EMBEDDING_DIM).astype(np.float32)
        vec /= np.float32(np.linalg.norm(vec))
        if encoding_format == "base64":
            emb = json.dumps(base64.b64encode(vec.astype("<f4").tobytes()).decode())
        else:  # str() of a numpy float32 is its shortest exact decimal form
            emb = "[" + ",".join(str(v) for v in vec) + "]"
        items.append(f'{{"object":"embedding","index":{i},"embedding":{emb}}}')
    usage = json.dumps({"prompt_tokens": 9 * n, "total_tokens": 9 * n}, separators=(",", ":"))
    text = (
        f'{{"object":"list","data":[{",".join(items)}],"model":{json.dumps(model_name)},'
        f'"usage":{usage}}}'
    )
    return text.encode()


def classify_response(n: int, model_name: str, seed: int = 0) -> bytes:
    """An answer shaped like serve_app's to ``n`` images: the top 5 labels and scores each."""
    rng = np.random.default_rng(seed)
    data = []
    for i in range(n):
        ids = rng.choice(1000, size=TOP_K, replace=False)
        scores = np.sort(rng.random(TOP_K).astype(np.float32))[::-1]
        top = [
            {"label": f"imagenet label {c:03d}", "class_id": int(c), "score": float(sc)}
            for c, sc in zip(ids.tolist(), scores.tolist(), strict=True)
        ]
        data.append({"object": "classification", "index": i, "top_k": top})
    doc = {"object": "list", "model": model_name, "data": data}
    return json.dumps(doc, separators=(",", ":")).encode()
