"""The peer ``ray_serve_batch``: plain Ray Serve serving MiniLM with ``@serve.batch``, written as
Ray Serve's batching guide shows (an async method decorated with ``max_batch_size`` and
``batch_wait_timeout_s`` that takes a list of requests' inputs and returns one result each),
behind a FastAPI ingress (serve_app's ingress shape, as the no-op) at ``POST /v1/embeddings``.
Deployed from a Serve config into the same cluster, behind the same HAProxy ingress."""

# No ``from __future__ import annotations`` here: FastAPI reads the route's ``Request``
# annotation, which names a class imported inside batch_deployment, not a module global.
from typing import Any

DEPLOYMENT_NAME = "Embed"
IMPORT_PATH = "load_tests.benchmarks.throughput.ray_serve_batch_app:build"


def batch_deployment(max_batch_size: int, batch_wait_timeout_s: float) -> Any:
    """A FastAPI-ingress deployment whose route hands each request's texts to one batched
    method: one tokenizer call and one forward pass per batch of requests."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from ray import serve

    from load_tests.benchmarks.throughput.peers import (
        Embedder,
        RequestError,
        parse_request,
        response_doc,
        split,
    )

    api = FastAPI()

    @serve.ingress(api)
    class Embed:
        def __init__(self, device: str, model_name: str) -> None:
            self.embedder = Embedder(device)
            self.model_name = model_name

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def embed_batch(self, requests: list[list[str]]) -> list[Any]:
            flat = [t for texts in requests for t in texts]
            vectors, tokens = self.embedder.embed(flat)
            counts = [len(texts) for texts in requests]
            return list(zip(split(vectors, counts), split(tokens, counts), strict=True))

        @api.post("/v1/embeddings")
        async def embeddings(self, request: Request):  # type: ignore[no-untyped-def]
            try:
                texts, fmt = parse_request(await request.json())
            except (RequestError, ValueError) as exc:  # a JSON decode error is a ValueError
                return JSONResponse({"error": str(exc)}, status_code=400)
            vectors, tokens = await self.embed_batch(texts)
            return response_doc(vectors, fmt, self.model_name, sum(tokens))

    return serve.deployment(Embed)


def build(args: dict[str, Any]) -> Any:
    """``import_path`` target; ``args``: device, model_name, max_batch_size,
    batch_wait_timeout_s (options come from the config's deployments)."""
    dep = batch_deployment(int(args["max_batch_size"]), float(args["batch_wait_timeout_s"]))
    return dep.bind(str(args.get("device", "cpu")), str(args.get("model_name", "minilm")))
