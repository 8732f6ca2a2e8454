"""load_tests.harness.rawhttp: the open-loop workers' client against a small asyncio server that
answers as told by the request's path: keep-alive reuse, the connection limit, a server that
closes, an answer cut short, a chunked answer, an unparsable one, a refused connection, a
timeout that closes its connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from load_tests.harness.rawhttp import ConnectError, RawPool, ReadError

pytestmark = pytest.mark.anyio


@pytest.fixture()
def anyio_backend() -> str:
    return "asyncio"


class Server:
    """HTTP/1.1 on 127.0.0.1: ``/ok`` echoes the body with its length and keeps the connection;
    ``/close`` answers then closes; ``/cut`` promises 100 bytes, sends 3 and closes;
    ``/chunked`` answers in two chunks; ``/junk`` is not HTTP; ``/slow`` answers after 1 s."""

    def __init__(self) -> None:
        self.connections = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.heads: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                path = head.split(b" ")[1]
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                if path == b"/slow":
                    await asyncio.sleep(1.0)
                elif path == b"/ok":
                    await asyncio.sleep(0.02)
                self.in_flight -= 1
                if path == b"/cut":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
                    await writer.drain()
                    break
                if path == b"/junk":
                    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
                    await writer.drain()
                    continue
                if path == b"/chunked":
                    writer.write(
                        b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"4\r\nbusy\r\n6\r\n, wait\r\n0\r\n\r\n"
                    )
                    await writer.drain()
                    continue
                answer = b"%d:%s" % (len(body), body)
                close = path == b"/close"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s"
                    % (len(answer), b"Connection: close\r\n" if close else b"", answer)
                )
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture()
async def server() -> AsyncIterator[tuple[Server, str]]:
    state = Server()
    srv = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield state, f"http://127.0.0.1:{port}"
    finally:
        srv.close()


def pool(url: str, path: str, limit: int = 4) -> RawPool:
    return RawPool(f"{url}{path}", "POST", {"Content-Type": "application/json"}, limit)


async def test_keep_alive_connections_are_reused_within_the_limit(server) -> None:
    state, url = server
    p = pool(url, "/ok", limit=3)
    answers = await asyncio.gather(*(p.request(b'{"i": %d}' % i) for i in range(30)))
    assert answers == [(200, b'%d:{"i": %d}' % (len(b'{"i": %d}' % i), i)) for i in range(30)]
    assert state.connections == p.opened == 3 and state.most_in_flight == 3
    head = state.heads[0].decode()
    assert head.startswith("POST /ok HTTP/1.1\r\nHost: 127.0.0.1:")
    assert "Content-Type: application/json\r\nContent-Length: 8\r\n\r\n" in head
    await p.request(b"{}")
    assert state.connections == 3  # the idle ones again
    p.close()


async def test_a_server_that_closes_gets_a_new_connection(server) -> None:
    state, url = server
    p = pool(url, "/close", limit=1)
    for _ in range(3):
        assert await p.request(b"x") == (200, b"1:x")
    assert state.connections == 3


async def test_chunked_answers_are_joined(server) -> None:
    _, url = server
    assert await pool(url, "/chunked").request(b"") == (503, b"busy, wait")


async def test_an_answer_cut_short_or_unparsable_is_a_read_error(server) -> None:
    _, url = server
    with pytest.raises(ReadError, match="closed before the answer was whole"):
        await pool(url, "/cut").request(b"")
    with pytest.raises(ReadError, match="unparsable answer"):
        await pool(url, "/junk").request(b"")


async def test_a_refused_connection_is_a_connect_error_and_frees_its_slot() -> None:
    srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    srv.close()
    await srv.wait_closed()
    p = RawPool(f"http://127.0.0.1:{port}/ok", "POST", {}, limit=1)
    for _ in range(2):  # the failed open gave its slot back: the second tries again
        with pytest.raises(ConnectError):
            await p.request(b"")


async def test_a_timeout_closes_its_connection_and_waiters_get_the_slot(server) -> None:
    state, url = server
    slow = pool(url, "/slow", limit=1)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await slow.request(b"")
    # The connection with an answer still on its way is not reused: a new one is opened.
    waiting = [asyncio.ensure_future(slow.request(b"%d" % i)) for i in range(2)]
    assert [await w for w in waiting] == [(200, b"1:0"), (200, b"1:1")]
    assert slow.opened == 2 and state.connections == 2


def test_only_http_urls() -> None:
    with pytest.raises(ValueError, match="only http://"):
        RawPool("https://example.com/", "POST", {}, 1)
