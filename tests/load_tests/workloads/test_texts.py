"""load_tests.workloads.texts: the workloads' lengths (in words and in MiniLM's tokens), the
seeding, and token counts that are the replica's own."""

from __future__ import annotations

import random

import pytest

from load_tests.workloads import texts as w
from serve_app.adapters.embeddings.modeldir import SKELETON_DIR, Tokenization
from serve_app.config.args import parse_args


def test_the_same_seed_gives_the_same_requests() -> None:
    assert w.request_texts("mixed", 20, 4, seed=3) == w.request_texts("mixed", 20, 4, seed=3)
    assert w.request_texts("mixed", 20, 4, seed=3) != w.request_texts("mixed", 20, 4, seed=4)
    with pytest.raises(ValueError, match="workload 'long'"):
        w.make_texts(w.corpus_words(), 1, "long", random.Random(0))


def test_mixed_requests_hold_queries_or_passages_in_the_stated_shares() -> None:
    requests = w.request_texts("mixed", 1000, 4, seed=0)
    kinds = []
    for texts in requests:
        words = [len(t.split()) for t in texts]
        is_query = max(words) <= w.QUERY_WORDS[1]
        lo, hi = w.QUERY_WORDS if is_query else w.PASSAGE_WORDS
        assert all(lo <= n <= hi for n in words), words  # never a query beside a passage
        kinds.append(is_query)
    # 70% of 1,000 requests hold queries: a binomial count, within 5 standard deviations.
    assert abs(sum(kinds) - 700) <= 5 * (1000 * 0.7 * 0.3) ** 0.5
    within = [t for r in w.request_texts("mixed_within", 100, 16, seed=0) for t in r]
    short = [len(t.split()) for t in w.request_texts("short16", 100, 16, seed=0)[0]]
    assert all(w.SHORT_WORDS[0] <= n <= w.SHORT_WORDS[1] for n in short)
    assert {len(t.split()) <= w.QUERY_WORDS[1] for t in within} == {True, False}


def test_token_lengths_are_the_stated_ones_and_the_replicas_counts() -> None:
    """The docstring's token ranges, on over 1,000 texts of each kind (seeded), and the counts equal
    to the ids serve_app's tokenization gives each text (what a replica embeds)."""
    rng = random.Random(0)
    words = w.corpus_words()
    texts = {
        "short": [t for _ in range(125) for t in w.make_texts(words, 16, "short16", rng)],
        "query": [],
        "passage": [],
    }
    for r in w.request_texts("mixed", 400, 16, seed=0):
        texts["query" if len(r[0].split()) <= w.QUERY_WORDS[1] else "passage"] += r
    stated = {"short": (6, 30), "query": (6, 45), "passage": (32, 250)}
    for kind, (lo, hi) in stated.items():
        counts = w.token_counts(texts[kind])
        assert len(counts) >= 1000, kind
        assert lo <= min(counts) and max(counts) <= hi, (kind, min(counts), max(counts))
    replica = Tokenization(SKELETON_DIR, parse_args({})).tokenizer
    sample = texts["query"][:50] + texts["passage"][:50]
    assert w.token_counts(sample) == [len(replica.encode(t).ids) for t in sample]
