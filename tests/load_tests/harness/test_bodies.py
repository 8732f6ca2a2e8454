"""load_tests.harness.bodies: several request bodies in one file, and both clients sending them
in turn (wrk through its Lua script, the open-loop pool), against a local server that records
every body it is sent."""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from load_tests.harness.bodies import encode_bodies, read_bodies
from load_tests.harness.openloop import OpenLoopPool
from load_tests.harness.wrk import WrkTarget, find_wrk, lua_script, run_wrk

BODIES = [b'{"input":"one"}', b'{"input":["two","three"]}', b'{"input":"' + b"x" * 3000 + b'"}']
WRK = find_wrk(None)


def test_bodies_round_trip_and_a_plain_file_is_one_body(tmp_path: Path) -> None:
    many = tmp_path / "p.bodies"
    many.write_bytes(encode_bodies(BODIES))
    assert read_bodies(many) == BODIES
    one = tmp_path / "p.body"
    one.write_bytes(b'{"a":\n1}')  # any bytes, line breaks included
    assert read_bodies(one) == [b'{"a":\n1}']
    for bad in ([], [b""], [b'{"a":\n1}'], [b"x\r"]):
        with pytest.raises(ValueError):
            encode_bodies(bad)
    empty = tmp_path / "e.bodies"
    empty.write_bytes(b"\n")
    with pytest.raises(ValueError, match="no request bodies"):
        read_bodies(empty)


def test_lua_script_for_several_bodies_sends_them_in_turn(tmp_path: Path) -> None:
    script = lua_script(tmp_path / "p.bodies", {"Content-Type": "application/json"})
    assert "wrk.body" not in script  # each request's body comes from request()
    assert "request = function()" in script and "wrk.format(nil, nil, nil, bodies[" in script
    assert 'wrk.headers["Content-Type"] = "application/json"' in script
    assert "WRK_JSON" in script


class _Recorder(BaseHTTPRequestHandler):
    """200 with ``{}`` after reading the body (by its Content-Length), which it records."""

    protocol_version = "HTTP/1.1"
    seen: collections.Counter[bytes] = collections.Counter()
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        with self.lock:
            self.seen[body] += 1
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def recorder() -> Iterator[tuple[str, collections.Counter[bytes]]]:
    _Recorder.seen = collections.Counter()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/e", _Recorder.seen
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.skipif(WRK is None, reason="no wrk on PATH")
def test_wrk_sends_every_body_whole_and_about_equally(
    recorder: tuple[str, collections.Counter[bytes]], tmp_path: Path
) -> None:
    url, seen = recorder
    path = tmp_path / "p.bodies"
    path.write_bytes(encode_bodies(BODIES))
    target = WrkTarget(url, {"Content-Type": "application/json"}, path)
    cores = sorted(os.sched_getaffinity(0))[:1]
    assert WRK is not None
    r = run_wrk(
        WRK, target, connections=1, threads=1, duration_s=1.0, cores=cores, work_dir=tmp_path
    )
    assert r.get("error") is None and r["errors"] == 0, r
    assert set(seen) == set(BODIES), seen.keys()  # whole bodies: the server read Content-Length
    counts = [seen[b] for b in BODIES]
    assert max(counts) - min(counts) <= 1, counts  # one connection: strictly in turn


def test_openloop_sends_every_body_in_turn(
    recorder: tuple[str, collections.Counter[bytes]], tmp_path: Path
) -> None:
    url, seen = recorder
    path = tmp_path / "p.bodies"
    path.write_bytes(encode_bodies(BODIES))
    pool = OpenLoopPool(sorted(os.sched_getaffinity(0))[:1], 1, tmp_path)
    try:
        s = pool.point(url, {}, path, rate_per_s=90.0, duration_s=1.0, warmup_s=0.0, connections=4)
    finally:
        pool.close()
    assert s["errors"] == 0 and s["ok"] > 30, s
    assert set(seen) == set(BODIES)
    counts = [seen[b] for b in BODIES]
    assert max(counts) - min(counts) <= 1, counts
