"""Text workloads for the embeddings benchmarks (issue 28 item 4): word windows of the
repository's own docs (English prose), seeded, in the lengths stated here, and the tokenizer's
count of each text.

Lengths, in words (uniform in each range), and what MiniLM's tokenizer makes of them on this
corpus (``[CLS]`` and ``[SEP]`` included; tests/load_tests/workloads/test_texts.py checks the
bounds on the seeded set):

- ``short``: 4 to 12 words, 6 to at most 30 tokens (mean about 12);
- a query of ``mixed``: 4 to 22 words, 6 to at most 45 tokens (mean about 18);
- a passage of ``mixed``: 30 to 150 words, 32 to at most 250 tokens (mean about 113), under
  MiniLM's limit of 256, so that serve_app takes every one.

``mixed`` is a stream of requests that hold either queries (70% of requests) or passages
(30%), as a retrieval service sees them: queries from users, passages from indexing. The shape
is MS MARCO's, roughly: short queries (its queries are mostly under 30 tokens) and passages of
tens to a couple of hundred tokens; the ranges were chosen to cover those, not fitted to the
data set. ``mixed_within`` mixes queries and passages inside each request. The corpus is the
docs of the checkout, so the texts change when the docs do: a benchmark row records its mean
tokens per request rather than relying on the texts being the same.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS: tuple[str, ...] = ("short16", "mixed", "mixed_within")
SHORT_WORDS = (4, 12)
QUERY_WORDS = (4, 22)
PASSAGE_WORDS = (30, 150)
QUERY_SHARE = 0.7  # of requests in ``mixed``, of texts in ``mixed_within``


@lru_cache(maxsize=1)
def corpus_words() -> list[str]:
    """The words of docs/*.md, markup removed: ASCII alphabetic words only."""
    text = " ".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    text = re.sub(r"[`|#*\[\]()<>]", " ", text)
    return [w for w in text.split() if w.isascii() and w.strip(".,;:").isalpha()]


def make_texts(words: Sequence[str], n: int, workload: str, rng: random.Random) -> list[str]:
    """The ``n`` texts of one request of ``workload`` (``short16``, ``mixed`` or
    ``mixed_within``): word windows of ``words`` in the lengths the module states."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload {workload!r} is not one of {WORKLOADS}")

    def window(lo: int, hi: int) -> str:
        k = rng.randint(lo, hi)
        start = rng.randrange(len(words) - k)
        return " ".join(words[start : start + k])

    if workload == "short16":
        return [window(*SHORT_WORDS) for _ in range(n)]
    if workload == "mixed":  # a request of queries or a request of passages
        lo, hi = QUERY_WORDS if rng.random() < QUERY_SHARE else PASSAGE_WORDS
        return [window(lo, hi) for _ in range(n)]
    return [
        window(*QUERY_WORDS) if rng.random() < QUERY_SHARE else window(*PASSAGE_WORDS)
        for _ in range(n)
    ]


def request_texts(
    workload: str, requests: int, texts_per_request: int, seed: int = 0
) -> list[list[str]]:
    """``requests`` requests of ``workload``, ``texts_per_request`` texts each; the same lists
    for the same seed (and docs)."""
    rng = random.Random(seed)
    words = corpus_words()
    return [make_texts(words, texts_per_request, workload, rng) for _ in range(requests)]


@lru_cache(maxsize=1)
def minilm_tokenizer() -> Any:
    """MiniLM's tokenizer (the packaged skeleton's tokenizer.json) as serve_app runs it:
    no truncation, no padding."""
    from tokenizers import Tokenizer

    from serve_app.adapters.embeddings.modeldir import SKELETON_DIR

    tok = Tokenizer.from_file(str(SKELETON_DIR / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def token_counts(texts: Sequence[str]) -> list[int]:
    """MiniLM's tokens per text, ``[CLS]`` and ``[SEP]`` included (what a replica embeds)."""
    return [len(e.ids) for e in minilm_tokenizer().encode_batch(list(texts))]
