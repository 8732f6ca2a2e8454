"""The throughput benchmark on the CPU: its clients against HAProxy's static no-op, and the
documented dry run (``--device cpu --quick``, one input per request) end to end, bounded in
time, with the peers (plain Ray Serve with ``@serve.batch``; LitServe when installed, else its
skipped rows) and the server's CPU per request. wrk (.tools/wrk or PATH) measured every req/s
figure the docs give, so its path runs here: scripts/test.sh provides wrk (Debian's package) and
sets SERVE_APP_REQUIRE_WRK=1, which makes a missing wrk a failure. Without that variable and
without wrk, the rows must say "no wrk"."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from load_tests.benchmarks.throughput.measure import Clients, probe
from load_tests.benchmarks.throughput.noop_server import NoopHAProxy
from load_tests.benchmarks.throughput.options import default_cores
from load_tests.benchmarks.throughput.payload import model_payload
from load_tests.benchmarks.throughput.render import render_markdown
from load_tests.benchmarks.throughput.rows import ROW_KEYS
from load_tests.harness.openloop import OpenLoopPool
from load_tests.harness.wrk import WrkTarget, find_wrk
from load_tests.workloads.texts import token_counts

ROOT = Path(__file__).resolve().parents[2]
WRK = find_wrk(str(ROOT / ".tools" / "wrk"))
REQUIRE_WRK = os.environ.get("SERVE_APP_REQUIRE_WRK") == "1"


@pytest.fixture(autouse=True)
def _wrk_when_required() -> None:
    if REQUIRE_WRK and WRK is None:
        pytest.fail(
            "SERVE_APP_REQUIRE_WRK=1 but there is no wrk (.tools/wrk or on PATH): "
            "scripts/test.sh installs Debian's wrk (apt-get install wrk)"
        )


def _cfg() -> dict[str, object]:
    server, client = default_cores(sorted(os.sched_getaffinity(0)))
    return {
        "server_cores": server,
        "client_cores": client,
        "connections": [4, 16],
        "duration_s": 1.0,
        "warmup_s": 0.3,
        "openloop_connections": 8,
        "openloop_fraction": 0.8,
        "fixed_rate_without_wrk": 100.0,
        "seed": 0,
        "pause_s": 0.3,
        "poisson": True,
        "wrk": str(ROOT / ".tools" / "wrk"),
    }


def test_both_clients_against_the_static_noop(tmp_path: Path) -> None:
    cfg = _cfg()
    payload = model_payload("resnet50", 1)
    mixed = model_payload("minilm", 16, workload="mixed")  # 64 bodies, wrk sends them in turn
    server = NoopHAProxy(cfg["server_cores"], [payload, mixed], tmp_path)  # type: ignore[arg-type]
    pool = OpenLoopPool(cfg["client_cores"], 1, tmp_path)  # type: ignore[arg-type]
    url = server.url_for(payload)
    try:
        status, answer = probe(url, payload)
        assert (status, answer) == (200, payload.response)
        assert probe(server.base_url + "/other", payload) == (200, b"{}")
        assert probe(server.url_for(mixed), mixed) == (200, mixed.response)  # every body
        clients = Clients(WRK, pool, cfg, tmp_path, print)
        target = WrkTarget(url, payload.headers, payload.write(tmp_path))
        tries = clients.wrk_tries(target, 1.0)
        point = clients.openloop(url, payload, 200.0, 1.0)
        mixed_url, mixed_path = server.url_for(mixed), mixed.write(tmp_path)
        assert mixed_path.suffix == ".bodies"
        once = Clients(WRK, pool, dict(cfg, connections=[4]), tmp_path, print)  # one wrk try
        mixed_tries = once.wrk_tries(WrkTarget(mixed_url, mixed.headers, mixed_path), 1.0)
    finally:
        pool.close()
        server.stop()
    if WRK is None:
        assert tries == []
    else:
        assert [t["connections"] for t in tries] == [4, 16]
        for t in tries:
            assert t["errors"] == 0 and t["requests_per_s"] > 500, t
    # 200/s for 1 s: a Poisson count, within 5 standard deviations (about 14 each).
    assert 130 <= point["requests"] <= 270, point
    assert point["errors"] == 0 and point["ok"] == point["requests"], point
    assert 0 < point["p50_ms"] <= point["p99_ms"] <= point["max_ms"], point
    # The mixed workload's bodies (up to ~10 KiB each) through the same no-op with wrk (the
    # open-loop client's turn through them: tests/load_tests/harness/test_bodies.py).
    for t in mixed_tries:
        assert t["errors"] == 0 and t["requests_per_s"] > 100, t


def test_cpu_quick_dry_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "tp"
    cmd = [sys.executable, "-m", "load_tests.benchmarks.throughput", "--out", str(out)]
    cmd += ["--device", "cpu"]
    cmd += ["--quick"]  # as documented: one replica, one input per request, tiny durations
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=200)
    detail = proc.stdout[-4000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, detail
    table = json.loads((out / "throughput.json").read_text())
    meta = json.loads((out / "meta.json").read_text())
    assert meta["cores"]["server"] and meta["machine"]["ray_version"], meta
    assert meta["command"].startswith("python -m load_tests.benchmarks.throughput --out ")
    assert meta["host"] and "commit" in meta and "dirty" in meta and "code_commit" in meta
    assert meta["wrk"] == WRK
    assert all(set(ROW_KEYS) <= set(r) for r in table)
    by = {(r["setup"], r["client"]): r for r in table if r["setup"] != "in_process"}

    ceiling = next(r for r in table if r["setup"] == "in_process")
    assert ceiling["status"] == "ok" and ceiling["ceiling_items_per_s"] > 0, ceiling

    litserve = importlib.util.find_spec("litserve") is not None
    served = ["client_ceiling", "serve_app", "ray_serve_noop", "ray_serve_batch"]
    for setup in served + (["litserve"] if litserve else []):
        wrk_row, open_row = by[(setup, "wrk")], by[(setup, "open-loop")]
        assert open_row["status"] == "ok", (setup, open_row.get("points"), detail[-2000:])
        assert open_row["errors"] == 0 and open_row["requests_per_s"] > 0, open_row
        if WRK is None:
            assert wrk_row["status"] == "skipped" and "no wrk" in wrk_row["note"]
        else:
            assert wrk_row["status"] == "ok", (setup, wrk_row, detail)
            assert wrk_row["requests_per_s"] > 0 and wrk_row["errors"] == 0, wrk_row
        # The server's CPU over the run, from /proc: something per request, split by kind.
        for row in (wrk_row, open_row) if WRK else (open_row,):
            assert row["server_cpu_s_per_1000_requests"] > 0, (setup, row)
            assert row["server_cpu_requests"] >= row["requests"] > 0, (setup, row)
    if not litserve:  # CI: LitServe is an optional extra
        row = by[("litserve", "open-loop")]
        assert row["status"] == "skipped" and "pip install" in row["note"], row

    kinds = {s: by[(s, "open-loop")]["server_cpu_s_by_kind"] for s in served}
    assert set(kinds["client_ceiling"]) == {"haproxy"}, kinds  # HAProxy's static no-op alone
    for setup in ("serve_app", "ray_serve_noop", "ray_serve_batch"):
        assert {"replica", "haproxy", "ray-daemons"} <= set(kinds[setup]), (setup, kinds)
        assert kinds[setup]["replica"] > 0, (setup, kinds)
    for setup in ("serve_app", "ray_serve_batch"):
        assert by[(setup, "open-loop")]["server_cpu_vs_noop"] > 0
    assert by[("ray_serve_batch", "open-loop")]["vs_ceiling"] > 0

    served = by[("serve_app", "open-loop")]
    assert served["model"] == "minilm" and served["replicas"] == 1
    assert served["ceiling_items_per_s"] == ceiling["ceiling_items_per_s"]
    client = [r for r in table if r["setup"] == "client_ceiling" and r["client"] == "open-loop"]
    assert {r["payload"] for r in client} == {"minilm-x1-float", "noop"}
    same = next(r for r in client if r["payload"] == served["payload"])
    assert served["client_ceiling_requests_per_s"] == same["requests_per_s"]
    assert served["budget_violations"] is None and "no NVML" in served["note"]  # CPU run
    assert (out / "server_reports.json").is_file()

    render = subprocess.run(
        [
            sys.executable,
            "-m",
            "load_tests.benchmarks.throughput.render",
            str(out / "throughput.json"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert render.returncode == 0, render.stderr
    assert "### serve_app: MiniLM-L6 embeddings" in render.stdout
    assert "### Plain Ray Serve no-op behind the same HAProxy ingress" in render.stdout
    assert "### Plain Ray Serve with @serve.batch (peer): MiniLM-L6" in render.stdout
    assert "### Server CPU per 1,000 requests" in render.stdout


def test_cpu_mixed_workload_ceiling(tmp_path: Path) -> None:
    """``--workload mixed`` through the tool, its ceiling phase alone to stay short (~15 s; the
    clients' part with the mixed bodies is in the test above, the rows' tokens/s and ratio in
    tests/load_tests): the in-process ceiling on the mixed texts, texts/s and tokens/s in its
    row, the tokens table rendered."""
    out = tmp_path / "tp"
    cmd = [sys.executable, "-m", "load_tests.benchmarks.throughput", "--out", str(out)]
    cmd += ["--device", "cpu", "--quick", "--workload", "mixed", "--phases", "ceiling"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    detail = proc.stdout[-4000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, detail
    table = json.loads((out / "throughput.json").read_text())
    payload = model_payload("minilm", 1, workload="mixed")
    assert payload.tokens_per_request is not None and len(payload.bodies) == 64

    ceiling = next(r for r in table if r["setup"] == "in_process")
    assert ceiling["status"] == "ok" and ceiling["workload"] == "mixed", (ceiling, detail)
    # the first 8 texts on the CPU, each once a pass: tokens/s over texts/s is their mean
    # tokens (real ones, not padding)
    assert ceiling["ceiling_texts"] == 8, ceiling
    mean_tokens = sum(token_counts(payload.texts[:8])) / 8
    assert ceiling["tokens_per_s"] / ceiling["texts_per_s"] == pytest.approx(mean_tokens), ceiling
    assert ceiling["ceiling_batch"] in (1, 8) and ceiling["ceiling_tokens_per_s"] > 0
    assert [r["setup"] for r in table] == ["in_process"]

    assert "### Texts and tokens per second" in render_markdown(table)
