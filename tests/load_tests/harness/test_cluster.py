"""harness.cluster.UpLog: when each replica left HAProxy's rotation, counted from its last UP."""

from __future__ import annotations

import pytest

from load_tests.harness import cluster


def test_a_replica_that_flapped_records_the_exit_after_its_last_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    views = iter(
        [
            {"a": "UP", "b": "UP"},
            {"a": "DOWN 1/2", "b": "UP"},  # a flaps out ...
            {"a": "UP", "b": "UP"},  # ... and back: its first exit is forgotten
            {"a": "UP"},  # b gone
            {},  # a gone: this is its exit
        ]
    )
    clock = iter([1.0, 2.0, 3.0, 4.0, 5.0])
    monkeypatch.setattr(cluster, "haproxy_up", lambda target: next(views))
    monkeypatch.setattr(cluster.time, "monotonic", lambda: next(clock))
    log = cluster.UpLog(cluster.Target(base="http://127.0.0.1:1/faults", node_id="n"))
    for _ in range(5):
        log.poll()
    assert log.first_up == {"a": 1.0, "b": 1.0}
    assert log.first_out == {"a": 5.0, "b": 4.0}
