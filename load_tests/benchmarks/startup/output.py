"""The JSON document (rewritten after every row) and the printed summary."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from load_tests.benchmarks.startup.rows import INFORMATIONAL, TARGETS, summarize
from load_tests.harness.run import log, write_json


class Run:
    """The document being written: ``meta``, ``rows`` and ``summary`` (with what was skipped
    and the errors)."""

    def __init__(self, out: Path, meta: dict[str, Any]):
        self.out = out
        self.meta = meta
        self.rows: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()  # the watchdog writes from its own thread

    def add(self, row: dict[str, Any]) -> None:
        # A shared or busy host slows start-ups: its load when the row was measured.
        row["host_load_1m"] = round(os.getloadavg()[0], 2)
        with self._lock:
            self.rows.append(row)
        log(f"{row['setup']} #{row['repeat']}: {row_line(row)}")
        self.write()

    def write(self) -> None:
        with self._lock:
            summary = {**summarize(self.rows), "skipped": self.skipped, "errors": self.errors}
            write_json(self.out, {"meta": self.meta, "rows": self.rows, "summary": summary})


def row_line(row: dict[str, Any]) -> str:
    keys = (*TARGETS, *INFORMATIONAL, "note")
    return " ".join(f"{k} {row[k]}" for k in keys if k in row)


def print_summary(run: Run) -> None:
    summary = summarize(run.rows)
    for name in (*TARGETS, *INFORMATIONAL):
        s = summary.get(name) or summary["informational"][name]
        line = f"{name:22s} n {s['n']:2d} median {s['median']} min {s['min']} max {s['max']}"
        if "met" in s:
            line += f"  target {s['target']} ({s['met_by']}) met {s['met']}"
        print(line)
    print(f"phases, median s: {summary['phases_median_s']}")
    watches = [r["budget_watch"] for r in run.rows if r.get("budget_watch")]
    if run.meta.get("budget_watch"):
        watches.append(run.meta["budget_watch"])
    if watches:
        violations = sum(int(w.get("budget_violations") or 0) for w in watches)
        samples = sum(int(w.get("nvml_samples_judged") or 0) for w in watches)
        print(f"budget violations: {violations} in {samples} NVML samples judged")
    for line in run.skipped + run.errors:
        print(f"note: {line}")
    print(f"wrote {run.out} in {run.meta.get('took_s')} s")
