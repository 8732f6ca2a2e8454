"""control.escapes: an escape's JSON and its log line (find_escapes and the monitor's checks are
tested with MPS mode in tests/unit/test_mps.py)."""

from __future__ import annotations

from serve_app.control.escapes import Escape, WatchedReplica, escape_began

GIB = 1 << 30
UUID = "GPU-00000000-0000-0000-0000-000000000001"


def _escape(enforcement: str) -> Escape:
    replica = WatchedReplica("r1", "app", 4242, UUID, 10 * GIB, enforcement)
    return Escape(replica, 12 * GIB, 13 * GIB, 5.0, 6.0, active=True)


def test_escape_json_flattens_the_replica_and_adds_the_excess() -> None:
    assert _escape("torch").to_json() == {
        "replica_id": "r1",
        "app": "app",
        "pid": 4242,
        "gpu_uuid": UUID,
        "budget_bytes": 10 * GIB,
        "enforcement": "torch",
        "nvml_process_bytes": 12 * GIB,
        "peak_bytes": 13 * GIB,
        "first_seen_s": 5.0,
        "last_seen_s": 6.0,
        "active": True,
        "over_bytes": 2 * GIB,
    }


def test_the_log_line_says_what_would_stop_the_escape() -> None:
    assert escape_began(_escape("torch")) == (
        f"GPU memory escape: replica r1 (app, pid 4242) holds {12 * GIB} bytes on GPU {UUID}, "
        f"{2 * GIB} over its budget of {10 * GIB} bytes (enforcement torch: memory allocated "
        "outside PyTorch's cap; enforcement: mps makes the driver refuse it)"
    )
    assert escape_began(_escape("mps")).endswith("(enforcement mps: over the driver's limit)")
