"""``serve-app status``: reading ``GET /v1/memory`` and rendering it (exact text)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from serve_app.ops.cli import main
from serve_app.ops.ports import free_port
from serve_app.ops.status import StatusUnavailable, read_memory_report, render_status

GIB = 1 << 30
HEADER = (
    "REPLICA    APP                PID      GPU            BUDGET      ENFORCE  FRAC   ALLOC       "
    "RESERVED    PEAK        OVERHEAD    NVML        BATCH  OOMS  FREES "
)
REPLICA = {
    "replica_id": "abcdefghijkl",
    "app": "all-MiniLM-L6-v2",
    "pid": 4242,
    "gpu_uuid": "GPU-c0ffee00-0000-4000-8000-000000000001",
    "budget_bytes": 20 * GIB,
    "enforcement": "torch",
    "torch_fraction": 0.2462,
    "allocated_bytes": GIB // 2,
    "reserved_bytes": GIB,
    "peak_reserved_bytes": 3 * GIB // 2,
    "non_torch_overhead_bytes": GIB // 4,
    "nvml_process_bytes": None,
    "max_batch_size": 32,
    "oom_recoveries": 0,
    "cache_frees": 3,
}


def test_no_replicas() -> None:
    assert render_status({}) == HEADER + "\n(no replica has reported yet)"
    assert render_status({"replicas": [], "gpus": None, "controller": None}) == (
        HEADER + "\n(no replica has reported yet)"
    )


def test_replica_row_truncates_ids_formats_bytes_and_dashes_missing_values() -> None:
    lines = render_status({"replicas": [REPLICA]}).split("\n")
    assert lines == [
        HEADER,
        "abcdefghij all-MiniLM-L6-v2   4242     GPU-c0ffee00-0 20.00G      torch    0.246  "
        "0.50G       1.00G       1.50G       0.25G       -           32     0     3     ",
    ]


def test_cpu_replica_row() -> None:
    cpu = {**REPLICA, "replica_id": "r1", "gpu_uuid": None, "budget_bytes": 0, "enforcement": None}
    cpu.update(torch_fraction=0.0, allocated_bytes=0, reserved_bytes=0, peak_reserved_bytes=0)
    cpu.update(non_torch_overhead_bytes=0, max_batch_size=4, cache_frees=0)
    lines = render_status({"replicas": [cpu]}).split("\n")
    assert lines[1] == (
        "r1         all-MiniLM-L6-v2   4242     -              0.00G       -        0.000  "
        "0.00G       0.00G       0.00G       0.00G       -           4      0     0     "
    )


def test_gpu_and_controller_lines() -> None:
    doc: dict[str, Any] = {
        "replicas": [REPLICA],
        "gpus": [
            {
                "uuid": "GPU-c0ffee00-0000-4000-8000-000000000001",
                "total_bytes": 80 * GIB,
                "free_bytes": GIB,
                "budgets_bytes": 40 * GIB,
            },
            {"uuid": "GPU-2", "total_bytes": None, "free_bytes": None, "budgets_bytes": 0},
        ],
        "controller": {
            "controller/model": {
                "target_replicas": 1,
                "current_replicas": 2,
                "direction": "down",
                "reason": "shed_memory_pressure",
                "detail": "gpu:4aaf9a0473a8 free 1.00 GiB < margin 2.00 GiB",
                "timestamp_s": 1.0,
            },
            "other/model": {
                "target_replicas": 3,
                "current_replicas": 3,
                "reason": "hold_bad_reading",
                "detail": "gpu:4aaf9a0473a8: free 86973087744 > total 85899345920 bytes",
            },
        },
    }
    lines = render_status(doc).split("\n")
    assert lines[2:] == [
        "GPU GPU-c0ffee00-0000-4000-8000-000000000001: total 80.00G, free 1.00G, "
        "sum of budgets 40.00G",
        "GPU GPU-2: total -, free -, sum of budgets 0.00G",
        "controller controller/model: 2 -> 1 (shed_memory_pressure): "
        "gpu:4aaf9a0473a8 free 1.00 GiB < margin 2.00 GiB",
        "controller other/model: 3 -> 3 (hold_bad_reading): "
        "gpu:4aaf9a0473a8: free 86973087744 > total 85899345920 bytes",
    ]


def test_escape_lines() -> None:
    esc = {
        "replica_id": "abcdefghijkl",
        "app": "all-MiniLM-L6-v2",
        "pid": 4242,
        "gpu_uuid": "GPU-1",
        "budget_bytes": 20 * GIB,
        "enforcement": "torch",
        "nvml_process_bytes": 26 * GIB,
        "over_bytes": 6 * GIB,
        "active": True,
    }
    lines = render_status({"replicas": [REPLICA], "escapes": [esc, {**esc, "active": False}]})
    assert lines.split("\n")[2:] == [
        "ESCAPE: replica abcdefghijkl (all-MiniLM-L6-v2, pid 4242, enforcement torch) holds "
        "26.00G on GPU GPU-1, 6.00G over its budget of 20.00G",
        "escaped earlier: replica abcdefghijkl (all-MiniLM-L6-v2, pid 4242, enforcement torch) "
        "holds 26.00G on GPU GPU-1, 6.00G over its budget of 20.00G",
    ]


def test_start_up_lines_follow_the_table() -> None:
    phases = {
        "process": 3.1,
        "partition": 0.8,
        "weights": 1.25,
        "graph_capture": 2.0,
        "calibration": 0.01,
        "warmup": 0.5,
        "total": 7.66,
    }
    served = {**REPLICA, "startup_phases_s": phases, "calibration_source": "cache"}
    served["first_request_s"] = 12.345
    fresh = {**REPLICA, "replica_id": "r2", "startup_phases_s": {"process": 1.0, "total": 1.0}}
    warm = {
        **REPLICA,
        "replica_id": "r3",
        "startup_phases_s": {"process": 9.0, "imports": 0.0, "weights": 0.5, "total": 9.5},
        "preloaded_worker": True,
        "worker_waited_s": 3.25,
        "first_request_s": 14.0,
        "first_request_since_imports_s": 1.5,
        "warm_workers": {"idle": 2, "target": 2, "error": None},
    }
    lines = render_status({"replicas": [served, fresh, warm, REPLICA]}).split("\n")
    assert len(lines) == 8
    assert lines[5:] == [
        "start-up abcdefghij (s): process 3.10, partition 0.80, weights 1.25, graph_capture 2.00, "
        "calibration 0.01 (cache), warmup 0.50, total 7.66; first request 12.35",
        "start-up r2 (s): process 1.00, total 1.00; first request none yet",
        "start-up r3 (s): process 9.00 (warm worker, ready 3.25 before the replica), imports 0.00, "
        "weights 0.50, total 9.50; first request 14.00 (1.50 from its own start); "
        "warm workers 2/2",
    ]


def test_replicas_on_two_gpus_are_grouped_under_a_heading_per_node_and_gpu() -> None:
    def rep(rid: str, node: str, gpu: str | None) -> dict[str, Any]:
        return {**REPLICA, "replica_id": rid, "node_id": node, "gpu_uuid": gpu}

    doc: dict[str, Any] = {
        "replicas": [
            rep("r1", "node-b", "GPU-b"),
            rep("r2", "node-a", "GPU-a"),
            rep("r3", "node-b", "GPU-b"),
            rep("r4", "node-a", None),
        ],
        "gpus": [
            {"node_id": "node-a", "uuid": "GPU-a", "total_bytes": 80 * GIB, "free_bytes": GIB},
        ],
    }
    lines = render_status(doc).split("\n")
    assert [line[:10].strip() if line.startswith("r") else line for line in lines[1:]] == [
        "node node-a GPU - (CPU)",
        "r4",
        "node node-a GPU GPU-a",
        "r2",
        "node node-b GPU GPU-b",
        "r1",
        "r3",
        "GPU GPU-a on node node-a: total 80.00G, free 1.00G, sum of budgets -",
    ]


def test_placement_groups_sum_budgets_per_node_and_gpu() -> None:
    from serve_app.ops.status import placement_groups

    reps = [
        {"replica_id": "r1", "node_id": "n2", "gpu_uuid": "GPU-b", "budget_bytes": 3},
        {"replica_id": "r2", "node_id": "n1", "gpu_uuid": "GPU-a", "budget_bytes": 5},
        {"replica_id": "r3", "node_id": "n2", "gpu_uuid": "GPU-b", "budget_bytes": 4},
    ]
    assert placement_groups(reps) == [
        {"node_id": "n1", "gpu_uuid": "GPU-a", "replica_ids": ["r2"], "budgets_bytes": 5},
        {"node_id": "n2", "gpu_uuid": "GPU-b", "replica_ids": ["r1", "r3"], "budgets_bytes": 7},
    ]


class _Answer(http.server.BaseHTTPRequestHandler):
    """Answers GET /v1/memory with the server's ``status`` and ``body``."""

    def do_GET(self) -> None:
        server: Any = self.server
        server.authorization = self.headers.get("authorization")
        body = server.body.encode()
        self.send_response(server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def memory_server() -> Iterator[Any]:
    server: Any = http.server.HTTPServer(("127.0.0.1", 0), _Answer)
    server.status, server.body = 200, json.dumps({"replicas": []})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_status_reads_the_report_and_prints_the_table(
    memory_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{memory_server.server_address[1]}"
    assert read_memory_report(url + "/") == {"replicas": []}
    assert main(["status", "--url", url]) == 0
    assert capsys.readouterr().out == render_status({"replicas": []}) + "\n"
    assert main(["status", "--url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"replicas": []}


def test_status_errors_name_the_url_and_the_answer(
    memory_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{memory_server.server_address[1]}"
    memory_server.status, memory_server.body = 503, '{"detail": "starting"}'
    with pytest.raises(StatusUnavailable, match='answered 503: {"detail": "starting"}'):
        read_memory_report(url)
    assert main(["status", "--url", url]) == 2
    assert capsys.readouterr().err.startswith(f"error: {url}/v1/memory answered 503")
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["status", "--url", closed]) == 2
    assert capsys.readouterr().err.startswith(f"error: cannot reach {closed}: ")


def test_status_sends_the_environments_key(
    memory_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{memory_server.server_address[1]}"
    monkeypatch.delenv("SERVE_APP_API_KEYS_FILE", raising=False)
    monkeypatch.delenv("SERVE_APP_API_KEYS", raising=False)
    read_memory_report(url)
    assert memory_server.authorization is None  # no keys: no header
    monkeypatch.setenv("SERVE_APP_API_KEYS", "k1,k2")
    read_memory_report(url)
    assert memory_server.authorization == "Bearer k1"
    read_memory_report(url, api_key="other")
    assert memory_server.authorization == "Bearer other"
