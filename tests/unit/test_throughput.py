"""Unit tests for load_tests.throughput: wrk's script and output, the open-loop summary, the
ceiling search, budget violations, rows, merging and rendering (no Ray, no GPU, no network)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from load_tests.throughput import rows, stats
from load_tests.throughput.cli import plan_jobs
from load_tests.throughput.noop_server import bufsize_for, haproxy_config, max_connections
from load_tests.throughput.options import (
    default_cores,
    format_cores,
    parse_cores,
    shared_physical_cores,
)
from load_tests.throughput.payload import model_payload, noop_payload
from load_tests.throughput.render import render_markdown
from load_tests.throughput.setups import noop_doc, serve_app_doc
from load_tests.throughput.wrk import (
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


# ------------------------------------------------------------------ wrk


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


# ------------------------------------------------------------------ open loop


def _worker_array(times: list[float], lat: list[float], status: list[int]) -> np.ndarray:
    lag = [0.001] * len(times)
    return np.array([times, lat, lag, status], dtype=np.float64)


def test_summarise_openloop_window_errors_and_percentiles() -> None:
    codes = stats.STATUS_CODES
    a = _worker_array(
        [0.2, 1.0, 1.5, 2.0, 2.5],  # warm-up 0.5 s: the first is not measured
        [0.4, 0.010, 0.020, 0.030, 0.9],  # the last completes after the window's end (3.0 s)
        [200, 200, 200, 503, 200],
    )
    b = _worker_array([1.2, 1.4, 2.9], [0.040, float("nan"), 0.050], [200, codes["timeout"], 200])
    c = _worker_array([0.7], [float("nan")], [codes["dropped"]])
    results = [{"cpu_frac": 0.5, "start_late_s": 0.0}, {"cpu_frac": 0.7, "start_late_s": 0.01}]
    s = stats.summarise_openloop([a, b, c], results, 4.0, duration_s=2.5, warmup_s=0.5)
    assert s["requests"] == 8
    assert s["ok"] == 5  # 1.0, 1.5, 2.5, 1.2, 2.9
    assert s["error_counts"] == {"status": 1, "timeout": 1, "dropped": 1}
    assert s["errors"] == 3
    # 2xx completing inside [0.5, 3.0), warm-up ones too: 0.2+0.4, 1.01, 1.52, 1.24, 2.95
    # (not 2.5+0.9 = 3.4)
    assert s["requests_per_s"] == pytest.approx(5 / 2.5)
    ok_latencies = np.array([0.010, 0.020, 0.9, 0.040, 0.050])
    assert s["p50_ms"] == pytest.approx(float(np.percentile(ok_latencies, 50)) * 1e3)
    assert s["p99_ms"] == pytest.approx(float(np.percentile(ok_latencies, 99)) * 1e3)
    assert s["max_ms"] == pytest.approx(900.0)
    assert s["scheduled_per_s"] == pytest.approx(8 / 2.5)
    assert s["client_cpu_frac_max"] == 0.7
    assert s["client_keeps_up"] is False  # one request dropped at the in-flight cap


def test_summarise_openloop_keeps_up_judges_lag_and_cpu() -> None:
    a = _worker_array([0.1, 0.2], [0.001, 0.001], [200, 200])
    ok = stats.summarise_openloop([a], [{"cpu_frac": 0.2}], 10.0, 1.0, 0.0)
    assert ok["client_keeps_up"] is True and ok["errors"] == 0
    busy = stats.summarise_openloop([a], [{"cpu_frac": 0.99}], 10.0, 1.0, 0.0)
    assert busy["client_keeps_up"] is False
    late = a.copy()
    late[2] = [0.001, 0.050]  # sent 50 ms late
    assert stats.summarise_openloop([late], [{}], 10.0, 1.0, 0.0)["client_keeps_up"] is False


def test_ceiling_point_passes_against_its_own_schedule() -> None:
    point = {"client_keeps_up": True, "errors": 0, "scheduled_per_s": 90.0}
    assert stats.ceiling_point_passes({**point, "requests_per_s": 88.0})
    assert not stats.ceiling_point_passes({**point, "requests_per_s": 87.0})
    assert not stats.ceiling_point_passes({**point, "requests_per_s": 90.0, "errors": 1})
    assert not stats.ceiling_point_passes({**point, "requests_per_s": 90.0, "client_keeps_up": 0})


def _search(passes_below: float, start: float, max_rate: float, limit: int = 8) -> list[float]:
    history: list[tuple[float, bool]] = []
    while len(history) < limit:
        rate = stats.next_ceiling_rate(history, start, 2.0, max_rate)
        if rate is None:
            break
        history.append((rate, rate < passes_below))
    return [round(r) for r, _ in history]


def test_ceiling_search_climbs_then_bisects_once() -> None:
    assert _search(70000, 25000, 200000) == [25000, 50000, 100000, 70711]


def test_ceiling_search_stops_at_max_rate() -> None:
    assert _search(1e9, 25000, 100000) == [25000, 50000, 100000]


def test_ceiling_search_steps_down_when_the_start_fails() -> None:
    assert _search(20000, 25000, 200000) == [25000, 6250, 12500, 17678]
    assert _search(1000, 25000, 200000) == [25000, 6250, 1562]


def test_client_ceiling_is_the_highest_rate_offered_and_sustained() -> None:
    def point(offered: float, carried: float, keeps_up: bool = True) -> dict[str, object]:
        return {
            "offered_per_s": offered,
            "scheduled_per_s": offered,
            "requests_per_s": carried,
            "errors": 0,
            "client_keeps_up": keeps_up,
        }

    points = [point(25000, 24990), point(50000, 49000), point(100000, 61000, keeps_up=False)]
    got = stats.client_ceiling(points)
    assert got["sustained_per_s"] == 50000 and got["sustained_offered_per_s"] == 50000
    assert got["max_carried_per_s"] == 61000 and got["best_point"] is points[1]
    assert stats.client_ceiling([point(100, 10)])["sustained_per_s"] is None


# ------------------------------------------------------------------ memory, shares


def test_budget_violations_by_pid() -> None:
    samples = [
        {"source": "nvml", "pid": 1, "used_bytes": 100},
        {"source": "nvml", "pid": 1, "used_bytes": 101},  # over 100
        {"source": "nvml", "pid": 2, "used_bytes": 300},
        {"source": "nvml", "pid": 3, "used_bytes": 10**12},  # no budget known: not judged
        {"source": "server", "pid": 2, "used_bytes": 10**12},
        {"source": "nvml", "pid": 2, "used_bytes": None},
    ]
    got = stats.budget_violations(samples, {1: 100, 2: 200})
    assert got == {"budget_violations": 2, "nvml_samples_judged": 3, "peak_bytes": {1: 101, 2: 300}}


@pytest.mark.parametrize("n,share", [(1, 1.0), (4, 0.25), (8, 0.12), (12, 0.08), (16, 0.06)])
def test_replica_share_fits_one_gpu(n: int, share: float) -> None:
    assert stats.replica_share(n) == share
    assert n * stats.replica_share(n) <= 1.0


def test_replica_cpus_place_on_the_server_cores() -> None:
    assert stats.replica_cpus(4, 16) == 1.0
    assert stats.replica_cpus(16, 16) == 1.0
    assert stats.replica_cpus(16, 8) == 0.5
    assert stats.replica_cpus(12, 8) == 0.66
    assert 12 * stats.replica_cpus(12, 8) <= 8


# ------------------------------------------------------------------ options, plan, configs


def test_core_lists() -> None:
    assert parse_cores("0-3,8, 10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cores([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert default_cores(range(32), _alone) == (list(range(16)), list(range(16, 32)))
    assert default_cores([0, 1], _alone) == ([0], [1])
    assert default_cores([3], _alone) == ([3], [3])


def _alone(cpu: int) -> set[int]:
    return {cpu}


def _pairs(cpu: int) -> set[int]:
    """CPU n and n + 16 share a physical core, as on many 32-thread hosts."""
    return {cpu % 16, cpu % 16 + 16}


def test_default_cores_keep_hyperthread_siblings_on_one_side() -> None:
    siblings = _pairs
    server, client = default_cores(range(32), siblings)
    assert server == [*range(0, 8), *range(16, 24)]
    assert client == [*range(8, 16), *range(24, 32)]
    assert shared_physical_cores(server, client, siblings) == []
    naive = shared_physical_cores(list(range(16)), list(range(16, 32)), siblings)
    assert naive[:2] == [(0, 16), (1, 17)] and len(naive) == 16
    for bad in ("", "3-1", "a", "-1"):
        with pytest.raises(ValueError):
            parse_cores(bad)


def test_plan_is_replica_major_with_the_noop_last_at_each_count() -> None:
    keys = [j["key"] for j in plan_jobs(["minilm", "resnet50"], [4, 8], ["serve", "noop"])]
    assert keys == ["minilm/r4", "resnet50/r4", "noop/r4", "minilm/r8", "resnet50/r8", "noop/r8"]
    assert [j["key"] for j in plan_jobs(["minilm"], [4], ["noop"])] == ["noop/r4"]


def test_serve_app_doc_is_the_default_config_with_dummy_fp16_weights() -> None:
    from serve_app.config.deploy import check_deploy_config

    cfg = {"server_cores": list(range(16))}
    doc = serve_app_doc("resnet50", 12, cfg, 8123)
    assert check_deploy_config(doc) == []
    app = doc["applications"][0]
    assert app["import_path"] == "serve_app.app:build_app" and app["route_prefix"] == "/"
    assert app["args"]["adapter"] == "image-classification"
    assert (app["args"]["load_format"], app["args"]["dtype"]) == ("dummy", "float16")
    assert app["args"]["model_name"] == "resnet50"
    dep = app["deployments"][0]
    assert dep["num_replicas"] == 12
    assert dep["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.08}
    assert doc["http_options"] == {"host": "127.0.0.1", "port": 8123}
    minilm = serve_app_doc("minilm", 4, cfg, 8123)["applications"][0]["args"]
    assert minilm["adapter"] == "embeddings" and minilm["model_name"] == "all-MiniLM-L6-v2"


def test_replica_share_option_sets_every_replicas_gpu_share() -> None:
    from load_tests.throughput.options import build_parser, make_config
    from load_tests.throughput.setups import gpu_share

    parser = build_parser()
    argv = ["--out", "/tmp/x", "--gpu", "0,1", "--replica-share", "0.25", "--replicas", "4,8"]
    cfg = make_config(parser.parse_args(argv), parser)
    assert (cfg["gpu"], cfg["replica_share"], cfg["replicas"]) == ("0,1", 0.25, [4, 8])
    for n in (4, 8):  # 4 x 0.25 fill one GPU; 8 x 0.25 fill two
        dep = serve_app_doc("minilm", n, cfg, 8123)["applications"][0]["deployments"][0]
        assert dep["num_replicas"] == n and dep["ray_actor_options"]["num_gpus"] == 0.25
    default = make_config(parser.parse_args(["--out", "/tmp/x"]), parser)
    assert default["replica_share"] is None and gpu_share(8, default) == 0.12
    with pytest.raises(SystemExit):
        make_config(parser.parse_args(["--out", "/tmp/x", "--replica-share", "1.5"]), parser)


def test_client_payloads_follow_the_served_setups_or_the_models_alone() -> None:
    from load_tests.throughput.setups import client_payloads

    cfg = {"models": ["minilm"], "inputs_per_request": [64, 1], "encoding_format": "float"}
    keys = {
        phases: [p.key for p in client_payloads(dict(cfg, phases=phases.split(",")))]
        for phases in ("client,serve,noop", "client,noop", "client")
    }
    assert keys == {
        "client,serve,noop": ["minilm-x64-float", "minilm-x1-float", "noop"],
        "client,noop": ["noop"],
        "client": ["minilm-x64-float", "minilm-x1-float"],  # added to an earlier run's rows
    }


def test_noop_doc_validates_as_a_serve_config() -> None:
    from ray.serve.schema import ServeDeploySchema

    doc = noop_doc(8, {"server_cores": [0, 1, 2, 3]}, 8123)
    ServeDeploySchema.model_validate(doc)
    dep = doc["applications"][0]["deployments"][0]
    assert dep["num_replicas"] == 8 and dep["ray_actor_options"] == {"num_cpus": 0.5}
    assert dep["logging_config"] == {"enable_access_log": False}


def test_payloads() -> None:
    raw = model_payload("resnet50", 1)
    assert raw.content_type == "image/jpeg" and raw.body[:2] == b"\xff\xd8"
    assert 10_000 < len(raw.body) < 30_000 and raw.path == "/v1/classify"
    many = json.loads(model_payload("resnet50", 3).body)
    assert len(many["input"]) == 3 and many["model"] == "resnet50"
    text = json.loads(model_payload("minilm", 1).body)
    assert isinstance(text["input"], str) and 3 <= len(text["input"].split()) <= 8
    assert text["model"] == "all-MiniLM-L6-v2" and "encoding_format" not in text
    b64 = json.loads(model_payload("minilm", 16, "base64").body)
    assert len(b64["input"]) == 16 and b64["encoding_format"] == "base64"
    assert noop_payload().body == b"{}"
    # The no-op's answers are shaped like serve_app's: 384 shortest float32 per text.
    vectors = json.loads(model_payload("minilm", 2).response)["data"]
    assert [len(v["embedding"]) for v in vectors] == [384, 384]
    assert sum(x * x for x in vectors[0]["embedding"]) == pytest.approx(1.0, abs=1e-5)
    b64 = json.loads(model_payload("minilm", 1, "base64").response)["data"][0]["embedding"]
    assert len(b64) == 2048  # base64 of 384 float32
    tops = json.loads(model_payload("resnet50", 3).response)["data"]
    assert [len(t["top_k"]) for t in tops] == [5, 5, 5]
    with pytest.raises(ValueError):
        model_payload("gpt", 1)


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


# ------------------------------------------------------------------ rows


def _common(**kw: object) -> dict[str, object]:
    base = {"setup": "serve_app", "model": "minilm", "payload": "minilm-x16-float"}
    return {**base, "inputs_per_request": 16, "replicas": 4, "mps": False, **kw}


def test_wrk_row_takes_the_best_try_and_counts_items() -> None:
    tries = [
        {**parse_wrk_output(WRK_OUTPUT), "connections": 64, "threads": 16},
        {"connections": 256, "threads": 16, "error": "wrk exit 1"},
    ]
    row = rows.wrk_row(_common(), tries)
    assert row["status"] == "ok" and row["client"] == "wrk" and row["connections"] == 64
    assert row["requests_per_s"] == 9950.0 and row["items_per_s"] == 9950.0 * 16
    assert row["errors"] == 405 and row["p99_ms"] == 9.0
    assert [t.get("error") for t in row["tries"]] == [None, "wrk exit 1"]
    assert set(rows.ROW_KEYS) <= set(row)
    failed = rows.wrk_row(_common(), tries[1:])
    assert failed["status"] == "error" and "wrk exit 1" in failed["note"]


def test_apply_ceilings_fills_ratios_and_flags_low_headroom() -> None:
    table = [
        rows.new_row(
            setup="in_process",
            model="minilm",
            status="ok",
            ceiling_items_per_s=1e5,
            ceiling_batch=512,
        ),
        rows.new_row(
            setup="client_ceiling",
            payload="minilm-x16-float",
            client="wrk",
            status="ok",
            requests_per_s=40000.0,
        ),
        rows.new_row(
            setup="client_ceiling",
            payload="minilm-x16-float",
            client="open-loop",
            status="ok",
            requests_per_s=20000.0,
        ),
        rows.new_row(
            **_common(), client="wrk", status="ok", requests_per_s=2000.0, items_per_s=32000.0
        ),
        rows.new_row(
            **_common(),
            client="open-loop",
            status="ok",
            requests_per_s=8000.0,
            items_per_s=128000.0,
        ),
        rows.new_row(**_common(payload="other"), client="wrk", status="ok", requests_per_s=10.0),
    ]
    flags = rows.apply_ceilings(table)
    wrk_row, ol_row, other = table[3], table[4], table[5]
    assert wrk_row["ceiling_items_per_s"] == 1e5 and wrk_row["ceiling_batch"] == 512
    assert wrk_row["vs_ceiling"] == pytest.approx(0.32)
    assert wrk_row["client_ceiling_requests_per_s"] == 40000.0
    assert wrk_row["client_headroom"] == 20.0 and wrk_row["flags"] == []
    assert ol_row["client_headroom"] == 2.5
    assert ol_row["flags"] == ["client ceiling under 3x: the client may be the limit"]
    assert other["flags"] == ["client ceiling not measured for this payload"]
    assert len(flags) == 2 and "8,000/s against a client ceiling of 20,000/s" in flags[0]
    assert rows.apply_ceilings(table) == flags  # idempotent: flags are not duplicated
    assert ol_row["flags"] == ["client ceiling under 3x: the client may be the limit"]


def test_openloop_ceiling_flag_under_25k_on_16_cores() -> None:
    table = [
        rows.new_row(
            setup="client_ceiling", client="open-loop", payload="p", requests_per_s=24000.0
        )
    ]
    assert len(rows.openloop_ceiling_flags(table, 16)) == 1
    assert rows.openloop_ceiling_flags(table, 8) == []


def test_merge_rows_keeps_previous_measurements_not_redone() -> None:
    old_ok = rows.new_row(**_common(replicas=8), client="wrk", status="ok", requests_per_s=1.0)
    old_r4 = rows.new_row(**_common(), client="wrk", status="ok", requests_per_s=2.0)
    new_r4 = rows.new_row(**_common(), client="wrk", status="ok", requests_per_s=3.0)
    new_skip = rows.new_row(**_common(replicas=8), client="wrk", status="skipped")
    merged = rows.merge_rows([old_ok, old_r4], [new_r4, new_skip])
    assert [(r["replicas"], r["requests_per_s"]) for r in merged] == [(8, 1.0), (4, 3.0)]


# ------------------------------------------------------------------ render


def test_render_markdown_tables() -> None:
    table = [
        rows.new_row(
            setup="in_process",
            model="minilm",
            status="ok",
            ceiling_items_per_s=56000.0,
            ceiling_batch=256,
            items_per_s_by_batch={"64": 16600.0, "256": 56000.0},
            note="float16 on cuda, eager",
        ),
        rows.new_row(
            setup="client_ceiling",
            payload="minilm-x1-float",
            client="wrk",
            status="ok",
            requests_per_s=150000.0,
            connections=256,
            p99_ms=2.0,
        ),
        rows.new_row(
            **_common(payload="minilm-x1-float", inputs_per_request=1, num_gpus=0.25),
            client="wrk",
            status="ok",
            requests_per_s=2700.0,
            items_per_s=2700.0,
            p50_ms=20.0,
            p99_ms=45.5,
            errors=0,
            requests=21600,
            client_ceiling_requests_per_s=150000.0,
            client_headroom=55.6,
            budget_violations=0,
        ),
        rows.new_row(
            setup="ray_serve_noop",
            replicas=4,
            client="wrk",
            status="skipped",
            note="time budget: 12 s left",
        ),
    ]
    md = render_markdown(table, {"flags": ["x: 1/s against 2/s"], "host": "h", "machine": {}})
    assert "### The model alone (in-process ceiling)" in md
    assert "| minilm | 56,000 | 256 | 64: 16,600, 256: 56,000 | float16 on cuda, eager |" in md
    assert "| minilm-x1-float | 150,000 (c256) | 2.0 ms | - | - | - | ok |" in md
    assert (
        "| 4 x 0.25 | 1 | wrk | 2,700 | 2,700 | - | 20.0 ms | 45.5 ms | 0 (0.00%) | 150,000 "
        "| 55.60x | 0 | ok |"
    ) in md
    assert "| 4 | wrk | - | - | - | - | - | - | skipped: time budget: 12 s left |" in md
    assert "- x: 1/s against 2/s" in md


def test_plan_estimate_counts_the_jobs_that_fit_the_budget() -> None:
    from load_tests.throughput.options import build_parser, make_config
    from load_tests.throughput.setups import plan_estimate

    parser = build_parser()
    argv = ["--out", "/tmp/x", "--device", "cpu", "--quick", "--replicas", "1,2"]
    cfg = make_config(parser.parse_args(argv), parser)
    jobs = plan_jobs(cfg["models"], cfg["replicas"], cfg["phases"])
    assert [j["key"] for j in jobs] == ["minilm/r1", "noop/r1", "minilm/r2", "noop/r2"]
    roomy = plan_estimate(dict(cfg, max_time_s=10_000.0), jobs)
    assert roomy["jobs_fitting"] == 4 and [j["key"] for j in roomy["jobs"]] == [
        j["key"] for j in jobs
    ]
    fixed = roomy["ceiling_s"] + roomy["client_s"] + roomy["ray_start_s"]
    assert roomy["total_s"] == pytest.approx(
        fixed + cfg["teardown_reserve_s"] + sum(j["s"] for j in roomy["jobs"]), abs=4
    )
    assert plan_estimate(dict(cfg, max_time_s=fixed), jobs)["jobs_fitting"] == 0


def test_missing_rows_mark_what_was_not_reached() -> None:
    from load_tests.throughput.cli import missing_rows

    cfg = {"inputs_per_request": [1, 16], "encoding_format": "float", "mps": False}
    jobs = plan_jobs(["minilm"], [4], ["serve", "noop"])
    done = [
        rows.new_row(
            setup="serve_app",
            model="minilm",
            replicas=4,
            payload="minilm-x1-float",
            client=client,
            status="ok",
        )
        for client in ("wrk", "open-loop")
    ]
    got = {
        (r["setup"], r["payload"], r["client"], r["status"]) for r in missing_rows(jobs, cfg, done)
    }
    assert got == {
        ("serve_app", "minilm-x16-float", "wrk", "skipped"),
        ("serve_app", "minilm-x16-float", "open-loop", "skipped"),
        ("ray_serve_noop", "noop", "wrk", "skipped"),
        ("ray_serve_noop", "noop", "open-loop", "skipped"),
    }
