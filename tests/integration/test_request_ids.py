"""Request ids over real HTTP (HAProxy, then the replica's own server) on the session cluster:
``x-request-id`` echoed on a 200, a 400, a 404 and a 500, a bad one replaced, and the id found
in the replica's JSON log file (the Ray session's ``logs/serve/``) on the lines of its request:
the 500's error-id line with its traceback, logged on the model thread by the batch."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve_app.ops.haproxy import haproxy_servers
from serve_app.startup.ray_compat import session_dir

APP = "reqid"
USER = "tests.integration.failing_model:Doubles"
LOGS = {"encoding": "JSON", "enable_access_log": False}


@pytest.fixture(scope="module")
def app(cluster) -> Iterator[str]:
    base = cluster.deploy(
        APP,
        f"/{APP}",
        {"adapter": USER, "device": "cpu", "max_batch_size": 8},
        ray_actor_options={"num_cpus": 0.25},
        logging_config=LOGS,
    )
    # Until HAProxy has the replica UP it sends requests to Serve's fallback proxy, whose own
    # middleware echoes x-request-id as sent (docs/logging.md): wait for the replica's server.
    wait_replica_up()
    yield base
    cluster.delete(APP)


def wait_replica_up(timeout_s: float = 60.0, app: str = APP) -> None:
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    prefix = f"http-{app}/SERVE_REPLICA_{app}-model-"
    deadline = time.monotonic() + timeout_s
    servers: dict[str, Any] = {}
    while time.monotonic() < deadline:
        servers = haproxy_servers(node_id)
        if any(k.startswith(prefix) and v["status"] == "UP" for k, v in servers.items()):
            return
        time.sleep(0.25)
    raise AssertionError(f"no {prefix}* server UP in HAProxy after {timeout_s:.0f} s: {servers}")


def records(app: str = APP) -> list[dict[str, Any]]:
    """Every JSON line of this application's replica log files."""
    sdir = session_dir()
    assert sdir is not None
    out = []
    for path in sorted(Path(sdir, "logs", "serve").glob(f"replica_{app}_model_*.log*")):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def lines_of(
    request_id: str, timeout_s: float = 10.0, want: str = "", app: str = APP
) -> list[dict[str, Any]]:
    """The log records whose request_id names ``request_id`` (alone, or among a batch's ids),
    waiting up to ``timeout_s`` for one whose message holds ``want`` when that is given."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [r for r in records(app) if request_id in str(r.get("request_id", "")).split(",")]
        if not want or any(want in r.get("message", "") for r in found):
            return found
        if time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_ids_are_echoed_on_every_answer_and_bad_ones_replaced(app: str) -> None:
    ok = httpx.post(f"{app}/v1/predict", json={"inputs": [1, 2]}, headers={"x-request-id": "ok-1"})
    assert ok.status_code == 200 and ok.json()["outputs"] == [2.0, 4.0]
    assert ok.headers["x-request-id"] == "ok-1"
    bad = httpx.post(f"{app}/v1/predict", content=b"{", headers={"x-request-id": "bad-1"})
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "bad-1"
    assert bad.json()["error"]["request_id"] == "bad-1"
    missing = httpx.get(f"{app}/nope", headers={"x-request-id": "nf-1"})
    assert missing.status_code == 404 and missing.headers["x-request-id"] == "nf-1"
    assert missing.json()["error"]["request_id"] == "nf-1"
    # unsafe: replaced by a fresh id, never echoed
    odd = httpx.get(f"{app}/nope", headers={"x-request-id": "a b,c<script>"})
    assert re.fullmatch(r"[0-9a-f]{32}", odd.headers["x-request-id"])
    assert odd.json()["error"]["request_id"] == odd.headers["x-request-id"]
    # none sent: Serve's own id, echoed
    assigned = httpx.post(f"{app}/v1/predict", json={"inputs": [3]})
    assert assigned.status_code == 200 and len(assigned.headers["x-request-id"]) >= 32


def test_a_500s_error_id_line_and_traceback_carry_the_request_id(app: str) -> None:
    failed = httpx.post(
        f"{app}/v1/predict", json={"inputs": [1, "fail"]}, headers={"x-request-id": "boom-1"}
    )
    assert failed.status_code == 500 and failed.headers["x-request-id"] == "boom-1"
    error = failed.json()["error"]
    assert error["request_id"] == "boom-1"
    error_id = re.search(r"error id ([0-9a-f]+)", error["message"]).group(1)  # type: ignore[union-attr]
    found = lines_of("boom-1", want=error_id)
    line = next(r for r in found if f"error id {error_id}" in r["message"])
    assert line["levelname"] == "ERROR"
    assert "asked to fail by its input" in line["exc_text"]  # the traceback, on the same line
    assert line["deployment"] == f"{APP}_model" and line["replica"] and line["application"] == APP
    # a success logs nothing of its own at INFO (the access log is off on purpose); the
    # replica's first success logs its start-up line once, so one goes first
    warm = httpx.post(f"{app}/v1/predict", json={"inputs": [1]}, headers={"x-request-id": "w-1"})
    assert warm.status_code == 200
    ok = httpx.post(f"{app}/v1/predict", json={"inputs": [1]}, headers={"x-request-id": "ok-2"})
    assert ok.status_code == 200
    assert lines_of("ok-2", timeout_s=0.5) == []
    # the access log's records are not even built here: the gate found Serve's logger
    assert not [r for r in records() if "logger to gate" in r.get("message", "")]


def test_a_deployment_with_the_access_log_on_gets_a_line_per_request(cluster) -> None:
    # serve_app skips building Serve's access-log records only while they would be dropped
    # (serving/accesslog.py); turned on, each request still gets its line
    name = "reqacc"
    base = cluster.deploy(
        name,
        f"/{name}",
        {"adapter": USER, "device": "cpu", "max_batch_size": 8},
        ray_actor_options={"num_cpus": 0.25},
        logging_config={"encoding": "JSON", "enable_access_log": True},
    )
    try:
        wait_replica_up(app=name)
        ok = httpx.post(
            f"{base}/v1/predict", json={"inputs": [1]}, headers={"x-request-id": "acc-1"}
        )
        assert ok.status_code == 200
        found = lines_of("acc-1", want=f"POST /{name} 200", app=name)
        (line,) = [r for r in found if f"POST /{name} 200" in r["message"]]
        assert line["filename"] == "replica.py"  # Serve's own caller, not the gate
    finally:
        cluster.delete(name)
