"""The wire specs a user model can take by name (``args.wire``): the generic JSON spec, or a
built-in family's (embeddings, rerank, predict). A small mapping meant to grow: each entry makes
the spec for a user model's backend, names the request field its inputs come from (for the 400s
of ``decode_request``), checks each output's shape, and checks the raw inputs its
``example_inputs`` gives. ``serve_app.config.args.WireName`` lists the same names."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from serve_app.adapters.contract import Decoded, WireSpec
from serve_app.adapters.custom.backend import UserModelBackend, UserModelError
from serve_app.config.args import AppArgs
from serve_app.errors import ConfigError

logger = logging.getLogger("serve_app")


@dataclass(frozen=True)
class Wire:
    """How a user model speaks one wire spec.

    Attributes:
        spec: the spec for an application's args and its backend.
        input_field: the request field that holds the inputs.
        output_check: what each output goes through before ``encode`` (its shape check), or
            None.
        example_input: what each of ``example_inputs(n)``'s raw inputs goes through (the
            shape the spec's ``decode`` gives; ValueError naming the shape), or None.
    """

    spec: Callable[[AppArgs, UserModelBackend], WireSpec]
    input_field: str
    output_check: Callable[[UserModelBackend], Callable[[Any], Any]] | None = None
    example_input: Callable[[Any], Any] | None = None


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


def _broken(backend: UserModelBackend, message: str) -> UserModelError:
    """A UserModelError naming the class (HTTP 500), logged under its error id."""
    err = UserModelError(f"{backend.user.path}.predict {message}")
    logger.error("user model broke its contract (error id %s): %s", err.error_id, err)
    return err


def _numbers(output: Any) -> np.ndarray | None:
    """``output`` as a float64 array when it holds finite real numbers only, else None."""
    try:
        arr = np.asarray(output)
    except (TypeError, ValueError):  # ragged nested lists
        return None
    if arr.dtype.kind not in "iuf" or not np.isfinite(arr).all():
        return None
    return arr.astype(np.float64)


class _Identity:
    """What the rerank spec applies to a user model's scores: nothing (they are its own)."""

    activation = "identity"


def _rerank(args: AppArgs, backend: UserModelBackend) -> WireSpec:
    from serve_app.adapters.rerank.spec import RerankSpec

    class UserRerankSpec(RerankSpec):
        """The reranker family's ``/v1/rerank``, over one float per (query, document) pair:
        the scores as the model gives them (``raw_scores`` changes nothing); ``usage`` counts 0
        tokens (serve_app does not know a user model's tokenizer)."""

        def logit(self, output: Any) -> float:
            return float(output)

        def prompt_tokens(self, decoded: Decoded) -> int:
            return 0

    return UserRerankSpec(args, _Identity())


def _score(backend: UserModelBackend) -> Callable[[Any], Any]:
    """Each output one finite float: the pair's score (a number, or a tensor of one)."""

    def check(output: Any) -> float:
        arr = _numbers(output)
        if arr is None or arr.size != 1:
            shape = f"shape {arr.shape}" if arr is not None else _what(output)
            raise _broken(
                backend,
                f"returned an output of {shape} for wire: rerank; each output must be one "
                "finite float, the (query, document) pair's score",
            )
        return float(arr.reshape(()))

    return check


class _Labels:
    """A user model's labels for the text classification spec: its class's ``labels``, else
    ``LABEL_i`` for each score of the outputs seen (``backend.dim``)."""

    def __init__(self, backend: UserModelBackend, given: list[str]):
        self.backend = backend
        self.given = given

    @property
    def labels(self) -> list[str]:
        return self.given or [f"LABEL_{i}" for i in range(self.backend.dim)]


def _labels_of(backend: UserModelBackend) -> list[str]:
    """The instance's ``labels`` (a class attribute or one set in ``__init__``), checked; []
    without one."""
    labels = getattr(backend.model, "labels", None)
    if labels is None:
        return []
    if (
        not isinstance(labels, list | tuple)
        or not labels
        or not all(isinstance(label, str) for label in labels)
    ):
        raise ConfigError(
            f"args.adapter: {backend.user.path}.labels is {_what(labels)}; make it a list of "
            "strings, one label per score its predict returns, or leave it out (LABEL_0, ...) "
            "(see docs/custom-models.md)"
        )
    return list(labels)


def _predict(args: AppArgs, backend: UserModelBackend) -> WireSpec:
    from serve_app.adapters.textclass.spec import PredictSpec

    class UserPredictSpec(PredictSpec):
        """The text classification family's ``/predict`` (TEI's shape), over a list of
        per-label scores per input: the scores as the model gives them (no softmax;
        ``raw_scores`` changes nothing)."""

        def scores(self, logits: Any, raw: bool) -> Any:
            return logits

    labels = _labels_of(backend)
    backend.dim = len(labels)  # the scores each output must have; 0: the first output says
    return UserPredictSpec(args, _Labels(backend, labels), multi_label=False)


def _label_scores(backend: UserModelBackend) -> Callable[[Any], Any]:
    """Each output a vector of finite floats, one per label (all of one length)."""

    def check(output: Any) -> np.ndarray:
        arr = _numbers(output)
        want = backend.dim
        if arr is None or arr.ndim != 1 or not arr.size or (want and arr.size != want):
            shape = f"shape {arr.shape}" if arr is not None else _what(output)
            n = f" ({backend.dim})" if backend.dim else ""
            raise _broken(
                backend,
                f"returned an output of {shape} for wire: predict; each output must be a list "
                f"of finite floats, one score per label{n}",
            )
        backend.dim = backend.dim or int(arr.size)
        return arr.astype(np.float32)

    return check


def _what(value: Any) -> str:
    """A short description of a value that is not what was asked for."""
    return f"a {type(value).__name__} {str(value)[:60]!r}"


def _pair(raw: Any) -> tuple[str, str]:
    """A (query, document) pair: what ``/v1/rerank``'s decode gives the model."""
    if isinstance(raw, list | tuple) and len(raw) == 2 and all(isinstance(t, str) for t in raw):
        return (raw[0], raw[1])
    raise ValueError(f"{_what(raw)} is no (query, document) pair of two strings")


def _text_or_pair(raw: Any) -> str | tuple[str, str]:
    """A text or a pair of texts: what ``/predict``'s decode gives the model."""
    if isinstance(raw, str):
        return raw
    try:
        return _pair(raw)
    except ValueError:
        raise ValueError(f"{_what(raw)} is neither a string nor a pair of two strings") from None


WIRES: dict[str, Wire] = {
    "json": Wire(_json, "inputs"),
    "embeddings": Wire(_embeddings, "input", _vectors),
    "rerank": Wire(_rerank, "documents", _score, _pair),
    "predict": Wire(_predict, "inputs", _label_scores, _text_or_pair),
}
