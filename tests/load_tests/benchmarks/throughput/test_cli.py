"""load_tests.benchmarks.throughput.cli: the order of the jobs, and rows for what was not
reached."""

from __future__ import annotations

from load_tests.benchmarks.throughput import rows
from load_tests.benchmarks.throughput.cli import plan_jobs


def test_plan_is_replica_major_with_the_noop_last_at_each_count() -> None:
    keys = [j["key"] for j in plan_jobs(["minilm", "resnet50"], [4, 8], ["serve", "noop"])]
    assert keys == ["minilm/r4", "resnet50/r4", "noop/r4", "minilm/r8", "resnet50/r8", "noop/r8"]
    assert [j["key"] for j in plan_jobs(["minilm"], [4], ["noop"])] == ["noop/r4"]


def test_missing_rows_mark_what_was_not_reached() -> None:
    from load_tests.benchmarks.throughput.cli import missing_rows

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
