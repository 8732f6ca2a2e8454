"""The model contract: the family registry, each family's route, and Model's composition of the
two halves (decode is the spec's, then the backend's prepare; inline only when both are cheap)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from serve_app import adapters
from serve_app.adapters.contract import Decoded, Model
from serve_app.adapters.wire import Operation
from serve_app.config.args import parse_args

FAMILY_ARGS = {
    "embeddings": {"adapter": "embeddings"},
    "image-classification": {"adapter": "image-classification", "load_format": "dummy"},
    "rerank": {"adapter": "rerank", "load_format": "dummy"},
    "text-classification": {"adapter": "text-classification", "load_format": "dummy"},
}


@pytest.mark.parametrize("name", sorted(adapters.FAMILIES))
def test_each_family_builds_a_model_on_its_registered_route(name: str) -> None:
    args = parse_args(FAMILY_ARGS[name])
    model = adapters.build_model(args)
    assert model.spec.route == adapters.ROUTES[name]
    assert model.name == args.model_name
    operation = model.spec.openapi(1024)
    assert "200" in operation.operation["responses"] and operation.schemas
    assert set(operation.error_codes) <= {400, 404, 413, 415}


def test_the_registry_covers_every_adapter_the_schema_accepts() -> None:
    from typing import get_args

    from serve_app.config.args import AdapterKind

    assert set(adapters.FAMILIES) == set(get_args(AdapterKind)) == set(adapters.ROUTES)


class _Spec:
    route = "/v1/x"

    def __init__(self, inline: bool) -> None:
        self.decode_inline = inline

    def decode(self, body: bytes, content_type: str, query: Mapping[str, str]) -> Decoded:
        return Decoded(inputs=body.decode().split(","), meta={"n": 1})

    def encode(self, outputs: list[Any], decoded: Decoded) -> dict[str, Any]:
        return {"out": outputs, "items": decoded.items}

    def openapi(self, max_body_bytes: int) -> Operation:
        return Operation({"responses": {}}, {}, ())


class _Backend:
    graphs = None

    def __init__(self, inline: bool) -> None:
        self.prepare_inline = inline

    def prepare(self, inputs: Sequence[Any]) -> list[Any]:
        return [len(x) for x in inputs]


@pytest.mark.parametrize(("spec", "backend", "inline"), [(1, 1, 1), (1, 0, 0), (0, 1, 0)])
def test_model_decodes_through_both_halves(spec: int, backend: int, inline: int) -> None:
    model = Model("m", _Spec(bool(spec)), _Backend(bool(backend)))  # type: ignore[arg-type]
    decoded = model.decode(b"ab,c", "text/plain", {})
    assert (decoded.inputs, decoded.items, decoded.meta) == (["ab", "c"], [2, 1], {"n": 1})
    assert model.encode(["y", "z"], decoded) == {"out": ["y", "z"], "items": [2, 1]}
    assert model.decode_inline is bool(inline)
