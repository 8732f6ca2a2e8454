"""The LitAPI of the ``litserve`` peer (litserve_app runs it). A module of its own, at module
level, because LitServe pickles the LitAPI into each spawned inference worker; it imports
litserve, so only litserve_app's process imports it."""

from typing import Any

import litserve as ls
from fastapi import HTTPException

from load_tests.benchmarks.throughput.peers import (
    Embedder,
    RequestError,
    parse_request,
    response_doc,
    split,
)


class EmbedAPI(ls.LitAPI):  # type: ignore[misc]
    """One tokenizer call and one forward pass per batch of requests (LitServe's batching)."""

    def __init__(self, model_name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name

    def setup(self, device: str) -> None:
        self.embedder = Embedder(device)

    # Unannotated: LitServe takes the HTTP request and response types from these two
    # signatures (none: the request's JSON in, a JSON answer out).
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        try:
            return parse_request(request)
        except RequestError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None

    def predict(self, batch: list[tuple[list[str], str]]) -> list[Any]:
        flat = [t for texts, _ in batch for t in texts]
        vectors, tokens = self.embedder.embed(flat)
        counts = [len(texts) for texts, _ in batch]
        fmts = [fmt for _, fmt in batch]
        return list(zip(split(vectors, counts), split(tokens, counts), fmts, strict=True))

    def unbatch(self, output: list[Any]) -> list[Any]:
        return output

    def encode_response(self, output):  # type: ignore[no-untyped-def]
        vectors, tokens, fmt = output
        return response_doc(vectors, fmt, self.model_name, sum(tokens))
