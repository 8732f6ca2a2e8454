"""The open-loop workers' HTTP/1.1 client: keep-alive connections over asyncio protocols, one
request in flight on each, answers parsed by httptools (the C parser uvicorn uses).

Why not aiohttp, which the workers used before: on a host whose cores the server shares, the
client's CPU is taken from the server. aiohttp cost 16 open-loop processes about 5 of an H200
host's 16 cores at 15,000 requests/s (run O's one-text row, `client_cpu_frac_max` 0.33 each),
so the open-loop point at 80% of wrk's rate could not be held. This client does only what the
workers need: one method and URL per job, a body per request, the status and the whole answer
back (docs/benchmarks.md, "The open-loop client's own cost", has the two side by side).
"""

from __future__ import annotations

import asyncio
import collections
import socket
from collections.abc import Mapping
from urllib.parse import urlsplit

import httptools


class ConnectError(OSError):
    """No connection could be opened."""


class ReadError(ConnectionError):
    """The connection closed, or the answer could not be parsed, before the answer was whole."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; ``answer`` resolves to (status, body, keep_alive)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.closed = False
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a request goes out whole at once: never wait on Nagle
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ReadError(f"unparsable answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ReadError("connection closed before the answer was whole"))

    def _fail(self, exc: BaseException) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(exc)

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self._body = []

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self.answer is not None and not self.answer.done():
            status, keep = self.parser.get_status_code(), self.parser.should_keep_alive()
            self.answer.set_result((status, b"".join(self._body), keep))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class RawPool:
    """Up to ``limit`` keep-alive connections to ``url``'s host; ``request`` sends one request
    with the job's method, path and headers (``Host`` and ``Content-Length`` added, as wrk
    sends) on an idle connection, opening one while under the limit, else waiting for one.
    A request that does not end with a whole answer (an error, a cancellation such as a
    timeout) closes its connection: it is never reused with an answer still on its way."""

    def __init__(self, url: str, method: str, headers: Mapping[str, str], limit: int):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only http:// URLs with a host: {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"{method} {path} HTTP/1.1", f"Host: {parts.netloc}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() != "content-length"]
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        self.limit = limit
        self.opened = 0  # connections opened in all, for the curious
        self._idle: list[_Connection] = []
        self._count = 0  # connections open or opening
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def request(self, body: bytes) -> tuple[int, bytes]:
        conn = await self._acquire()
        loop = asyncio.get_running_loop()
        conn.answer = loop.create_future()
        try:
            assert conn.transport is not None
            conn.transport.write(b"%s%d\r\n\r\n%s" % (self._head, len(body), body))
            status, answer, keep_alive = await conn.answer
        except BaseException:
            conn.close()
            self._release(conn)
            raise
        if not keep_alive:
            conn.close()
        self._release(conn)
        return status, answer

    async def _acquire(self) -> _Connection:
        loop = asyncio.get_running_loop()
        while True:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
                self._count -= 1
            if self._count < self.limit:
                self._count += 1
                try:
                    _, conn = await loop.create_connection(_Connection, self.host, self.port)
                except BaseException as exc:
                    self._count -= 1
                    self._wake()
                    if isinstance(exc, OSError):
                        raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
                    raise
                self.opened += 1
                return conn
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake()  # woken as it went: pass the turn on
                raise

    def _release(self, conn: _Connection) -> None:
        if conn.closed:
            self._count -= 1
        else:
            self._idle.append(conn)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
