"""How the batcher learns an item's length before the batch tokenizes it (issue 28 item 3),
measured in-process on the CPU: a character estimate on the event loop (what serve_app does)
against tokenizing each request, on the loop (the old path) or in a thread before batching.
For each, the event loop's CPU per request of 16 texts and the wall time of the step; and the
estimate's error against the real token counts, on word windows of the repository's docs.

    python load_tests/benchmarks/token_estimate_cpu.py --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from load_tests.workloads.texts import corpus_words, make_texts
from serve_app.adapters import embeddings
from serve_app.adapters.embeddings.modeldir import TextItem
from serve_app.config.args import parse_args


async def measure(fn: Any, batches: list[list[str]], threaded: bool) -> dict[str, float]:
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    for texts in batches:
        if threaded:
            await asyncio.to_thread(fn, texts)
        else:
            fn(texts)
    n = len(batches)
    return {
        "loop_cpu_us_per_request": round(1e6 * (time.thread_time() - cpu0) / n, 1),
        "wall_us_per_request": round(1e6 * (time.perf_counter() - wall0) / n, 1),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    backend = embeddings.build(parse_args({})).backend
    tokens = backend.tokens
    rng = random.Random(args.seed)
    words = corpus_words()
    out: dict[str, Any] = {"requests": args.requests, "texts_per_request": 16}
    for workload in ("short16", "mixed"):
        batches = [make_texts(words, 16, workload, rng) for _ in range(args.requests)]
        row: dict[str, Any] = {}
        for name, fn, threaded in (
            ("estimate_on_loop", tokens.items, False),
            ("tokenize_on_loop", tokens.encode, False),
            ("tokenize_in_thread", tokens.encode, True),
        ):
            await measure(fn, batches[:50], threaded)  # warm
            row[name] = await measure(fn, batches, threaded)
        ratios = []
        for texts in batches[:200]:
            for item, ids in zip(tokens.items(texts), tokens.encode(texts), strict=True):
                ratios.append(len(ids) / item.estimate)
        q = statistics.quantiles(ratios, n=20)
        row["real_over_estimate"] = {
            "mean": round(statistics.fmean(ratios), 3),
            "p5": round(q[0], 3),
            "p95": round(q[-1], 3),
            "max": round(max(ratios), 3),
        }
        out[workload] = row
    # the worst case for the estimate: text the character rule reads as 4 characters a token
    cjk = ["東京都の天気は晴れです" * 8]
    item = TextItem(cjk[0], 0, tokens.max_tokens)
    out["cjk_real_over_estimate"] = round(len(tokens.encode(cjk)[0]) / item.estimate, 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
