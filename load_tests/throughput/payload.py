"""The request each setup is loaded with, written to a file that wrk and the open-loop client
both read (so both send the same bytes).

MiniLM: short texts (3 to 8 words, load_tests.payloads), one or N per request as JSON, floats in
the answer by default or ``encoding_format: base64``. ResNet-50: one 224 px JPEG (about 17 KiB)
as the raw body (``Content-Type: image/jpeg``), or N of them base64 in JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from load_tests import payloads
from load_tests.side_by_side.constants import MODELS

ENCODINGS: tuple[str, ...] = ("float", "base64")
NOOP_PATH = "/noop"


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

    @property
    def headers(self) -> Mapping[str, str]:
        return {"Content-Type": self.content_type}

    def write(self, directory: Path) -> Path:
        """The body in ``directory/<key>.body`` (created once, reused)."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.key}.body"
        if not path.is_file() or path.read_bytes() != self.body:
            path.write_bytes(self.body)
        return path


def model_payload(
    model: str, inputs_per_request: int, encoding_format: str = "float", seed: int = 0
) -> Payload:
    """The request of ``model`` ("minilm" or "resnet50") with ``inputs_per_request`` inputs."""
    if model not in MODELS:
        raise ValueError(f"model {model!r} is not one of {sorted(MODELS)}")
    if inputs_per_request < 1:
        raise ValueError(f"inputs per request {inputs_per_request} must be >= 1")
    if encoding_format not in ENCODINGS:
        raise ValueError(f"encoding format {encoding_format!r} is not one of {ENCODINGS}")
    m = MODELS[model]
    n = inputs_per_request
    if m["kind"] == "embeddings":
        texts = payloads.texts("short", n, seed)
        enc = encoding_format if encoding_format != "float" else None
        body = payloads.embeddings_body(texts[0] if n == 1 else texts, m["model_name"], enc)
        return Payload(
            key=f"{model}-x{n}-{encoding_format}",
            model=model,
            inputs_per_request=n,
            path=m["route"],
            content_type="application/json",
            body=body,
            description=f"{n} short text{'s' if n > 1 else ''} as JSON, {encoding_format} out",
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
    )
