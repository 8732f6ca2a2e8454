"""adapters/text/model.py's other path: architectures serve_app's BERT encoder does not run go
to transformers' AutoModelForSequenceClassification, called the same way (a RoBERTa reranker,
as XLM-RoBERTa rerankers are; a DistilBERT classifier, which takes no segment ids), and score
as sentence-transformers and transformers do on the same weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from serve_app.adapters import rerank, textclass
from serve_app.config.args import parse_args
from tests.fixtures.text_models import TOKENIZER_FILES, minilm_dir

TINY = {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64}
QUERY = "what do cats eat"
DOCS = ["Cats eat meat.", "The stock market fell.", "Kittens need small meals."]


def save(model: torch.nn.Module, path: Path) -> Path:
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(path, safe_serialization=True)  # type: ignore[operator]
    for name in TOKENIZER_FILES:  # MiniLM's vocabulary fits any config of its size
        shutil.copy(minilm_dir() / name, path / name)
    return path


def test_a_roberta_reranker_scores_as_cross_encoder(tmp_path: Path) -> None:
    from sentence_transformers import CrossEncoder
    from transformers import RobertaConfig, RobertaForSequenceClassification

    # two segment types: MiniLM's tokenizer marks a pair's second text as type 1
    cfg = RobertaConfig(
        vocab_size=30522,
        num_hidden_layers=1,
        num_labels=1,
        type_vocab_size=2,
        pad_token_id=0,
        max_position_embeddings=514,
        **TINY,
    )
    path = save(RobertaForSequenceClassification(cfg).eval(), tmp_path / "roberta")
    model = rerank.build(parse_args({"adapter": "rerank", "model_path": str(path)}))
    model.backend.setup(torch.device("cpu"))
    assert model.backend.report()["encoder"] == "transformers"
    decoded = model.decode(json.dumps({"query": QUERY, "documents": DOCS}).encode(), "", {})
    out = model.encode(model.backend.predict(decoded.items), decoded)
    assert isinstance(out, dict)
    expected = CrossEncoder(str(path), device="cpu", local_files_only=True).predict(
        [(QUERY, d) for d in DOCS]
    )
    got = {r["index"]: r["relevance_score"] for r in out["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], expected, atol=1e-5)


def test_a_distilbert_classifier_takes_no_segment_ids(tmp_path: Path) -> None:
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DistilBertConfig,
        DistilBertForSequenceClassification,
    )

    cfg = DistilBertConfig(
        vocab_size=30522,
        n_layers=1,
        dim=32,
        n_heads=2,
        hidden_dim=64,
        id2label={0: "a", 1: "b", 2: "c"},
        label2id={"a": 0, "b": 1, "c": 2},
    )
    path = save(DistilBertForSequenceClassification(cfg).eval(), tmp_path / "distilbert")
    model = textclass.build(parse_args({"adapter": "text-classification", "model_path": str(path)}))
    model.backend.setup(torch.device("cpu"))
    body = {"inputs": [["I like you."], ["A man eats.", "Someone has a meal."]], "raw_scores": True}
    decoded = model.decode(json.dumps(body).encode(), "", {})
    out = model.encode(model.backend.predict(decoded.items), decoded)
    assert isinstance(out, list)
    hf = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    tok = AutoTokenizer.from_pretrained(str(path))
    with torch.no_grad():
        expected = [
            hf(**tok(["I like you."], return_tensors="pt", return_token_type_ids=False)).logits[0],
            hf(
                **tok(
                    ["A man eats."],
                    ["Someone has a meal."],
                    return_tensors="pt",
                    return_token_type_ids=False,
                )
            ).logits[0],
        ]
    for row, want in zip(out, expected, strict=True):
        got = {p["label"]: p["score"] for p in row}
        np.testing.assert_allclose([got[n] for n in "abc"], want.numpy(), atol=1e-4)


def test_dummy_weights_of_another_architecture(tmp_path: Path) -> None:
    from transformers import DistilBertConfig

    path = tmp_path / "dummy"
    path.mkdir()
    DistilBertConfig(
        vocab_size=30522, n_layers=1, dim=32, n_heads=2, hidden_dim=64
    ).save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, path / name)
    args = {"adapter": "text-classification", "model_path": str(path), "load_format": "dummy"}
    model = textclass.build(parse_args(args))
    model.backend.setup(torch.device("cpu"))
    logits = model.backend.predict(model.backend.worst_case_items(2))
    # a config that names no labels: transformers' two for a classifier, one for a reranker
    assert [x.shape for x in logits] == [(2,), (2,)]
    reranker = rerank.build(parse_args({**args, "adapter": "rerank"}))
    reranker.backend.setup(torch.device("cpu"))
    assert [x.shape for x in reranker.backend.predict(reranker.backend.worst_case_items(1))] == [
        (1,)
    ]
