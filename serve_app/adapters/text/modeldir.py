"""A sequence-classification model directory (a sentence-transformers CrossEncoder, or any
transformers ``*ForSequenceClassification`` save): where it is, its labels, and the activation
its scores get. Tokenizing texts and pairs, with their segment ids, is here too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from serve_app.adapters.embeddings.modeldir import (
    SKELETON_DIR,
    Tokenization,
    default_model_dir,
    read_json,
)
from serve_app.config.args import AppArgs
from serve_app.errors import BadRequest, ConfigError

Task = Literal["rerank", "text-classification"]
Activation = Literal["sigmoid", "identity"]
# CrossEncoder's activation_fn, as its directories name it (config_sentence_transformers.json or
# config.json's "sentence_transformers"): the ones a reranker's scores may get here.
ACTIVATIONS: dict[str, Activation] = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.Identity": "identity",
}


class Tokens(NamedTuple):
    """A prepared item: token ids and their segment (token type) ids."""

    ids: list[int]
    types: list[int]


def _labels(config: dict[str, Any], task: Task) -> list[str]:
    """The class names by id, as transformers' PretrainedConfig reads them: id2label, else
    num_labels of LABEL_i, else (transformers' default) 2; a reranker's default is 1."""
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            by_id = {int(k): str(v) for k, v in id2label.items()}
        except ValueError:
            raise ConfigError(
                "args.model_path: config.json's id2label has a key that is not an integer; "
                "fix the model directory's config.json"
            ) from None
        if sorted(by_id) != list(range(len(by_id))):
            raise ConfigError(
                f"args.model_path: config.json's id2label ids are {sorted(by_id)}, not 0 to "
                f"{len(by_id) - 1}; fix the model directory's config.json"
            )
        return [by_id[i] for i in range(len(by_id))]
    n = int(config.get("num_labels") or (1 if task == "rerank" else 2))
    return [f"LABEL_{i}" for i in range(n)]


def _activation(model_dir: Path, config: dict[str, Any]) -> Activation:
    """The activation CrossEncoder.predict gives a reranker's logit (sigmoid by default)."""
    st = read_json(model_dir / "config_sentence_transformers.json")
    name = (
        st.get("activation_fn")
        or (config.get("sentence_transformers") or {}).get("activation_fn")
        or config.get("sbert_ce_default_activation_function")
        or "torch.nn.modules.activation.Sigmoid"
    )
    if name not in ACTIVATIONS:
        raise ConfigError(
            f"args.model_path: the CrossEncoder's activation_fn is {name!r}; serve_app applies "
            f"one of {sorted(ACTIVATIONS)}: save the model with one of them"
        )
    return ACTIVATIONS[name]


@dataclass(frozen=True)
class ClassifierDir:
    """What a sequence classifier's directory says before any weights load.

    Attributes:
        path: the directory (its tokenizer, and its weights unless load_format is dummy).
        config: config.json, with the labels a dummy model gets when it has none.
        labels: class names by id (a reranker has one).
        activation: what a reranker's scores get unless raw scores are asked for.
        multi_label: config.json's problem_type is multi_label_classification (each label's
            score is its own sigmoid, as transformers' pipeline gives them).
    """

    path: Path
    config: dict[str, Any]
    labels: list[str]
    activation: Activation
    multi_label: bool

    @classmethod
    def read(cls, args: AppArgs, task: Task) -> ClassifierDir:
        """``args.model_path``; with load_format dummy and no path, the packaged MiniLM's
        architecture and tokenizer (the skeleton where it is not installed).

        Raises:
            ConfigError: no directory, no config.json, or a reranker with more than one label.
        """
        if args.model_path:
            path = Path(args.model_path)
            if not path.is_dir():
                raise ConfigError(
                    f"args.model_path: {str(path)!r} is not a directory; point it at a "
                    f"{_WHAT[task]} directory"
                )
        elif args.load_format == "dummy":
            path = default_model_dir() or SKELETON_DIR
        else:
            raise ConfigError(
                f"args.model_path: not set; adapter {task} needs a {_WHAT[task]} directory "
                "(or load_format: dummy for random weights)"
            )
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ConfigError(
                f"args.model_path: {str(path)!r} has no config.json; point it at a "
                f"{_WHAT[task]} directory"
            )
        config = json.loads(config_path.read_text())
        labels = _labels(config, task)
        if task == "rerank" and len(labels) != 1:
            raise ConfigError(
                f"args.model_path: {str(path)!r} is a classifier of {len(labels)} labels; a "
                "reranker (CrossEncoder) has one: use adapter: text-classification for it"
            )
        config = {**config, "id2label": dict(enumerate(labels)), "num_labels": len(labels)}
        return cls(
            path=path,
            config=config,
            labels=labels,
            activation=_activation(path, config) if task == "rerank" else "identity",
            multi_label=config.get("problem_type") == "multi_label_classification",
        )


_WHAT: dict[Task, str] = {
    "rerank": "sentence-transformers CrossEncoder (one-label sequence classification)",
    "text-classification": "sequence classification model",
}


class PairTokenization(Tokenization):
    """The directory's tokenizer for texts and text pairs, with segment ids; no truncation (a
    too-long input gets a 400 naming it). ``max_tokens`` is at most the model's positions."""

    def __init__(
        self, model_dir: Path, args: AppArgs, max_positions: int, field: str, pair_note: str
    ):
        super().__init__(model_dir, args)
        self.max_tokens = min(self.max_tokens, max_positions)
        self.field = field  # what a too-long input is called: "documents", "inputs"
        self.pair_note = pair_note  # what a pair's length counts: " with the query"

    def encode_items(self, inputs: list[str | tuple[str, str]]) -> list[Tokens]:
        """Tokens of each text or pair (special tokens added, as the model was trained).

        Raises:
            BadRequest: an input is longer than ``max_tokens`` (code ``input_too_long``).
        """
        encoded = self.tokenizer.encode_batch_fast(inputs, add_special_tokens=True)
        for i, enc in enumerate(encoded):
            if len(enc.ids) > self.max_tokens:
                what = self.pair_note if isinstance(inputs[i], tuple) else ""
                raise BadRequest(
                    f"'{self.field}[{i}]'{what} is {len(enc.ids)} tokens; this model accepts "
                    f"at most {self.max_tokens} (args.max_input_tokens): shorten or split it",
                    param=f"{self.field}[{i}]",
                    code="input_too_long",
                )
        return [Tokens(enc.ids, enc.type_ids) for enc in encoded]
