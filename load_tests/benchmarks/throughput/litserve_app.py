"""The peer ``litserve``: LitServe 0.2.19 serving MiniLM with its documented production settings
(``workers_per_device``, ``max_batch_size`` and ``batch_timeout`` on the LitAPI, ``fast_queue``:
ZeroMQ between the API servers and the workers; one uvicorn API server per worker, its default),
at ``POST /v1/embeddings`` on 127.0.0.1. A custom LitAPI, since LitServe's own
OpenAIEmbeddingSpec refuses requests of several texts when batching is on.

    python -m load_tests.benchmarks.throughput.litserve_app --port 8123 --device cuda \\
        --workers 12 --max-batch-size 64 --batch-timeout-s 0.01

LitServe is not a dependency of serve_app: ``pip install -e '.[peers]'`` (``available()`` says
whether it can be imported here).
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence
from typing import Any

INSTALL_HINT = "pip install -e '.[peers]' (litserve==0.2.19)"


def available() -> bool:
    return importlib.util.find_spec("litserve") is not None


def make_api(max_batch_size: int, batch_timeout_s: float, model_name: str) -> Any:
    from load_tests.benchmarks.throughput.litserve_api import EmbedAPI

    return EmbedAPI(
        model_name,
        max_batch_size=max_batch_size,
        batch_timeout=batch_timeout_s,
        api_path="/v1/embeddings",
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.benchmarks.throughput.litserve_app")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--workers", type=int, default=1, help="workers_per_device (one device)")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--batch-timeout-s", type=float, default=0.01)
    p.add_argument("--model-name", default="all-MiniLM-L6-v2")
    p.add_argument("--marker", default="", help="ignored: lets the harness find this process")
    a = p.parse_args(argv)
    import litserve as ls

    api = make_api(a.max_batch_size, a.batch_timeout_s, a.model_name)
    server = ls.LitServer(
        api,
        accelerator=a.device,
        devices=1,
        workers_per_device=a.workers,
        fast_queue=True,
        timeout=30,
    )
    server.run(host="127.0.0.1", port=a.port, log_level="warning", generate_client_file=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
