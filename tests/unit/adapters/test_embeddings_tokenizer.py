"""The embeddings backend reads tokenizer.json with the Rust tokenizers library alone, without
transformers' AutoTokenizer (whose import cost seconds of every replica's start on the H200):
the ids must be the ones AutoTokenizer gives, for the packaged model and the skeleton."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from serve_app.adapters.embeddings.modeldir import SKELETON_DIR, Tokenization, resolve_dir
from serve_app.config.args import parse_args

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
