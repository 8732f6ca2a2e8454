"""OpenAI-style ``POST /v1/embeddings``: the request and response models, decode and encode.
Texts are validated here (JSON, ``model``, ``input``, ``encoding_format``, ``dimensions``);
tokenizing them, and the per-input token limit, is the backend's ``prepare``."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from serve_app.adapters.contract import Decoded
from serve_app.adapters.wire import (
    Operation,
    check_model,
    json_operation,
    parse_json_object,
    pin_request,
    string_list,
)
from serve_app.config.args import AppArgs
from serve_app.errors import BadRequest

ROUTE = "/v1/embeddings"
# What an embeddings request says about its size before the model is set up (MiniLM's).
DEFAULT_DIMENSIONS = 384
TOKEN_IDS = (
    "'input' holds token ids; this server takes texts only, since ids from another tokenizer "
    "(such as tiktoken's, which LangChain's OpenAIEmbeddings sends unless "
    "check_embedding_ctx_length=False) would embed the wrong words"
)


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: str | list[str] = Field(
        description="A text or a non-empty list of texts (at most args.max_inputs_per_request)"
    )
    model: str | None = Field(default=None, description="Must name the served model if given")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, description="Only the model's own size")


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage


def is_token_ids(value: Any) -> bool:
    """Whether ``value`` is OpenAI's other ``input`` shape: token ids (ints, or lists of them)."""

    def ids(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(_is_int(t) for t in v)

    return ids(value) or (isinstance(value, list) and bool(value) and all(ids(v) for v in value))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class HasDimensions(Protocol):
    dim: int
    """The embedding's size once the model is set up (0 before)."""


class EmbeddingsSpec:
    """The wire format of ``/v1/embeddings``; ``model`` says the embedding's size."""

    route = ROUTE
    decode_inline = True

    def __init__(self, args: AppArgs, model: HasDimensions):
        self.args = args
        self.model = model

    @property
    def dimensions(self) -> int:
        return self.model.dim or DEFAULT_DIMENSIONS

    def decode(self, body: bytes, content_type: str, query: Mapping[str, str]) -> Decoded:
        doc = parse_json_object(body)
        check_model(doc, self.args.model_name)
        if is_token_ids(doc.get("input")):
            raise BadRequest(TOKEN_IDS, param="input", code="token_ids_not_supported")
        texts, _ = string_list(doc, "input", self.args.max_inputs_per_request)
        fmt = doc.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise BadRequest(
                f"'encoding_format' must be 'float' or 'base64', got {fmt!r}",
                param="encoding_format",
            )
        if "dimensions" in doc and doc["dimensions"] not in (None, self.dimensions):
            raise BadRequest(
                f"'dimensions' is not supported: this model returns {self.dimensions}",
                param="dimensions",
            )
        return Decoded(inputs=texts, meta={"format": fmt})

    def encode(self, outputs: list[Any], decoded: Decoded) -> dict[str, Any]:
        """The response body; float vectors stay float32 arrays, which the replica's orjson
        renders in the shortest form that gives back the same float32 values. ``usage`` counts
        the prepared items' tokens."""
        base64_out = decoded.meta["format"] == "base64"
        data = []
        for i, vec in enumerate(outputs):
            emb: Any = base64.b64encode(vec.astype("<f4").tobytes()).decode() if base64_out else vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        tokens = sum(len(item.ids) for item in decoded.items)
        return {
            "object": "list",
            "data": data,
            "model": self.args.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def openapi(self, max_body_bytes: int) -> Operation:
        op = json_operation(
            "OpenAI-style embeddings", EmbeddingsRequest, EmbeddingsResponse, (400, 404, 413)
        )
        pin_request(
            op.schemas[EmbeddingsRequest.__name__],
            self.args.model_name,
            self.args.max_inputs_per_request,
        )
        props = op.schemas[EmbeddingsRequest.__name__]["properties"]
        own = (
            {"type": "integer", "enum": [self.model.dim]} if self.model.dim else {"type": "integer"}
        )
        props["dimensions"]["anyOf"] = [own, {"type": "null"}]
        return op
