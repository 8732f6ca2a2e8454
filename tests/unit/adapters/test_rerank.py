"""The reranker end to end without Ray, on a random-weight CrossEncoder directory built from the
packaged MiniLM's config (tests/fixtures/text_models.py): scores against sentence-transformers'
CrossEncoder.predict on the same weights, the two request shapes, and every refused request."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from serve_app.adapters import rerank
from serve_app.adapters.contract import Model
from serve_app.config.args import parse_args
from serve_app.errors import BadRequest, ConfigError, ItemError, NotFound
from tests.fixtures.text_models import classifier_dir

# float32 on the CPU, two implementations of the same arithmetic (serve_app's BERT and
# transformers' BertForSequenceClassification): measured differences are about 1e-6.
SCORE_ATOL = 1e-5
QUERY = "what do cats eat"
DOCS = [
    "Cats are obligate carnivores and eat mostly meat.",
    "The stock market fell sharply on Tuesday.",
    "Kittens need several small meals a day.",
    "",
    "A recipe for vegetable soup, with carrots, leeks and potatoes.",
]


@pytest.fixture(scope="module")
def ce_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # MiniLM's config with three of its six layers: the same arithmetic, half the CPU time
    return classifier_dir(tmp_path_factory.mktemp("ce") / "cross-encoder", layers=3)


@pytest.fixture(scope="module")
def model(ce_dir: Path) -> Model:
    args = {"adapter": "rerank", "model_path": str(ce_dir), "max_inputs_per_request": 8}
    built = rerank.build(parse_args(args))
    built.backend.setup(torch.device("cpu"))
    return built


def run(model: Model, doc: dict) -> dict | list:
    decoded = model.decode(json.dumps(doc).encode(), "application/json", {})
    return model.encode(model.backend.predict(decoded.items), decoded)


@functools.cache
def cross_encoder(path: Path):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(path), device="cpu", local_files_only=True)


def test_scores_equal_cross_encoder_predict(model: Model, ce_dir: Path) -> None:
    out = run(model, {"query": QUERY, "documents": DOCS, "model": "all-MiniLM-L6-v2"})
    assert isinstance(out, dict)
    expected = cross_encoder(ce_dir).predict([(QUERY, d) for d in DOCS])
    assert len(set(np.round(expected, 3))) == len(DOCS)  # the weights tell pairs apart
    results = out["results"]
    assert [r["index"] for r in results] == list(np.argsort(-expected, kind="stable"))
    got = np.array([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
    np.testing.assert_allclose(got, expected, atol=SCORE_ATOL)
    assert all("document" not in r for r in results)
    # usage counts every pair's tokens, the query's in each, as the tokenizer makes them
    tokenizer = cross_encoder(ce_dir).tokenizer
    counted = sum(sum(m) for m in tokenizer([QUERY] * len(DOCS), DOCS)["attention_mask"])
    assert out["usage"] == {"prompt_tokens": counted, "total_tokens": counted}


def test_raw_scores_are_the_logits(model: Model, ce_dir: Path) -> None:
    out = run(model, {"query": QUERY, "documents": DOCS, "raw_scores": True})
    assert isinstance(out, dict)
    logits = cross_encoder(ce_dir).predict(
        [(QUERY, d) for d in DOCS], activation_fn=torch.nn.Identity()
    )
    got = {r["index"]: r["relevance_score"] for r in out["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], logits, atol=SCORE_ATOL)


def test_top_n_and_return_documents(model: Model) -> None:
    docs = [DOCS[0], {"text": DOCS[1], "id": "b"}, DOCS[2]]
    full = run(model, {"query": QUERY, "documents": docs})
    top = run(model, {"query": QUERY, "documents": docs, "top_n": 2, "return_documents": True})
    assert isinstance(full, dict) and isinstance(top, dict)
    assert top["results"] == [
        {**r, "document": {"text": [DOCS[0], DOCS[1], DOCS[2]][r["index"]]}}
        for r in full["results"][:2]
    ]
    # top_n past the documents returns them all (as Jina and TEI do)
    assert len(run(model, {"query": QUERY, "documents": docs, "top_n": 8})["results"]) == 3


def test_tei_shape_answers_a_sorted_array(model: Model) -> None:
    cohere = run(model, {"query": QUERY, "documents": DOCS})
    tei = run(model, {"query": QUERY, "texts": DOCS, "return_text": True})
    assert isinstance(cohere, dict) and isinstance(tei, list)
    assert [(r["index"], r["score"]) for r in tei] == [
        (r["index"], r["relevance_score"]) for r in cohere["results"]
    ]
    assert [r["text"] for r in tei] == [DOCS[r["index"]] for r in tei]
    plain = run(model, {"query": QUERY, "texts": DOCS[:2]})
    assert isinstance(plain, list) and set(plain[0]) == {"index", "score"}


def test_sentence_transformers_saved_layout_and_identity_activation(
    ce_dir: Path, tmp_path: Path
) -> None:
    """A directory CrossEncoder.save wrote (config_sentence_transformers.json names the
    activation): Identity there gives the logits, as CrossEncoder.predict does."""
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(str(ce_dir), device="cpu", local_files_only=True)
    ce.activation_fn = torch.nn.Identity()
    ce.save(str(tmp_path / "saved"))
    assert "Identity" in (tmp_path / "saved" / "config_sentence_transformers.json").read_text()
    saved = rerank.build(parse_args({"adapter": "rerank", "model_path": str(tmp_path / "saved")}))
    saved.backend.setup(torch.device("cpu"))
    out = run(saved, {"query": QUERY, "documents": DOCS})
    assert isinstance(out, dict)
    expected = cross_encoder(tmp_path / "saved").predict([(QUERY, d) for d in DOCS])
    got = {r["index"]: r["relevance_score"] for r in out["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], expected, atol=SCORE_ATOL)
    assert min(got.values()) < 0  # logits, not probabilities


def body(doc: object) -> bytes:
    return json.dumps(doc).encode()


OK = {"query": "q", "documents": ["a"]}


def decode_and_batch(model: Model, raw: bytes) -> list:
    """What the replica does: decode on the loop, then the batch (tokenizing it); the first
    ItemError is the request's 4xx."""
    decoded = model.decode(raw, "application/json", {})
    outputs = model.backend.predict(decoded.items)
    for out in outputs:
        if isinstance(out, ItemError):
            raise out.error
    return outputs


@pytest.mark.parametrize(
    ("doc", "exc", "needle", "param"),
    [
        ({**OK, "documents": []}, BadRequest, "'documents' must not be an empty list", "documents"),
        ({"query": "q"}, BadRequest, "'documents' is required", "documents"),
        ({"documents": ["a"]}, BadRequest, "'query' is required", "query"),
        ({**OK, "query": 3}, BadRequest, "'query' must be a string", "query"),
        ({**OK, "documents": "a"}, BadRequest, "must be a list", "documents"),
        ({**OK, "documents": ["a", 3]}, BadRequest, "'documents[1]' must be", "documents[1]"),
        ({**OK, "documents": [{"txt": "a"}]}, BadRequest, "'text'", "documents[0]"),
        ({**OK, "documents": ["a"] * 9}, BadRequest, "at most 8", "documents"),
        ({**OK, "top_n": 0}, BadRequest, "'top_n' must be between 1 and 8", "top_n"),
        ({**OK, "top_n": -1}, BadRequest, "between 1 and 8", "top_n"),
        ({**OK, "top_n": 9}, BadRequest, "between 1 and 8", "top_n"),
        ({**OK, "top_n": 1.5}, BadRequest, "'top_n' must be an integer", "top_n"),
        ({**OK, "top_n": "2"}, BadRequest, "must be an integer", "top_n"),
        ({**OK, "top_n": True}, BadRequest, "must be an integer", "top_n"),
        ({**OK, "return_documents": "yes"}, BadRequest, "true or false", "return_documents"),
        ({**OK, "raw_scores": 1}, BadRequest, "true or false", "raw_scores"),
        ({**OK, "texts": ["a"]}, BadRequest, "not both", "documents"),
        ({"query": "q", "texts": []}, BadRequest, "'texts' must not be", "texts"),
        ({"query": "q", "texts": [{"text": "a"}]}, BadRequest, "'texts[0]'", "texts[0]"),
        ({"query": "q", "texts": ["a"], "truncate": True}, BadRequest, "truncate", "truncate"),
        ({**OK, "model": "other"}, NotFound, "GET /v1/models", "model"),
        ({**OK, "documents": ["word " * 600]}, BadRequest, "at most 512", "documents[0]"),
    ],
)
def test_bad_requests_name_the_field(
    model: Model, doc: dict, exc: type, needle: str, param: str
) -> None:
    with pytest.raises(exc) as info:
        decode_and_batch(model, body(doc))
    assert needle in info.value.message
    assert info.value.to_json()["error"]["param"] == param


@pytest.mark.parametrize("raw", [b"", b"{", b"[1]"])
def test_bodies_that_are_not_json_objects(model: Model, raw: bytes) -> None:
    with pytest.raises(BadRequest):
        model.decode(raw, "application/json", {})


def test_a_long_query_is_named_with_its_document(ce_dir: Path) -> None:
    args = {"adapter": "rerank", "model_path": str(ce_dir), "max_input_tokens": 16}
    short = rerank.build(parse_args(args))
    short.backend.setup(torch.device("cpu"))
    with pytest.raises(BadRequest) as info:
        decode_and_batch(short, body({"query": "word " * 10, "documents": ["ok", "a b c d e f"]}))
    assert info.value.message.startswith("'documents[1]' with the query is 19 tokens")
    assert info.value.code == "input_too_long"


def test_directories_it_refuses(tmp_path: Path) -> None:
    three = classifier_dir(tmp_path / "three", ["a", "b", "c"], layers=1)
    with pytest.raises(ConfigError, match="adapter: text-classification"):
        rerank.build(parse_args({"adapter": "rerank", "model_path": str(three)}))
    with pytest.raises(ConfigError, match="load_format: dummy"):
        rerank.build(parse_args({"adapter": "rerank"}))
    with pytest.raises(ConfigError, match="not a directory"):
        rerank.build(parse_args({"adapter": "rerank", "model_path": str(tmp_path / "none")}))
    # an embeddings model (no classifier head) fails at setup, naming what is missing
    from tests.fixtures.text_models import minilm_dir

    plain = rerank.build(parse_args({"adapter": "rerank", "model_path": str(minilm_dir())}))
    if (minilm_dir() / "model.safetensors").is_file():
        with pytest.raises(ConfigError, match="classifier.weight"):
            plain.backend.setup(torch.device("cpu"))


def test_dummy_weights_run_the_real_architecture() -> None:
    dummy = rerank.build(parse_args({"adapter": "rerank", "load_format": "dummy"}))
    backend = dummy.backend
    backend.setup(torch.device("cpu"))
    assert backend.describe()["task"] == "rerank" and backend.report()["encoder"] == "serve_app"
    items = backend.worst_case_items(2)
    # the packaged MiniLM's max_seq_length
    assert len(items[0].ids) == backend.describe()["max_input_tokens"] == 256
    logits = backend.predict(items)
    assert [x.shape for x in logits] == [(1,), (1,)]
    shapes = {(len(b), len(b[0].ids)) for b in backend.warmup_batches(4)}
    assert (4, 256) in shapes and (1, 8) in shapes


def test_graph_path_pads_to_buckets_and_matches_eager(
    ce_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA graphs' bookkeeping on the CPU (test_graphs' CpuGraphSet: static buffers with stale
    rows): a batch of 3 pairs replays the bucket of 4 at its length bucket, with the eager
    scores; one past the largest bucket runs eagerly."""
    from serve_app.adapters.embeddings.backend import GRAPH_LENGTHS
    from tests.unit.gpu.test_graphs import _with_cpu_graphs

    graphed_model = rerank.build(parse_args({"adapter": "rerank", "model_path": str(ce_dir)}))
    backend = graphed_model.backend
    backend.setup(torch.device("cpu"))
    decoded = graphed_model.decode(body({"query": QUERY, "documents": DOCS[:3]}), "", {})
    eager = backend.predict(decoded.items)
    graphs = _with_cpu_graphs(backend, monkeypatch, "text")
    assert set(graphs.static) == {(b, n) for b in (1, 2, 4, 8) for n in GRAPH_LENGTHS}
    graphed = backend.predict(decoded.items)
    longest = max(len(item.ids) for item in decoded.items)
    assert graphs.runs == [((4, next(n for n in GRAPH_LENGTHS if n >= longest)), 3)]
    np.testing.assert_allclose(np.stack(graphed), np.stack(eager), atol=SCORE_ATOL)
    assert len(backend.predict(decoded.items * 3)) == 9 and len(graphs.runs) == 1


def test_batch_tokenizing_equals_the_per_request_path(model: Model) -> None:
    pairs = [(QUERY, d) for d in DOCS]
    backend = model.backend
    items = backend.prepare(pairs)
    before = backend.tokens.encode_items(pairs)  # the path it replaced
    out = backend.predict(items)  # tokenized in the batch
    assert [(it.ids, it.types) for it in items] == [(t.ids, t.types) for t in before]
    np.testing.assert_allclose(np.stack(out), np.stack(backend.predict(before)), atol=1e-6)
