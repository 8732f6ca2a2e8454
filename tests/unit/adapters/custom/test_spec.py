"""A user model's wire specs: the generic JSON spec of ``POST /v1/predict`` (its checks and its
OpenAPI schema), and a built-in family's spec by name (``wire: embeddings``)."""

from __future__ import annotations

import base64
from typing import Any, get_args

import numpy as np
import pytest
import torch

from serve_app import adapters
from serve_app.adapters.custom import WIRES, UserModelError
from serve_app.config.args import WireName, parse_args
from serve_app.errors import ServeAppError

HERE = "tests.unit.adapters.custom.user_models"


def model_of(name: str, **args: Any) -> adapters.Model:
    model = adapters.build_model(parse_args({"adapter": f"{HERE}:{name}", **args}))
    model.backend.setup(torch.device("cpu"))
    return model


def test_every_wire_name_the_schema_accepts_has_a_spec() -> None:
    assert set(WIRES) == set(get_args(WireName))


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"", 400, None),
        (b"[1]", 400, None),
        (b"{}", 400, "inputs"),
        (b'{"inputs": 3}', 400, "inputs"),
        (b'{"inputs": []}', 400, "inputs"),
        (b'{"inputs": [1, 2, 3, 4, 5]}', 400, "inputs"),
        (b'{"inputs": [1], "model": "other"}', 404, "model"),
        (b'{"inputs": [1], "model": 7}', 400, "model"),
    ],
)
def test_bad_bodies_get_their_4xx_naming_the_field(body: bytes, status: int, param: Any) -> None:
    spec = model_of("Doubler", max_inputs_per_request=4).spec
    with pytest.raises(ServeAppError) as info:
        spec.decode(body, "application/json", {})
    assert info.value.status_code == status and info.value.param == param


def test_the_openapi_schema_is_narrowed_to_this_application() -> None:
    op = model_of("Doubler", max_inputs_per_request=4, model_name="mine").spec.openapi(1024)
    request = op.schemas["PredictRequest"]
    assert request["required"] == ["inputs"]
    assert request["properties"]["inputs"]["maxItems"] == 4
    assert request["properties"]["model"]["anyOf"][0]["enum"] == ["mine"]
    assert op.schemas["PredictResponse"]["required"] == ["object", "model", "outputs"]
    assert op.operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/PredictRequest"
    )


def test_wire_embeddings_serves_a_user_model_on_the_openai_route() -> None:
    model = model_of("Embedder", wire="embeddings", model_name="bytes")
    assert model.spec.route == "/v1/embeddings"
    decoded = model.decode(b'{"input": ["ab", "ba", "zzz"], "encoding_format": "base64"}', "", {})
    body = model.encode(model.backend.predict(decoded.items), decoded)
    vecs = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in body["data"]]
    assert [v.shape for v in vecs] == [(8,)] * 3
    np.testing.assert_allclose(vecs[0], vecs[1])  # the same bytes, the same vector
    assert abs(float(np.linalg.norm(vecs[2])) - 1.0) < 1e-6
    assert body["usage"] == {"prompt_tokens": 0, "total_tokens": 0}  # no tokenizer known
    assert model.backend.describe()["wire"] == "embeddings"


def test_wire_embeddings_refuses_outputs_of_different_lengths() -> None:
    model = model_of("Ragged", wire="embeddings")
    with pytest.raises(UserModelError) as info:
        model.backend.predict(["a", "abc"])
    assert "Ragged.predict returned an output of shape (4,)" in info.value.message


def test_a_classs_own_schemas_narrow_the_openapi_document() -> None:
    op = model_of("Decoding").spec.openapi(1024)
    inputs = op.schemas["PredictRequest"]["properties"]["inputs"]
    assert inputs["items"] == {"type": "string", "pattern": "^[0-9]{8}$"}
    outputs = op.schemas["PredictResponse"]["properties"]["outputs"]
    assert outputs["items"]["properties"] == {"sum": {"type": "number"}}
    # Without them, any JSON value.
    assert (
        model_of("Doubler")
        .spec.openapi(1024)
        .schemas["PredictRequest"]["properties"]["inputs"]["items"]
        == {}
    )
