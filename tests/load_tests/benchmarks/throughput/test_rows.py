"""load_tests.benchmarks.throughput.rows: wrk rows, ceilings and flags, merging runs."""

from __future__ import annotations

import pytest

from load_tests.benchmarks.throughput import rows
from load_tests.harness.wrk import (
    parse_wrk_output,
)
from tests.load_tests.benchmarks.throughput.samples import common_row
from tests.load_tests.harness.test_wrk import WRK_OUTPUT


def test_wrk_row_takes_the_best_try_and_counts_items() -> None:
    tries = [
        {**parse_wrk_output(WRK_OUTPUT), "connections": 64, "threads": 16},
        {"connections": 256, "threads": 16, "error": "wrk exit 1"},
    ]
    row = rows.wrk_row(common_row(), tries)
    assert row["status"] == "ok" and row["client"] == "wrk" and row["connections"] == 64
    assert row["requests_per_s"] == 9950.0 and row["items_per_s"] == 9950.0 * 16
    assert row["errors"] == 405 and row["p99_ms"] == 9.0
    assert [t.get("error") for t in row["tries"]] == [None, "wrk exit 1"]
    assert set(rows.ROW_KEYS) <= set(row)
    failed = rows.wrk_row(common_row(), tries[1:])
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
            **common_row(), client="wrk", status="ok", requests_per_s=2000.0, items_per_s=32000.0
        ),
        rows.new_row(
            **common_row(),
            client="open-loop",
            status="ok",
            requests_per_s=8000.0,
            items_per_s=128000.0,
        ),
        rows.new_row(**common_row(payload="other"), client="wrk", status="ok", requests_per_s=10.0),
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
    old_ok = rows.new_row(**common_row(replicas=8), client="wrk", status="ok", requests_per_s=1.0)
    old_r4 = rows.new_row(**common_row(), client="wrk", status="ok", requests_per_s=2.0)
    new_r4 = rows.new_row(**common_row(), client="wrk", status="ok", requests_per_s=3.0)
    new_skip = rows.new_row(**common_row(replicas=8), client="wrk", status="skipped")
    merged = rows.merge_rows([old_ok, old_r4], [new_r4, new_skip])
    assert [(r["replicas"], r["requests_per_s"]) for r in merged] == [(8, 1.0), (4, 3.0)]


def test_rows_carry_the_kept_runs_server_cpu_and_its_ratio_to_the_noop() -> None:
    cpu = {"server_cpu_s_per_1000_requests": 0.5, "server_cpu_s_by_kind": {"replica": 2.0}}
    slow = {**parse_wrk_output(WRK_OUTPUT), "connections": 64, "threads": 16}
    fast = {**slow, "connections": 256, "requests_per_s": 20000.0, **cpu}
    row = rows.wrk_row(common_row(inputs_per_request=1), [slow, fast])
    assert row["connections"] == 256 and row["server_cpu_s_per_1000_requests"] == 0.5
    assert row["server_cpu_s_by_kind"] == {"replica": 2.0}
    assert [t.get("server_cpu_s_per_1000_requests") for t in row["tries"]] == [None, 0.5]
    point = {"requests_per_s": 100.0, "client_keeps_up": True, **cpu}
    assert rows.openloop_row(common_row(), point)["server_cpu_s_per_1000_requests"] == 0.5

    noop = rows.new_row(
        setup="ray_serve_noop", replicas=4, client="wrk", status="ok", requests_per_s=3e4
    )
    noop["server_cpu_s_per_1000_requests"] = 0.25
    peer = rows.new_row(**common_row(setup="litserve"), client="wrk", status="ok")
    peer.update(requests_per_s=1e3, server_cpu_s_per_1000_requests=2.0)
    other_count = rows.new_row(**common_row(replicas=8), client="wrk", status="ok")
    other_count.update(requests_per_s=1e3, server_cpu_s_per_1000_requests=1.0)
    table = [noop, row, peer, other_count]
    rows.apply_ceilings(table)
    assert row["server_cpu_vs_noop"] == pytest.approx(2.0)
    assert peer["server_cpu_vs_noop"] == pytest.approx(8.0)
    assert other_count["server_cpu_vs_noop"] is None  # no no-op at 8 replicas
    assert noop["server_cpu_vs_noop"] is None


def test_text_rows_carry_tokens_per_s_and_their_ratio_to_the_same_workloads_ceiling() -> None:
    mixed = common_row(payload="minilm-x16-mixed-float", workload="mixed", tokens_per_request=800.0)
    tries = [{**parse_wrk_output(WRK_OUTPUT), "connections": 64, "threads": 16}]
    served = rows.wrk_row(mixed, tries)
    assert served["texts_per_s"] == 9950.0 * 16 and served["tokens_per_s"] == 9950.0 * 800.0
    assert rows.wrk_row(common_row(), tries)["tokens_per_s"] is None  # no token count given
    doc = {
        "status": "ok",
        "workload": "mixed",
        "items_per_s": {"64": 9000.0, "128": 10000.0},
        # the batch of most texts/s is not the one of most tokens/s: tokens/s picks
        "tokens_per_s": {"64": 600000.0, "128": 500000.0},
    }
    ceiling = rows.ceiling_row("minilm", doc, "0-15")
    assert ceiling["ceiling_batch"] == 64 and ceiling["ceiling_tokens_per_s"] == 600000.0
    assert ceiling["texts_per_s"] == 9000.0 and ceiling["workload"] == "mixed"
    short_ceiling = rows.new_row(
        setup="in_process", model="minilm", status="ok", ceiling_items_per_s=1e6
    )  # a row of an earlier run, before rows named their workload: the short one
    short_ceiling["ceiling_tokens_per_s"] = 9e6
    table = [short_ceiling, ceiling, served]
    rows.apply_ceilings(table)
    assert served["ceiling_tokens_per_s"] == 600000.0 and served["ceiling_batch"] == 64
    assert served["vs_ceiling_tokens"] == pytest.approx(9950.0 * 800.0 / 600000.0)
    assert rows.row_key(served) != rows.row_key({**served, "workload": None})
