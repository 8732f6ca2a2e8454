"""Sequence classification over serve_app's BERT encoder (embeddings/bert.py), with
transformers' module names, so that BertForSequenceClassification checkpoints (CrossEncoders
among them) load as they are; transformers' AutoModelForSequenceClassification runs what the
encoder does not (XLM-RoBERTa rerankers, DistilBERT classifiers). Both are called alike:
(ids, mask, segment ids) -> logits."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from torch.nn.attention import sdpa_kernel

from serve_app.adapters.embeddings import bert
from serve_app.errors import ConfigError

# The head's keys in a BertForSequenceClassification state dict, and this module's names.
HEAD_KEYS = {
    "bert.pooler.dense.weight": "pooler.weight",
    "bert.pooler.dense.bias": "pooler.bias",
    "classifier.weight": "classifier.weight",
    "classifier.bias": "classifier.bias",
}


class BertClassifier(nn.Module):
    """BertForSequenceClassification at inference: the encoder, its pooler (dense and tanh over
    the first token) and the classifier (dropout is off at inference)."""

    def __init__(self, cfg: bert.BertConfig, num_labels: int):
        super().__init__()
        self.bert = bert.BertEncoder(cfg)
        self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(ids, mask, types)
        return self.classifier(torch.tanh(self.pooler(hidden[:, 0])))

    def init_random(self) -> None:
        """BertForSequenceClassification's initialisation (load_format: dummy)."""
        self.bert.init_random()
        std = self.bert.config.initializer_range
        with torch.no_grad():
            for lin in (self.pooler, self.classifier):
                lin.weight.normal_(0.0, std)
                lin.bias.zero_()

    def load_checkpoint(self, state: dict[str, torch.Tensor], source: str) -> None:
        """A BertForSequenceClassification state dict (built on the meta device, the module
        takes the tensors themselves).

        Raises:
            ConfigError: the head or an encoder weight is missing or of the wrong shape.
        """
        head = {ours: state[key] for key, ours in HEAD_KEYS.items() if key in state}
        missing = sorted(k for k, ours in HEAD_KEYS.items() if ours not in head)
        wanted = {n: p.shape for n, p in self.named_parameters() if n in HEAD_KEYS.values()}
        shapes = [
            f"{n} {tuple(t.shape)} != {tuple(wanted[n])}"
            for n, t in head.items()
            if t.shape != wanted[n]
        ]
        if missing or shapes:
            raise ConfigError(
                f"args.model_path: the weights in {source!r} are not a sequence classifier of "
                f"its config.json's {self.classifier.out_features} label(s): missing {missing}, "
                f"shapes {shapes}; point model_path at a CrossEncoder or "
                "*ForSequenceClassification directory"
            )
        encoder = {k: v for k, v in state.items() if k not in HEAD_KEYS}
        self.bert.load_checkpoint(encoder, source)
        for name, tensor in head.items():
            module, attr = name.split(".")
            setattr(getattr(self, module), attr, nn.Parameter(tensor, requires_grad=False))


class HFClassifier(nn.Module):
    """transformers' AutoModelForSequenceClassification called as BertClassifier is."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        # DistilBERT and others take no segment ids.
        self.takes_types = "token_type_ids" in inspect.signature(inner.forward).parameters

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        extra: dict[str, Any] = {"token_type_ids": types.long()} if self.takes_types else {}
        with sdpa_kernel(bert.ATTENTION_BACKENDS):  # no cuDNN attention: see bert.py
            out: torch.Tensor = self.inner(input_ids=ids, attention_mask=mask, **extra).logits
        return out
