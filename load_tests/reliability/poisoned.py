"""The ``poisoned`` fault of the GPU suite (gpu_faults): the test-only ``device_assert`` hook,
sent to one replica's own port under load, poisons its CUDA context for good; the replica must
end itself (serve_app/serving/poison.py) and its requests be replayed. On a CPU the hook
simulates the error."""

from __future__ import annotations

import glob
import os
import time
from typing import Any

import httpx

from load_tests.harness.cluster import (
    APP,
    Target,
    haproxy_rows,
    haproxy_up,
    pick_victim,
    wait_whole,
)
from load_tests.harness.load import Load
from load_tests.harness.run import Budget
from load_tests.reliability.faults import Row, skipped
from serve_app.control.monitor import pid_alive

POISON_LOG_TEXT = "poisoned this process's CUDA context"


def poison_log_lines(since_unix: float) -> list[str]:
    """Ray session log files (written since ``since_unix``) that hold the replica's CRITICAL
    line; the line may be in its serve log and its worker stderr both."""
    hits = []
    for path in glob.glob("/tmp/ray/session_latest/logs/**/*", recursive=True):
        try:
            if os.path.getmtime(path) < since_unix or not os.path.isfile(path):
                continue
            with open(path, errors="replace") as f:
                if any(POISON_LOG_TEXT in line for line in f):
                    hits.append(os.path.basename(path))
        except OSError:
            continue
    return sorted(hits)


def poisoned(target: Target, budget: Budget) -> Row:
    deadline = budget.deadline(120.0)
    started_unix = time.time()
    detail: dict[str, Any] = {}
    with Load(target.url) as load:
        time.sleep(2.0)
        up = [r for r, s in haproxy_up(target).items() if s == "UP"]
        victim = pick_victim(target, up, set())
        if victim is None:
            return skipped("poisoned", "no replica UP with a known pid")
        rid, pid = victim
        addr = haproxy_rows(target)[rid]["addr"]  # the replica's own port
        fault_at = time.monotonic()
        try:
            resp = httpx.post(
                f"http://{addr}/{APP}/v1/_faults", json={"kind": "device_assert"}, timeout=30.0
            )
            detail["hook_answer"] = {"status": resp.status_code, "body": resp.text[:300]}
        except httpx.HTTPError as exc:  # the expected outcome: closed with no answer
            detail["hook_answer"] = f"{type(exc).__name__}: no answer"
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        detail["exited_s"] = None if pid_alive(pid) else round(time.monotonic() - fault_at, 2)
        time.sleep(2.0)
    whole = wait_whole(target, timeout_s=max(0.0, deadline - time.monotonic()), exclude={rid})
    lost, failed, statuses = load.tally()
    detail.update(
        {
            "victim": rid,
            "statuses": statuses,
            "critical_line_in": poison_log_lines(started_unix),
        }
    )
    return Row(
        "poisoned",
        len(load.results),
        lost,
        failed,
        None if whole is None else round(time.monotonic() - fault_at, 2),
        detail,
    )
