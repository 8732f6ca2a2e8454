"""The wire specs a user model can take by name (``args.wire``): the generic JSON spec, or a
built-in family's. A small mapping meant to grow: each entry makes the spec for a user model's
backend, and names the request field its inputs come from (for the 400s of ``decode_request``).
``serve_app.config.args.WireName`` lists the same names."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from serve_app.adapters.contract import Decoded, WireSpec
from serve_app.adapters.custom.backend import UserModelBackend, UserModelError
from serve_app.config.args import AppArgs

logger = logging.getLogger("serve_app")


@dataclass(frozen=True)
class Wire:
    """How a user model speaks one wire spec.

    Attributes:
        spec: the spec for an application's args and its backend.
        input_field: the request field that holds the inputs.
        output_check: what each output goes through before ``encode`` (its shape check), or
            None.
    """

    spec: Callable[[AppArgs, UserModelBackend], WireSpec]
    input_field: str
    output_check: Callable[[UserModelBackend], Callable[[Any], Any]] | None = None


def _json(args: AppArgs, backend: UserModelBackend) -> WireSpec:
    from serve_app.adapters.custom.spec import JsonSpec

    return JsonSpec(args, backend.user.input_schema, backend.user.output_schema)


def _embeddings(args: AppArgs, backend: UserModelBackend) -> WireSpec:
    from serve_app.adapters.embeddings.spec import EmbeddingsSpec

    class UserEmbeddingsSpec(EmbeddingsSpec):
        """OpenAI's embeddings wire; ``usage`` counts 0 tokens: serve_app does not know a user
        model's tokenizer."""

        def encode(self, outputs: list[Any], decoded: Decoded) -> dict[str, Any]:
            return super().encode(outputs, Decoded(decoded.inputs, decoded.meta, items=[]))

    return UserEmbeddingsSpec(args, backend)


def _vectors(backend: UserModelBackend) -> Callable[[Any], Any]:
    """Each output a float32 vector, all of one length (the embedding's dimensions)."""

    def check(output: Any) -> np.ndarray:
        vec = np.asarray(output, dtype=np.float32)
        if vec.ndim != 1 or (backend.dim and vec.shape[0] != backend.dim):
            err = UserModelError(
                f"{backend.user.path}.predict returned an output of shape {vec.shape} for "
                f"wire: embeddings; each output must be a vector of one length"
                + (f" ({backend.dim})" if backend.dim else "")
            )
            logger.error("user model broke its contract (error id %s): %s", err.error_id, err)
            raise err
        backend.dim = backend.dim or int(vec.shape[0])
        return vec

    return check


WIRES: dict[str, Wire] = {
    "json": Wire(_json, "inputs"),
    "embeddings": Wire(_embeddings, "input", _vectors),
}
