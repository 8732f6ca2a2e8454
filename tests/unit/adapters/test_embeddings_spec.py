"""The embeddings model end to end without Ray: the wire spec's decode and validation, the
backend's tokenizing (real tokenizer), predict against sentence-transformers, encode."""

from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
import pytest

from serve_app.adapters.contract import Model
from serve_app.adapters.embeddings import build
from serve_app.adapters.embeddings.backend import SentenceEncoder
from serve_app.adapters.embeddings.modeldir import SKELETON_DIR
from serve_app.adapters.embeddings.spec import is_token_ids
from serve_app.adapters.wire import check_model, parse_json_object, string_list
from serve_app.config.args import parse_args
from serve_app.errors import BadRequest, ConfigError, ItemError, NotFound, ServeAppError


@pytest.fixture(scope="module")
def model() -> Model:
    return build(parse_args({"max_inputs_per_request": 4}))


def body(doc: object) -> bytes:
    return json.dumps(doc).encode()


def test_decode_leaves_tokenizing_to_the_batch(model: Model) -> None:
    decoded = model.decode(body({"input": ["hello world", "hi"]}), "application/json", {})
    assert decoded.inputs == ["hello world", "hi"]
    assert [(it.text, it.index, it.ids) for it in decoded.items] == [
        ("hello world", 0, None),
        ("hi", 1, None),
    ]
    assert decoded.meta == {"format": "float"}
    # the batch tokenizes them all in one call, with the ids the tokenizer gives one by one
    assert model.backend.tokens.tokenize(decoded.items) == {}
    assert [it.ids for it in decoded.items] == [[101, 7592, 2088, 102], [101, 7632, 102]]


def test_the_spec_alone_reads_texts_and_the_backend_prepares(model: Model) -> None:
    decoded = model.spec.decode(body({"input": "hi", "encoding_format": "base64"}), "", {})
    assert (decoded.inputs, decoded.items, decoded.meta) == (["hi"], [], {"format": "base64"})
    (item,) = model.backend.prepare(["hi"])
    assert (item.text, item.estimate, item.ids) == ("hi", 3, None)


def test_a_text_over_the_token_limit_fails_alone_in_its_batch(model: Model) -> None:
    backend = model.backend
    assert isinstance(backend, SentenceEncoder)
    backend.setup(__import__("torch").device("cpu"))
    items = backend.prepare(["fine", "word " * 300, "also fine"])
    out = backend.predict(items)
    assert isinstance(out[1], ItemError) and out[1].index == 1
    assert "at most 256" in out[1].error.message and out[1].error.param == "input[1]"
    assert out[1].error.code == "input_too_long" and out[1].error.status_code == 400
    alone = backend.predict(backend.prepare(["fine", "also fine"]))
    np.testing.assert_allclose(np.stack([out[0], out[2]]), np.stack(alone), atol=1e-6)


@pytest.mark.parametrize(
    ("raw", "exc", "needle"),
    [
        (b"", BadRequest, "empty"),
        (b"{", BadRequest, "not valid JSON"),
        (b"\xff\xfe", BadRequest, "not valid JSON"),
        (b'"text"', BadRequest, "JSON object"),
        (body({"input": None}), BadRequest, "string or a list"),
        (body({"input": []}), BadRequest, "empty list"),
        (body({"input": ["a", {"b": 1}]}), BadRequest, "input[1]"),
        (body({"input": [101, 7592, 102]}), BadRequest, "token ids"),
        (body({"input": [[101, 102], [101, 7592, 102]]}), BadRequest, "check_embedding_ctx_length"),
        (body({"input": ["a", 7]}), BadRequest, "'input[1]' must be a string"),
        (body({"input": ["a"] * 5}), BadRequest, "at most 4"),
        (body({"input": "a", "model": 3}), BadRequest, "'model' must be a string"),
        (body({"input": "a", "model": "other"}), NotFound, "GET /v1/models"),
        (body({"input": "a", "dimensions": 128}), BadRequest, "dimensions"),
        (body({"input": "!" * 8193}), BadRequest, "at most 256 tokens"),
    ],
)
def test_bad_requests(model: Model, raw: bytes, exc: type, needle: str) -> None:
    with pytest.raises(exc) as info:
        model.decode(raw, "application/json", {})
    assert needle in info.value.message
    assert info.value.to_json()["error"]["type"] == exc.error_type


@pytest.mark.parametrize(
    ("value", "ids"),
    [
        ([1, 2], True),
        ([[1], [2, 3]], True),
        ([], False),
        ([[]], False),
        ([True], False),
        ([1, "a"], False),
        ([[1], "a"], False),
        ("12", False),
        (None, False),
    ],
)
def test_token_ids_are_told_apart_from_texts(value: object, ids: bool) -> None:
    assert is_token_ids(value) is ids


def test_token_ids_get_their_own_code(model: Model) -> None:
    with pytest.raises(BadRequest) as info:
        model.decode(body({"input": [[101, 102]]}), "application/json", {})
    assert (info.value.code, info.value.param) == ("token_ids_not_supported", "input")


def test_status_codes() -> None:
    assert BadRequest("x").status_code == 400 and NotFound("x").status_code == 404


def test_predict_matches_sentence_transformers(model: Model) -> None:
    from sentence_transformers import SentenceTransformer

    backend = model.backend
    assert isinstance(backend, SentenceEncoder)
    backend.setup(__import__("torch").device("cpu"))
    texts = ["The cat sat on the mat.", "A completely different sentence, longer than one."]
    decoded = model.decode(body({"input": texts}), "application/json", {})
    ours = np.stack(backend.predict(decoded.items))
    st = SentenceTransformer(str(backend.model_dir), device="cpu")
    np.testing.assert_allclose(ours, st.encode(texts), atol=1e-5)
    out = model.encode(backend.predict(decoded.items), decoded)
    assert [d["index"] for d in out["data"]] == [0, 1]
    tokens = int(st.tokenize(texts)["attention_mask"].sum())  # sentence-transformers' own count
    assert (
        out["usage"]
        == {"prompt_tokens": tokens, "total_tokens": tokens}
        == {
            "prompt_tokens": 20,
            "total_tokens": 20,
        }
    )


def test_dummy_load_format_uses_real_architecture() -> None:
    dummy = SentenceEncoder(parse_args({"load_format": "dummy", "model_path": str(SKELETON_DIR)}))
    dummy.setup(__import__("torch").device("cpu"))
    assert dummy.dim == 384
    vecs = dummy.predict(dummy.worst_case_items(2))
    assert len(vecs) == 2 and vecs[0].shape == (384,)
    assert len(dummy.worst_case_items(1)[0]) == dummy.max_tokens == 256


def test_model_path_must_be_a_directory(tmp_path) -> None:
    with pytest.raises(ConfigError, match="args.model_path"):
        SentenceEncoder(parse_args({"model_path": str(tmp_path / "missing")}))


def test_wire_helpers() -> None:
    assert parse_json_object(b'{"a": 1}') == {"a": 1}
    assert string_list({"input": "one"}, "input", 3) == (["one"], True)
    check_model({"input": "x"}, "m")  # no model field: accepted


def test_internal_failure_is_500_with_error_id(caplog: pytest.LogCaptureFixture) -> None:
    from serve_app.serving.http import guarded

    async def boom():
        raise RuntimeError("secret internal detail")

    async def bad():
        raise BadRequest("nope")

    with caplog.at_level(logging.ERROR, logger="serve_app"):
        resp = asyncio.run(guarded(boom()))
    doc = json.loads(resp.body)
    assert resp.status_code == 500
    assert doc["error"]["type"] == "inference_error" and "error id" in doc["error"]["message"]
    assert "secret internal detail" not in resp.body.decode()
    error_id = doc["error"]["message"].split("error id ")[1].split(" ")[0]
    assert error_id in caplog.text and "secret internal detail" in caplog.text
    assert asyncio.run(guarded(bad())).status_code == 400
    assert issubclass(BadRequest, ServeAppError)


def test_batch_tokenizing_equals_the_per_request_path(model: Model) -> None:
    texts = ["hello world", "hi", "naïve café — 東京", "x" * 300, "  spaced   out  ", ""]
    tokens = model.backend.tokens
    items = model.backend.prepare(texts)
    assert tokens.tokenize(items) == {}
    assert [it.ids for it in items] == tokens.encode(texts)  # the path it replaced
