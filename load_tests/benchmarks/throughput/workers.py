"""Worker subprocesses (the in-process ceiling, the serve worker): started in their own
process group, polled through their result file, stopped and cleaned up at their deadline."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load_tests.harness.meta import ROOT
from load_tests.harness.run import error_doc, log, write_json

LOG_LINE = re.compile(rb"^\[\d\d:\d\d:\d\d \+")  # harness.run.log's lines


@dataclass
class Worker:
    """A worker process, the JSON file it rewrites as it goes, and its log."""

    proc: subprocess.Popen[bytes]
    result_path: Path
    log_path: Path


def spawn(mode: str, spec: dict[str, Any], work: Path, log_path: Path) -> Worker:
    """Start ``python -m load_tests.benchmarks.throughput --_worker MODE`` on ``spec`` in its own
    process group, its output (Ray's and the replicas' too) to ``log_path``."""
    spec_path = work / f"{mode}-spec.json"
    result_path = work / f"{mode}-result.json"
    result_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps(dict(spec, result_path=str(result_path))))
    cmd = [sys.executable, "-m", "load_tests.benchmarks.throughput", "--out", str(work)]
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [*cmd, "--_worker", mode, "--_spec", str(spec_path)],
            cwd=str(ROOT),
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Worker(proc, result_path, log_path)


class _Echo:
    """Prints the worker's own progress lines from its log file as they appear."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def __call__(self) -> None:
        if not self.path.is_file():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            if LOG_LINE.match(line):
                print(line.decode(errors="replace"), flush=True)


def read_result(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def wait_worker(
    worker: Worker,
    hard_deadline: float,
    on_poll: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[dict[str, Any], int]:
    """Poll the worker until it exits or ``hard_deadline``, then SIGTERM (it tears its cluster
    down), SIGKILL after 20 s, and kill what its Ray session and HAProxy left."""
    from load_tests.harness.cluster import kill_matching

    proc, result_path = worker.proc, worker.result_path
    echo = _Echo(worker.log_path)
    try:
        while proc.poll() is None and time.time() < hard_deadline:
            try:  # returns as soon as the worker exits: no poll interval lost
                proc.wait(timeout=max(0.0, min(2.0, hard_deadline - time.time())))
            except subprocess.TimeoutExpired:
                pass
            echo()
            if on_poll is not None:
                on_poll(read_result(result_path))
    finally:
        if proc.poll() is None:
            log(f"worker {proc.pid} over its time: stopping it")
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                proc.wait()
    echo()
    result = read_result(result_path)
    for marker in (result.get("session_dir"), result.get("scratch_dir")):
        if marker and proc.returncode != 0:
            kill_matching(marker)
    return result, int(proc.returncode or 0)


def worker_main(a: argparse.Namespace) -> int:
    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    spec = json.loads(Path(a._spec).read_text())
    cfg = spec["cfg"]
    if a._worker == "serve":
        from load_tests.benchmarks.throughput.serve import serve_worker

        serve_worker(spec)
        return 0
    os.sched_setaffinity(0, set(cfg["server_cores"]))
    os.environ["CUDA_VISIBLE_DEVICES"] = str(cfg["gpu"]) if cfg["device"] == "cuda" else ""
    from load_tests.benchmarks.throughput.ceiling import ceiling_worker
    from load_tests.benchmarks.throughput.setups import ceiling_texts

    result: dict[str, Any] = {"models": {}, "errors": []}
    for m in cfg["models"]:
        one = {"device": cfg["device"], "models": [m], "batches": cfg["model_batches"][m]}
        one.update(min_s=cfg["model_min_s"], cpu_min_s=0.3)
        one["texts"] = ceiling_texts(m, cfg)  # the mixed workload's texts, else None
        try:
            result["models"].update(ceiling_worker(one))
        except BaseException as exc:  # noqa: BLE001 - recorded; the other model still runs
            result["errors"].append({"model": m, **error_doc(exc)})
        write_json(Path(spec["result_path"]), result)
    return 0
