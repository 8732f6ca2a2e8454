"""``POST /v1/rerank``: a query and its documents, scored by a cross-encoder, in the Cohere/Jina
shape (``documents``, ``top_n``, ``return_documents``; ``results`` with ``relevance_score``,
``usage``) or in text-embeddings-inference's (``texts``, ``raw_scores``, ``return_text``; a bare
array of ``index``/``score``). Each query-document pair is one batch item; tokenizing the pairs
is the backend's ``prepare``."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field, RootModel

from serve_app.adapters.contract import Decoded
from serve_app.adapters.text.fields import boolean, integer, model_schema, no_truncation
from serve_app.adapters.wire import (
    Operation,
    check_model,
    component_schemas,
    parse_json_object,
    ref,
)
from serve_app.config.args import AppArgs
from serve_app.errors import BadRequest

ROUTE = "/v1/rerank"


class Document(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str


class RerankRequest(BaseModel):
    """Cohere's and Jina's request."""

    model_config = ConfigDict(extra="allow")

    query: str
    documents: list[str | Document] = Field(
        description="Texts, or objects with a 'text' (at most args.max_inputs_per_request)"
    )
    model: str | None = Field(default=None, description="Must name the served model if given")
    top_n: int | None = Field(
        default=None, description="Results to return (default all; more than the documents: all)"
    )
    return_documents: bool = Field(default=False, description="Each result carries its text")
    raw_scores: bool = Field(
        default=False, description="The logits, without the model's activation (a sigmoid)"
    )


class TeiRerankRequest(BaseModel):
    """text-embeddings-inference's ``/rerank`` request."""

    model_config = ConfigDict(extra="allow")

    query: str
    texts: list[str]
    model: str | None = None
    raw_scores: bool = False
    return_text: bool = False
    truncate: Literal[False] = Field(default=False, description="Only false: never truncated")


class ResultDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int = Field(description="The document's position in the request")
    relevance_score: float
    document: ResultDocument | None = Field(default=None, description="With return_documents")


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult] = Field(description="Sorted by relevance_score, highest first")
    usage: RerankUsage


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = Field(default=None, description="With return_text")


class TeiRerankResponse(RootModel[list[TeiRank]]):
    """Sorted by score, highest first."""


class Scored(Protocol):
    @property
    def activation(self) -> str:
        """What a logit becomes unless raw scores are asked for: "sigmoid" or "identity"."""


class RerankSpec:
    """The wire format of ``/v1/rerank``; ``model`` says how logits become scores."""

    route = ROUTE
    decode_inline = True

    def __init__(self, args: AppArgs, model: Scored):
        self.args = args
        self.model = model

    def decode(self, body: bytes, content_type: str, query: Mapping[str, str]) -> Decoded:
        doc = parse_json_object(body)
        check_model(doc, self.args.model_name)
        if "query" not in doc:
            raise BadRequest("'query' is required", param="query")
        if not isinstance(doc["query"], str):
            raise BadRequest(
                f"'query' must be a string, got {type(doc['query']).__name__}", param="query"
            )
        tei = "texts" in doc
        if tei and "documents" in doc:
            raise BadRequest(
                "send either 'documents' (Cohere/Jina) or 'texts' (TEI), not both",
                param="documents",
            )
        limit = self.args.max_inputs_per_request
        meta: dict[str, Any]
        if tei:
            no_truncation(doc)
            texts = self._texts(doc, "texts", limit)
            meta = {"tei": True, "return": boolean(doc, "return_text"), "top_n": None}
        else:
            texts = self._texts(doc, "documents", limit)
            top_n = integer(doc, "top_n", 1, limit)
            meta = {"tei": False, "return": boolean(doc, "return_documents"), "top_n": top_n}
        meta.update(raw=boolean(doc, "raw_scores"), texts=texts)
        return Decoded(inputs=[(doc["query"], t) for t in texts], meta=meta)

    @staticmethod
    def _texts(doc: dict[str, Any], name: str, limit: int) -> list[str]:
        """``doc[name]``: a non-empty list of texts (``documents`` also of {"text": ...})."""
        if name not in doc:
            raise BadRequest(f"'{name}' is required", param=name)
        items = doc[name]
        if not isinstance(items, list):
            raise BadRequest(f"'{name}' must be a list, got {type(items).__name__}", param=name)
        if not items:
            raise BadRequest(f"'{name}' must not be an empty list", param=name)
        if len(items) > limit:
            raise BadRequest(
                f"'{name}' has {len(items)} items; at most {limit} per request "
                "(args.max_inputs_per_request)",
                param=name,
                code="too_many_inputs",
            )
        texts = []
        for i, item in enumerate(items):
            if name == "documents" and isinstance(item, dict):
                item = item.get("text")
            if not isinstance(item, str):
                shape = "a string" + (
                    " or an object with a string 'text'" if name == "documents" else ""
                )
                raise BadRequest(f"'{name}[{i}]' must be {shape}", param=f"{name}[{i}]")
            texts.append(item)
        return texts

    def logit(self, output: Any) -> float:
        """A pair's logit from the backend's output for it: here a one-label classifier's
        logits; a spec over another backend says how its outputs read (a user model's float:
        adapters/custom/wires.py)."""
        return float(output[0])

    def prompt_tokens(self, decoded: Decoded) -> int:
        """``usage``'s tokens: every pair's, the query's in each (the backend's Tokens)."""
        return sum(len(item.ids) for item in decoded.items)

    def scores(self, outputs: list[Any], raw: bool) -> list[float]:
        """Each pair's score: its logit, through the model's activation unless ``raw`` (torch's
        sigmoid, as CrossEncoder.predict applies it)."""
        logits = torch.tensor([self.logit(out) for out in outputs], dtype=torch.float32)
        if not raw and self.model.activation == "sigmoid":
            logits = torch.sigmoid(logits)
        return [float(s) for s in logits]

    def encode(self, outputs: list[Any], decoded: Decoded) -> dict[str, Any] | list[Any]:
        meta = decoded.meta
        scores = self.scores(outputs, meta["raw"])
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties by index
        texts = meta["texts"]
        if meta["tei"]:
            ranks = []
            for i in order:
                rank: dict[str, Any] = {"index": i, "score": scores[i]}
                if meta["return"]:
                    rank["text"] = texts[i]
                ranks.append(rank)
            return ranks
        results = []
        for i in order[: meta["top_n"]]:
            result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
            if meta["return"]:
                result["document"] = {"text": texts[i]}
            results.append(result)
        tokens = self.prompt_tokens(decoded)
        return {
            "id": uuid.uuid4().hex,
            "model": self.args.model_name,
            "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def openapi(self, max_body_bytes: int) -> Operation:
        schemas = component_schemas(
            RerankRequest, TeiRerankRequest, RerankResponse, TeiRerankResponse
        )
        limit = self.args.max_inputs_per_request
        cohere, tei = schemas[RerankRequest.__name__], schemas[TeiRerankRequest.__name__]
        for schema, field, other in ((cohere, "documents", "texts"), (tei, "texts", "documents")):
            schema["properties"][field].update(minItems=1, maxItems=limit)
            schema["properties"]["model"] = model_schema(self.args.model_name)
            schema["not"] = {"required": [other]}  # the two shapes exclude each other
        cohere["properties"]["top_n"]["anyOf"][0].update(minimum=1, maximum=limit)
        tei["properties"]["truncate"] = {"const": False, "default": False}
        request = {"anyOf": [ref(RerankRequest), ref(TeiRerankRequest)]}
        response = {"anyOf": [ref(RerankResponse), ref(TeiRerankResponse)]}
        operation = {
            "summary": "Rerank documents for a query (the Cohere/Jina or the TEI shape)",
            "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": response}}}
            },
        }
        return Operation(operation=operation, schemas=schemas, error_codes=(400, 404, 413))
