"""Shared by the plan's tests: a real local HTTP server the load loop drives (``/ok`` answers
200 after 5 ms, ``/spin`` 200 after 20 ms of this thread's CPU, ``/busy`` 503)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class _Slow(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - the handler's API
        self.rfile.read(int(self.headers["content-length"]))
        if self.path == "/spin":
            # CPU a window can see: a /proc reading moves in 10 ms ticks, and a loaded host may
            # let only a request or two through the window, so 5 ms asleep could read as 0.
            end = time.thread_time() + 0.02
            while time.thread_time() < end:
                pass
        else:
            time.sleep(0.005)
        code = 503 if self.path == "/busy" else 200
        self.send_response(code)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the loop closes its connections at the window's end, mid-keep-alive


@pytest.fixture
def server() -> Iterator[str]:
    httpd = _Quiet(("127.0.0.1", 0), _Slow)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
