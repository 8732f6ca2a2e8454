"""load_tests.benchmarks.throughput.noop_server: HAProxy's static no-op configuration."""

from __future__ import annotations

from pathlib import Path

from load_tests.benchmarks.throughput.noop_server import (
    bufsize_for,
    haproxy_config,
    max_connections,
)


def test_haproxy_noop_config() -> None:
    answers = {"minilm-x1-float": Path("/w/minilm-x1-float.response")}
    text = haproxy_config(18999, 16, bufsize_for(20_000), max_connections(20000), answers)
    assert "bind 127.0.0.1:18999" in text and "nbthread 16" in text
    assert "option http-buffer-request" in text
    ret = "http-request return status 200 content-type application/json"
    lines = text.splitlines()
    first = lines.index(
        f"  {ret} file /w/minilm-x1-float.response if {{ path_beg /minilm-x1-float/ }}"
    )
    assert lines[first + 1] == f'  {ret} string "{{}}"'  # anything else: {}
    assert "tune.bufsize 32768" in text and "maxconn 9900" in text
    assert bufsize_for(2) == 16384 and bufsize_for(400_000) == 524288
