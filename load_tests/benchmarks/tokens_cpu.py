"""In-process CPU micro-benchmark of the replica's request path for the text families (issue
28): decode on the event loop, the batcher, predict on the model thread, encode with orjson,
with concurrent clients on one asyncio loop and no Ray or HTTP. Reports texts/s, tokens/s, the
event loop's own CPU per 1,000 texts (the figure tokenization off the loop should lower) and
the batches' padding. Run it against two checkouts (PYTHONPATH) for a before/after.

    python load_tests/benchmarks/tokens_cpu.py --workload short16 --out result.json

Texts are word windows of the repository's own docs (English prose), the workloads of
load_tests.workloads.texts (which states their lengths): ``short16`` sends 16 texts of 4 to 12
words a request; ``mixed`` 16 queries (70% of requests) or 16 passages (30%); ``mixed_within``
the same texts mixed inside each request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import torch

from load_tests.workloads.texts import WORKLOADS, corpus_words, make_texts
from serve_app.adapters import embeddings
from serve_app.config.args import parse_args
from serve_app.errors import ItemError
from serve_app.serving.batcher import Batcher
from serve_app.serving.http import JSON_OPTIONS

ROOT = Path(__file__).resolve().parents[2]


def tiny_model_dir() -> str:
    """MiniLM's tokenizer over a one-layer, 64-wide BERT (random weights): the model's share of
    the CPU made small, so that the request path's own cost shows."""
    import shutil
    import tempfile

    from serve_app.adapters.embeddings.modeldir import SKELETON_DIR

    path = Path(tempfile.mkdtemp()) / "tiny"
    shutil.copytree(SKELETON_DIR, path)
    config = json.loads((path / "config.json").read_text())
    config.update(num_hidden_layers=1, hidden_size=64, num_attention_heads=2, intermediate_size=128)
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def padding_of(items: list[Any]) -> tuple[int, int]:
    """(real tokens, padded tokens) of a batch, whichever item type this checkout uses."""
    lens = [len(it.ids) if hasattr(it, "ids") else len(it) for it in items]
    return sum(lens), len(lens) * max(lens)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.torch_threads)
    raw: dict[str, Any] = {"max_batch_size": args.max_batch_size}
    if args.tiny:
        raw.update(model_path=tiny_model_dir(), load_format="dummy")
    app_args = parse_args(raw)
    model = embeddings.build(app_args)
    backend = model.backend
    backend.setup(torch.device("cpu"))
    rng = random.Random(args.seed)
    words = corpus_words()
    bodies = []
    real_tokens = 0
    for _ in range(args.distinct_requests):
        texts = make_texts(words, args.texts_per_request, args.workload, rng)
        real_tokens += sum(len(e.ids) for e in backend.tokens.tokenizer.encode_batch(texts))
        bodies.append(orjson.dumps({"input": texts}))
    tokens_per_text = real_tokens / (args.distinct_requests * args.texts_per_request)
    padding = [0, 0, 0]  # real tokens, padded tokens, batches

    def predict(items: list[Any]) -> list[Any]:
        out = backend.predict(items)
        real, padded = padding_of(items)
        padding[0] += real
        padding[1] += padded
        padding[2] += 1
        return out

    extra: dict[str, Any] = {}
    try:  # the token packing where this checkout has it
        from serve_app.startup.calibration import length_packing

        extra = length_packing(app_args, backend, args.max_batch_size)
    except ImportError:
        pass
    executor = ThreadPoolExecutor(max_workers=1)
    batcher: Batcher[Any, Any] = Batcher(predict, executor, args.max_batch_size, 0.0, **extra)
    done = 0
    stop_at = 0.0

    async def client(k: int) -> None:
        nonlocal done
        i = k
        while time.perf_counter() < stop_at:
            decoded = model.decode(bodies[i % len(bodies)], "application/json", {})
            results = await batcher.submit(decoded.items)
            if any(isinstance(r, ItemError) for r in results):
                raise RuntimeError("an item failed")
            orjson.dumps(model.encode(results, decoded), option=JSON_OPTIONS)
            done += 1
            i += args.clients

    stop_at = time.perf_counter() + args.warmup_s
    await asyncio.gather(*(client(k) for k in range(args.clients)))
    done, padding[:] = 0, [0, 0, 0]
    loop_cpu0, wall0 = time.thread_time(), time.perf_counter()
    stop_at = wall0 + args.duration_s
    await asyncio.gather(*(client(k) for k in range(args.clients)))
    wall_s, loop_cpu_s = time.perf_counter() - wall0, time.thread_time() - loop_cpu0
    texts = done * args.texts_per_request
    batcher.close()
    executor.shutdown()
    return {
        "workload": args.workload,
        "texts_per_request": args.texts_per_request,
        "clients": args.clients,
        "max_batch_size": args.max_batch_size,
        "max_batch_tokens": extra.get("max_batch_tokens"),
        "torch_threads": args.torch_threads,
        "model": "tiny (1 layer, 64 wide, MiniLM's tokenizer)" if args.tiny else "MiniLM-L6",
        "duration_s": round(wall_s, 2),
        "requests": done,
        "texts_per_s": round(texts / wall_s, 1),
        "tokens_per_s": round(texts * tokens_per_text / wall_s, 1),
        "mean_tokens_per_text": round(tokens_per_text, 1),
        "event_loop_cpu_ms_per_1000_texts": round(1e6 * loop_cpu_s / max(texts, 1), 1),
        "padding_efficiency": round(padding[0] / max(padding[1], 1), 3),
        "mean_batch_items": round(texts / max(padding[2], 1), 1),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "python": sys.version.split()[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=WORKLOADS, default="short16")
    p.add_argument("--texts-per-request", type=int, default=16)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--distinct-requests", type=int, default=200)
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="a one-layer model: the path's cost shows")
    p.add_argument("--label", default="")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    result = {"label": args.label, **asyncio.run(run(args))}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
