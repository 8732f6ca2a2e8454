"""``POST /v1/classify``: JPEG or PNG bytes as a raw body (``Content-Type: image/jpeg``, with
``?top_k=``) or base64 in JSON (``{"input": "<base64>" | [...], "top_k": 5}``); the top-k labels
and scores of each image come back. Decoding the images themselves is the backend's ``prepare``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from serve_app.adapters.contract import Decoded
from serve_app.adapters.wire import (
    Operation,
    check_model,
    component_schemas,
    json_content,
    parse_json_object,
    pin_request,
    ref,
    string_list,
)
from serve_app.config.args import AppArgs
from serve_app.errors import BadRequest, UnsupportedMediaType

ROUTE = "/v1/classify"
IMAGE_TYPES = ("image/jpeg", "image/png")


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: str | list[str] = Field(description="Base64 JPEG or PNG image(s)")
    model: str | None = None
    top_k: int = Field(default=5, ge=1, le=1000, description="Labels per image")


class Label(BaseModel):
    label: str
    class_id: int
    score: float


class Classification(BaseModel):
    object: Literal["classification"]
    index: int
    top_k: list[Label]


class ClassifyResponse(BaseModel):
    object: Literal["list"]
    model: str
    data: list[Classification]


class Labels(Protocol):
    def label(self, class_id: int) -> str:
        """A class id's name."""


class ClassifySpec:
    """The wire format of ``/v1/classify``; ``labels`` names the classes."""

    route = ROUTE
    decode_inline = True  # headers and base64 only; the backend says whether images decode inline

    def __init__(self, args: AppArgs, labels: Labels):
        self.args = args
        self.labels = labels

    def decode(self, body: bytes, content_type: str, query: Mapping[str, str]) -> Decoded:
        ctype = content_type.split(";")[0].strip().lower()
        top_k = self.args.top_k
        if ctype in IMAGE_TYPES:
            blobs = [body]
            if "top_k" in query:
                top_k = self._top_k(query["top_k"])
        elif ctype in ("application/json", ""):
            doc = parse_json_object(body)
            check_model(doc, self.args.model_name)
            texts, _ = string_list(doc, "input", self.args.max_inputs_per_request)
            if "top_k" in doc:
                top_k = self._top_k(doc["top_k"])
            blobs = []
            for i, text in enumerate(texts):
                try:
                    blobs.append(base64.b64decode(text, validate=True))
                except (binascii.Error, ValueError):
                    raise BadRequest(
                        f"'input[{i}]' is not valid base64", param=f"input[{i}]"
                    ) from None
        else:
            raise UnsupportedMediaType(
                f"Content-Type {ctype!r} is not supported; send image/jpeg, image/png, or "
                "application/json with base64 images"
            )
        return Decoded(inputs=blobs, meta={"top_k": top_k})

    @staticmethod
    def _top_k(value: Any) -> int:
        # JSON gives an int; a query string gives its digits. Floats and booleans are refused
        # rather than truncated.
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(f"'top_k' must be an integer, got {value!r}", param="top_k")
        if not 1 <= value <= 1000:
            raise BadRequest(f"'top_k' must be between 1 and 1000, got {value}", param="top_k")
        return value

    def encode(self, outputs: list[Any], decoded: Decoded) -> dict[str, Any]:
        k = decoded.meta["top_k"]
        data = []
        for i, (scores, ids) in enumerate(outputs):
            top = [
                {"label": self.labels.label(int(c)), "class_id": int(c), "score": float(s)}
                for s, c in zip(scores[:k], ids[:k], strict=True)
            ]
            data.append({"object": "classification", "index": i, "top_k": top})
        return {"object": "list", "model": self.args.model_name, "data": data}

    def openapi(self, max_body_bytes: int) -> Operation:
        binary = {"schema": {"type": "string", "format": "binary", "maxLength": max_body_bytes}}
        schemas = component_schemas(ClassifyRequest, ClassifyResponse)
        pin_request(
            schemas[ClassifyRequest.__name__],
            self.args.model_name,
            self.args.max_inputs_per_request,
        )
        return Operation(
            operation={
                "summary": "Image classification",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": ref(ClassifyRequest)},
                        "image/jpeg": binary,
                        "image/png": binary,
                    },
                },
                "parameters": [
                    {
                        "name": "top_k",
                        "in": "query",
                        "required": False,
                        "description": "Labels per image, for raw image bodies",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                    }
                ],
                "responses": {"200": {"description": "OK", **json_content(ClassifyResponse)}},
            },
            schemas=schemas,
            error_codes=(400, 404, 413, 415),
        )
