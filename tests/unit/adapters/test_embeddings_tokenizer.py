"""The embeddings backend reads tokenizer.json with the Rust tokenizers library alone, without
transformers' AutoTokenizer (whose import cost seconds of every replica's start on the H200):
the ids must be the ones AutoTokenizer gives, for the packaged model and the skeleton."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from serve_app.adapters.embeddings.modeldir import (
    MAX_CHARS_PER_TOKEN,
    SKELETON_DIR,
    Tokenization,
    resolve_dir,
)
from serve_app.config.args import parse_args
from serve_app.errors import BadRequest

TEXTS = [
    "Hello, World!",
    "  leading and trailing spaces  ",
    "Ünïcödé àccents, Straße, and 汉字 characters",
    "emoji 🚀 and symbols #$%^&*()",
    "a" * 300,
    "Mixed CASE with numbers 12345 and hyphen-ated words",
    "",
]


@pytest.mark.parametrize("load_format", ["auto", "dummy"])
def test_direct_tokenizer_matches_autotokenizer(load_format: str) -> None:
    args = {"adapter": "embeddings", "load_format": load_format}
    if load_format == "dummy":
        args["model_path"] = str(SKELETON_DIR)
    app_args = parse_args(args)
    tokens = Tokenization(resolve_dir(app_args), app_args)
    reference = AutoTokenizer.from_pretrained(str(tokens.model_dir))
    batch = tokens.encode(TEXTS)  # the batch call replicas make (encode_batch_fast)
    for text, ours in zip(TEXTS, batch, strict=True):
        theirs = reference(text, truncation=False)["input_ids"]
        assert ours == theirs, text
    assert tokens.pad_id == reference.pad_token_id
    assert tokens.cls_id == reference.cls_token_id
    assert tokens.sep_id == reference.sep_token_id


def test_a_text_past_the_character_bound_is_refused_before_tokenizing() -> None:
    app_args = parse_args({"adapter": "embeddings", "max_input_tokens": 16})
    tokens = Tokenization(resolve_dir(app_args), app_args)
    assert tokens.max_chars == 16 * MAX_CHARS_PER_TOKEN

    calls: list[int] = []
    real = tokens.tokenizer

    class Counting:  # the real tokenizer, counted: the refusal must not reach it
        def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> Any:
            calls.append(len(texts))
            return real.encode_batch_fast(texts, add_special_tokens=add_special_tokens)

    tokens.tokenizer = Counting()  # type: ignore[assignment]
    with pytest.raises(BadRequest) as info:
        tokens.encode(["short", "!" * (tokens.max_chars + 1)])
    err = info.value
    assert (err.param, err.code, calls) == ("input[1]", "input_too_long", [])
    assert f"at most {tokens.max_chars} characters" in err.message
    assert "args.max_input_tokens" in err.message
    # at the bound the text is tokenized, and the token limit decides
    with pytest.raises(BadRequest, match="tokens; this model accepts at most 16"):
        tokens.encode(["!" * tokens.max_chars])
    assert calls == [1]
    assert len(tokens.encode(["a few words"])[0]) == 5


def test_the_fast_batch_call_gives_the_ids_and_type_ids_of_the_full_one() -> None:
    """Replicas tokenize with encode_batch_fast, which leaves out the character offsets; the
    ids and type ids, of single texts and of pairs (the reranker's), must be encode_batch's."""
    app_args = parse_args({"adapter": "embeddings", "load_format": "dummy"})
    tok = Tokenization(resolve_dir(app_args), app_args).tokenizer
    pairs = [(TEXTS[i], TEXTS[-1 - i]) for i in range(len(TEXTS))]
    for inputs in (TEXTS, pairs):
        full = tok.encode_batch(inputs, add_special_tokens=True)  # type: ignore[arg-type]
        fast = tok.encode_batch_fast(inputs, add_special_tokens=True)  # type: ignore[arg-type]
        assert [(e.ids, e.type_ids) for e in fast] == [(e.ids, e.type_ids) for e in full]
    assert any(1 in e.type_ids for e in tok.encode_batch_fast(pairs))  # pairs were pairs
