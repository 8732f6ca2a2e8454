"""load_tests.harness.wrk: the Lua script, the command line, the output and the best try."""

from __future__ import annotations

from pathlib import Path

import pytest

from load_tests.harness.wrk import (
    best_try,
    lua_script,
    lua_string,
    parse_wrk_output,
    wrk_command,
)

WRK_OUTPUT = """Running 8s test @ http://127.0.0.1:8000/v1/embeddings
  16 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     4.10ms    1.20ms  40.00ms   90.00%
  Latency Distribution
     50%    3.90ms
     99%    9.00ms
  80000 requests in 8.00s, 12.00MB read
  Non-2xx or 3xx responses: 400
Requests/sec:  10000.00
WRK_JSON {"requests":80000,"duration_us":8000000,"bytes":12582912,"errors":{"connect":0,"read":2,"write":0,"status":400,"timeout":3},"latency_us":{"p50":3900,"p90":5500,"p99":9000,"max":40000,"mean":4100.5}}
"""  # noqa: E501


def test_parse_wrk_output_counts_non_2xx_as_errors() -> None:
    r = parse_wrk_output(WRK_OUTPUT)
    assert r["requests"] == 80000
    assert r["ok"] == 79600  # 400 status errors are not successes
    assert r["duration_s"] == 8.0
    assert r["requests_per_s"] == 79600 / 8.0
    assert r["errors"] == 405
    assert r["error_counts"] == {"connect": 0, "read": 2, "write": 0, "status": 400, "timeout": 3}
    assert (r["p50_ms"], r["p90_ms"], r["p99_ms"], r["max_ms"]) == (3.9, 5.5, 9.0, 40.0)
    assert r["mean_ms"] == pytest.approx(4.1005)


def test_parse_wrk_output_without_the_json_line_raises() -> None:
    with pytest.raises(ValueError, match="WRK_JSON"):
        parse_wrk_output("Running 8s test\nunable to connect to 127.0.0.1:1 Connection refused\n")


def test_lua_script_sets_method_headers_body_and_done(tmp_path: Path) -> None:
    body = tmp_path / 'a "body".bin'
    script = lua_script(body, {"Content-Type": "image/jpeg"}, "POST")
    assert 'wrk.method = "POST"' in script
    assert 'wrk.headers["Content-Type"] = "image/jpeg"' in script
    assert f"io.open({lua_string(str(body))}, " in script
    assert 'wrk.body = f:read("*a")' in script
    assert "done = function(summary, latency, requests)" in script
    assert "WRK_JSON" in script and "latency:percentile(99)" in script
    assert lua_string('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'


def test_wrk_command_pins_and_never_has_more_threads_than_connections(tmp_path: Path) -> None:
    cmd = wrk_command(
        "/x/wrk",
        "http://127.0.0.1:1/v1/embeddings",
        tmp_path / "s.lua",
        threads=16,
        connections=8,
        duration_s=8.0,
        timeout_s=5.0,
        cores=[16, 17],
    )
    i = cmd.index("/x/wrk")
    assert cmd[i:] == [
        "/x/wrk",
        "-t8",
        "-c8",
        "-d8s",
        "--timeout=5s",
        "--latency",
        "-s",
        str(tmp_path / "s.lua"),
        "http://127.0.0.1:1/v1/embeddings",
    ]
    assert cmd[:i] in ([], [cmd[0], "-c", "16,17"])  # taskset when the machine has it


def test_best_try_highest_rate_then_fewer_connections() -> None:
    tries = [
        {"connections": 64, "requests_per_s": 900.0},
        {"connections": 256, "requests_per_s": 1200.0},
        {"connections": 128, "error": "wrk exit 1"},
        {"connections": 32, "requests_per_s": 1200.0},
    ]
    assert best_try(tries) == {"connections": 32, "requests_per_s": 1200.0}
    assert best_try([{"connections": 1, "error": "x"}]) is None
