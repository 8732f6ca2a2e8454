"""The generic JSON wire spec of a user model: ``POST /v1/predict``, ``{"inputs": [...]}`` in,
``{"outputs": [...]}`` out, one output per input, in order. An input is any JSON value (the
user's ``decode_request`` may check it); an output is what the user's ``predict`` returned for
it (tensors as nested lists, or through its ``encode_response``). A class's ``input_schema``
and ``output_schema`` (JSON schemas of one of each) narrow the OpenAPI document."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from serve_app.adapters import CUSTOM_ROUTE
from serve_app.adapters.contract import Decoded
from serve_app.adapters.wire import Operation, check_model, json_operation, parse_json_object
from serve_app.config.args import AppArgs
from serve_app.errors import BadRequest

ROUTE = CUSTOM_ROUTE
"""``/v1/predict``; not TEI's ``/predict``, which is the text classification family's."""


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    inputs: list[Any] = Field(
        description="The inputs, any JSON values the model takes (at most "
        "args.max_inputs_per_request); one output each"
    )
    model: str | None = Field(default=None, description="Must name the served model if given")


class PredictResponse(BaseModel):
    object: Literal["list"]
    model: str
    outputs: list[Any] = Field(description="One output per input, in order")


class JsonSpec:
    """``POST /v1/predict`` for a user model."""

    route = ROUTE
    decode_inline = True  # orjson and a length check; the user's decode_request is prepare's

    def __init__(
        self,
        args: AppArgs,
        input_schema: dict[str, Any] | None = None,
        output_schema: dict[str, Any] | None = None,
    ):
        self.args = args
        self.input_schema = input_schema
        self.output_schema = output_schema

    def decode(self, body: bytes, content_type: str, query: Mapping[str, str]) -> Decoded:
        doc = parse_json_object(body)
        check_model(doc, self.args.model_name)
        if "inputs" not in doc:
            raise BadRequest("'inputs' is required: a list of the model's inputs", param="inputs")
        inputs = doc["inputs"]
        if not isinstance(inputs, list):
            raise BadRequest(
                f"'inputs' must be a list (one entry per input), got {type(inputs).__name__}",
                param="inputs",
            )
        if not inputs:
            raise BadRequest("'inputs' must not be an empty list", param="inputs")
        most = self.args.max_inputs_per_request
        if len(inputs) > most:
            raise BadRequest(
                f"'inputs' has {len(inputs)} items; at most {most} per request "
                "(args.max_inputs_per_request)",
                param="inputs",
                code="too_many_inputs",
            )
        return Decoded(inputs=inputs)

    def encode(self, outputs: list[Any], decoded: Decoded) -> dict[str, Any]:
        return {"object": "list", "model": self.args.model_name, "outputs": outputs}

    def openapi(self, max_body_bytes: int) -> Operation:
        op = json_operation(
            "A user model's predictions (docs/custom-models.md)",
            PredictRequest,
            PredictResponse,
            (400, 404, 413),
        )
        props = op.schemas[PredictRequest.__name__]["properties"]
        props["model"]["anyOf"] = [
            {"type": "string", "enum": [self.args.model_name]},
            {"type": "null"},
        ]
        props["inputs"].update({"minItems": 1, "maxItems": self.args.max_inputs_per_request})
        if self.input_schema is not None:  # the class's own (docs/custom-models.md)
            props["inputs"]["items"] = self.input_schema
        if self.output_schema is not None:
            response = op.schemas[PredictResponse.__name__]["properties"]
            response["outputs"]["items"] = self.output_schema
        return op
