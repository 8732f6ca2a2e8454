"""load_tests.bench.client: request bodies and the sharded HTTP client."""

from __future__ import annotations

import asyncio
import json

import pytest

from load_tests import bench


def test_build_requests_bodies() -> None:
    reqs = bench.build_requests("http://127.0.0.1:1/v1/embeddings", "embeddings", batch=3)
    body = json.loads(reqs[0].content)
    assert body["model"] == "all-MiniLM-L6-v2" and len(body["input"]) == 3
    raw = bench.build_requests("http://127.0.0.1:1/v1/classify", "image", binary=True, top_k=3)
    assert raw[0].url.endswith("?top_k=3") and raw[0].headers["Content-Type"] == "image/jpeg"
    js = bench.build_requests("http://127.0.0.1:1/v1/classify", "image", image_format="png")
    assert json.loads(js[0].content)["model"] == "resnet50"
    with pytest.raises(ValueError, match="--binary"):
        bench.build_requests("http://127.0.0.1:1/v1/classify", "image", binary=True, batch=2)


def test_sharded_client_splits_connections() -> None:
    async def sizes(total: int) -> tuple[int, ...]:
        async with bench.ShardedClient(total, 5.0, connections_per_shard=16) as client:
            return client.shard_sizes

    assert asyncio.run(sizes(40)) == (14, 13, 13)
    assert asyncio.run(sizes(256)) == (16,) * 16
    assert asyncio.run(sizes(3)) == (3,)
