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
    for text in TEXTS:
        ours = tokens.tokenizer.encode(text).ids
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
        def encode_batch(self, texts: list[str], add_special_tokens: bool) -> Any:
            calls.append(len(texts))
            return real.encode_batch(texts, add_special_tokens=add_special_tokens)

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
