"""Request bodies for each payload kind, and the sharded HTTP client that sends them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from load_tests import payloads
from load_tests.bench.stats import (
    CONNECTIONS_PER_SHARD,
    DEFAULT_MODELS,
    N_IMAGE_VARIANTS,
    N_TEXT_VARIANTS,
)


@dataclass(frozen=True)
class PreparedRequest:
    """A fully encoded request, built before the run so encoding is off the send path."""

    method: str
    url: str
    headers: Mapping[str, str]
    content: bytes


def build_requests(
    url: str,
    kind: str,
    *,
    model: str | None = None,
    texts: str = "short",
    batch: int = 1,
    image_size: int = 224,
    image_format: str = "jpeg",
    binary: bool = False,
    top_k: int = 5,
    seed: int = 0,
) -> list[PreparedRequest]:
    """Distinct encoded requests for `kind` ("embeddings" or "image"), cycled during a run."""
    if batch < 1:
        raise ValueError(f"batch {batch} must be >= 1")
    model = model or DEFAULT_MODELS.get(kind, "")
    if kind == "embeddings":
        pool = payloads.texts(texts, N_TEXT_VARIANTS * batch, seed)
        headers = {"Content-Type": "application/json"}
        return [
            PreparedRequest(
                "POST",
                url,
                headers,
                payloads.embeddings_body(
                    pool[i * batch] if batch == 1 else pool[i * batch : (i + 1) * batch], model
                ),
            )
            for i in range(N_TEXT_VARIANTS)
        ]
    if kind == "image":
        seeds = [seed + i for i in range(N_IMAGE_VARIANTS)]
        if binary:
            if batch != 1:
                raise ValueError(
                    f"--binary sends one raw image per request but batch={batch}; "
                    "drop --binary or use --batch 1"
                )
            sep = "&" if urlsplit(url).query else "?"
            raw_url = f"{url}{sep}top_k={top_k}"
            headers = {"Content-Type": payloads.IMAGE_CONTENT_TYPES[image_format]}
            return [
                PreparedRequest(
                    "POST", raw_url, headers, payloads.image_bytes(image_size, image_format, s)
                )
                for s in seeds
            ]
        headers = {"Content-Type": "application/json"}
        out = []
        for i in range(N_IMAGE_VARIANTS):
            imgs = [
                payloads.image_b64(image_size, image_format, seeds[(i + j) % len(seeds)])
                for j in range(batch)
            ]
            body = payloads.classify_body(imgs[0] if batch == 1 else imgs, model, top_k)
            out.append(PreparedRequest("POST", url, headers, body))
        return out
    raise ValueError(f"kind {kind!r} is not 'embeddings' or 'image'")


class ShardedClient:
    """Several small-pool `httpx.AsyncClient`s behind one `request()`, least-loaded first.

    Why: httpcore's pool does work proportional to (queued requests x connections) on every
    request event, so one client with a couple of hundred busy connections starves the event
    loop (measured here: 400 req/s at 0.5 s each, i.e. 200 in flight, gave 30 s of send lag with
    one 256-connection client and 0.05 s with 16 clients of 16). Each shard keeps HTTP/1.1
    keep-alive connections; the total never exceeds `max_connections`.
    """

    def __init__(
        self,
        max_connections: int = 256,
        timeout_s: float = 30.0,
        connections_per_shard: int = CONNECTIONS_PER_SHARD,
    ) -> None:
        n_shards = max(1, math.ceil(max_connections / connections_per_shard))
        sizes = [
            max_connections // n_shards + (i < max_connections % n_shards) for i in range(n_shards)
        ]
        ssl_context = httpx.create_ssl_context()  # one for all shards: each costs ~25 ms
        self._clients = [
            httpx.AsyncClient(
                verify=ssl_context,
                limits=httpx.Limits(
                    max_connections=size, max_keepalive_connections=size, keepalive_expiry=30.0
                ),
                timeout=httpx.Timeout(timeout_s),
                http2=False,
            )
            for size in sizes
        ]
        self._in_flight = [0] * n_shards
        self.shard_sizes: tuple[int, ...] = tuple(sizes)

    async def request(
        self, method: str, url: str, *, headers: Mapping[str, str], content: bytes
    ) -> httpx.Response:
        i = min(range(len(self._clients)), key=self._in_flight.__getitem__)
        self._in_flight[i] += 1
        try:
            return await self._clients[i].request(method, url, headers=headers, content=content)
        finally:
            self._in_flight[i] -= 1

    async def aclose(self) -> None:
        for c in self._clients:
            await c.aclose()

    async def __aenter__(self) -> ShardedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def make_client(max_connections: int = 256, timeout_s: float = 30.0) -> ShardedClient:
    """An HTTP/1.1 keep-alive client with at most `max_connections` connections in all."""
    return ShardedClient(max_connections, timeout_s)


def _error_of(response: httpx.Response) -> str | None:
    if 200 <= response.status_code < 300:
        return None
    kind = f"http_{response.status_code}"
    try:
        err = response.json().get("error", {})
        if isinstance(err, dict) and err.get("type"):
            kind += f":{err['type']}"
    except (ValueError, AttributeError):
        pass
    return kind


def _transport_error(exc: Exception) -> str:
    # Order matters: PoolTimeout is a TimeoutException but means client-side queueing.
    if isinstance(exc, httpx.PoolTimeout):
        return "pool_timeout"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect_error"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "protocol_error"
    return f"client_{type(exc).__name__}"
