"""``POST /predict`` in text-embeddings-inference's shape: ``inputs`` is a text, a sequence (a
list of one text, or of two: a pair), or a batch of sequences (``[["a"], ["b", "c"]]``); each
input gets every label (or the ``top_k`` best) with its score, highest first. A single input's
answer is a list of predictions, a batch's a list of those. Tokenizing is the backend's
``prepare``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, RootModel

from serve_app.adapters.contract import Decoded
from serve_app.adapters.text.fields import boolean, integer, model_schema, no_truncation
from serve_app.adapters.wire import (
    Operation,
    check_model,
    component_schemas,
    json_content,
    parse_json_object,
)
from serve_app.config.args import AppArgs
from serve_app.errors import BadRequest

ROUTE = "/predict"
MAX_TOP_K = 1000
SEQUENCE = (
    "a sequence is a list of one string or of two (a pair); a batch is a list of sequences, "
    'e.g. [["text"], ["premise", "hypothesis"]]'
)


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    inputs: str | list[str] | list[list[str]] = Field(
        description="A text, a sequence ([text] or a pair [a, b]), or a batch of sequences"
    )
    model: str | None = Field(default=None, description="Must name the served model if given")
    raw_scores: bool = Field(
        default=False,
        description="The logits; otherwise a softmax over the labels (a sigmoid for one label, "
        "or for each label of a multi-label model)",
    )
    top_k: int | None = Field(default=None, description="Labels per input (default: all)")
    truncate: Literal[False] = Field(default=False, description="Only false: never truncated")


class Prediction(BaseModel):
    score: float
    label: str


class PredictResponse(RootModel[list[Prediction] | list[list[Prediction]]]):
    """One input: its predictions, highest score first; a batch: a list of those."""


class Labelled(Protocol):
    @property
    def labels(self) -> list[str]:
        """Class names by id."""


class PredictSpec:
    """The wire format of ``/predict``; ``model`` names the labels and how scores are made."""

    route = ROUTE
    decode_inline = True

    def __init__(self, args: AppArgs, model: Labelled, multi_label: bool):
        self.args = args
        self.model = model
        self.multi_label = multi_label

    def decode(self, body: bytes, content_type: str, query: Mapping[str, str]) -> Decoded:
        doc = parse_json_object(body)
        check_model(doc, self.args.model_name)
        no_truncation(doc)
        inputs, single = self._inputs(doc)
        meta = {
            "single": single,
            "raw": boolean(doc, "raw_scores"),
            "top_k": integer(doc, "top_k", 1, MAX_TOP_K),
        }
        return Decoded(inputs=inputs, meta=meta)

    def _inputs(self, doc: dict[str, Any]) -> tuple[list[str | tuple[str, str]], bool]:
        """The texts and pairs of ``inputs``, and whether it was a single input."""
        if "inputs" not in doc:
            raise BadRequest("'inputs' is required", param="inputs")
        value = doc["inputs"]
        if isinstance(value, str):
            return [value], True
        if not isinstance(value, list) or not value:
            raise BadRequest(
                f"'inputs' must be a string, a sequence or a batch of sequences; {SEQUENCE}",
                param="inputs",
            )
        if not isinstance(value[0], list):  # one sequence, as TEI reads a list of strings
            return [self._sequence(value, "inputs")], True
        limit = self.args.max_inputs_per_request
        if len(value) > limit:
            raise BadRequest(
                f"'inputs' has {len(value)} sequences; at most {limit} per request "
                "(args.max_inputs_per_request)",
                param="inputs",
                code="too_many_inputs",
            )
        return [self._sequence(seq, f"inputs[{i}]") for i, seq in enumerate(value)], False

    @staticmethod
    def _sequence(seq: Any, name: str) -> str | tuple[str, str]:
        """A text or a pair from a list of one or two strings."""
        if not isinstance(seq, list) or not 1 <= len(seq) <= 2:
            got = f"{len(seq)} items" if isinstance(seq, list) else type(seq).__name__
            raise BadRequest(
                f"'{name}' must be a list of one or two strings, got {got}; {SEQUENCE}",
                param=name,
                code="wrong_arity" if isinstance(seq, list) else None,
            )
        for j, text in enumerate(seq):
            if not isinstance(text, str):
                raise BadRequest(
                    f"'{name}[{j}]' must be a string, got {type(text).__name__}; {SEQUENCE}",
                    param=f"{name}[{j}]",
                )
        return seq[0] if len(seq) == 1 else (seq[0], seq[1])

    def scores(self, logits: torch.Tensor, raw: bool) -> torch.Tensor:
        """Logits (inputs x labels) -> scores: TEI's softmax over the labels (a sigmoid for a
        single label), each label's own sigmoid for a multi-label model."""
        if raw:
            return logits
        if self.multi_label or logits.shape[1] == 1:
            return torch.sigmoid(logits)
        return torch.softmax(logits, dim=1)

    def encode(self, outputs: list[Any], decoded: Decoded) -> dict[str, Any] | list[Any]:
        logits = torch.from_numpy(np.stack(outputs).astype(np.float32, copy=False))
        scores = self.scores(logits, decoded.meta["raw"])
        labels = self.model.labels
        k = decoded.meta["top_k"] or len(labels)
        values, ids = torch.sort(scores, dim=1, descending=True, stable=True)
        answers = [
            [
                {"score": float(s), "label": labels[int(c)]}
                for s, c in zip(row_s[:k], row_c[:k], strict=True)
            ]
            for row_s, row_c in zip(values, ids, strict=True)
        ]
        return answers[0] if decoded.meta["single"] else answers

    def openapi(self, max_body_bytes: int) -> Operation:
        schemas = component_schemas(PredictRequest, PredictResponse)
        props = schemas[PredictRequest.__name__]["properties"]
        sequence = {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2}
        batch = {
            "type": "array",
            "items": sequence,
            "minItems": 1,
            "maxItems": self.args.max_inputs_per_request,
        }
        props["inputs"]["anyOf"] = [{"type": "string"}, sequence, batch]
        props["model"] = model_schema(self.args.model_name)
        props["top_k"]["anyOf"][0].update(minimum=1, maximum=MAX_TOP_K)
        props["truncate"] = {"const": False, "default": False}
        operation = {
            "summary": "Text classification (TEI's /predict)",
            "requestBody": {"required": True, **json_content(PredictRequest)},
            "responses": {"200": {"description": "OK", **json_content(PredictResponse)}},
        }
        return Operation(operation=operation, schemas=schemas, error_codes=(400, 404, 413))
