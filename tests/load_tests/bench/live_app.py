"""The bench tests' server: /v1/embeddings (a 507 JSON error for a text with "fail") and
/v1/memory (one replica with a 1 GiB budget)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def embeddings(request: Request) -> JSONResponse:
    body = await request.json()
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    if any("fail" in text for text in inputs):
        return JSONResponse({"error": {"message": "too big", "type": "out_of_memory"}}, 507)
    data = [{"object": "embedding", "index": i, "embedding": [0.0] * 4} for i in range(len(inputs))]
    return JSONResponse({"object": "list", "data": data, "model": body["model"]})


async def _memory(request: Request) -> JSONResponse:
    replica = {
        "replica_id": "r0",
        "pid": 1,
        "gpu_uuid": None,
        "budget_bytes": 1 << 30,
        "nvml_process_bytes": None,
        "peak_reserved_bytes": 0,
    }
    return JSONResponse({"replicas": [replica]})


APP = Starlette(
    routes=[
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/memory", _memory),
    ]
)
