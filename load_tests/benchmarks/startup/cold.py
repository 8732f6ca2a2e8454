"""The cold part: ``python -m serve_app run CONFIG`` as a user runs it, timed from the spawn to
/readyz 200 and to every replica serving, then stopped with SIGINT (the package docstring has
the clocks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from load_tests.benchmarks.startup.output import Run
from load_tests.benchmarks.startup.probes import POLL_S, first_200, reports, serving
from load_tests.benchmarks.startup.rows import first_answers, make_row
from load_tests.benchmarks.startup.timeline import cold_timeline
from load_tests.harness.load import Load
from load_tests.harness.meta import ROOT
from load_tests.harness.nvml import BudgetWatch

# The CLI's Ray session (its ray.init makes it the latest), for the row's timeline.
SESSION_LATEST = "/tmp/ray/session_latest"
FIRST_GUESS_S = 30.0  # one start and stop, before one has been timed


def stop_cli(proc: subprocess.Popen[bytes], host: str, port: int) -> dict[str, Any]:
    """SIGINT (Ctrl-C), wait for the exit and the port; SIGKILL, by pid, whatever of the CLI's
    process tree is still alive after that."""
    from serve_app.ops.ports import port_is_free

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        code: int | None = proc.wait(timeout=60.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait(timeout=10.0)
    stopped_s = round(time.monotonic() - t0, 2)
    _, alive = psutil.wait_procs(tree, timeout=10.0)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    deadline = time.monotonic() + 10.0
    while not port_is_free(host, port) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {
        "exit_code": code,
        "stop_s": stopped_s,
        "killed_leftovers": len(alive),
        "port_free": port_is_free(host, port),
    }


def cold_once(doc: dict[str, Any], work: Path, repeat: int, deadline: float) -> dict[str, Any]:
    from serve_app.gpu import nvml
    from serve_app.ops import launch, ports

    host, port = launch.http_address(doc)
    url = f"http://{host}:{port}"
    replicas = int(doc["applications"][0]["deployments"][0]["num_replicas"])
    config = work / f"cold-{repeat}.yaml"
    config.write_text(yaml.safe_dump(doc))
    out_path = work / f"cold-{repeat}.log"
    env = {**os.environ, **ports.haproxy_side_ports()}
    env.pop(nvml.FAKE_NVML_VAR, None)
    cmd = [sys.executable, "-m", "serve_app", "run", str(config)]
    cmd += ["--ready-timeout-s", str(max(10, int(deadline - time.monotonic())))]
    measured: dict[str, Any] = {"cold_ready_s": None, "all_serving_s": None, "cli_ready_s": None}
    found: list[dict[str, Any]] = []
    with out_path.open("wb") as out:
        t0, t0_epoch_s = time.monotonic(), time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    # On a GPU: NVML per process from the start, judged against the budgets once they show.
    watch = BudgetWatch(f"{url}/v1/memory").start() if launch.gpu_count() else None

    def tick() -> None:
        if measured["cli_ready_s"] is None and "serving at" in out_path.read_text(errors="replace"):
            measured["cli_ready_s"] = round(time.monotonic() - t0, 3)

    try:
        ready_at = first_200(f"{url}/readyz", deadline, lambda: proc.poll() is None, tick)
        if ready_at is not None:
            measured["cold_ready_s"] = round(ready_at - t0, 3)
            with Load(f"{url}/v1/embeddings", clients=2 * replicas) as load:
                serving(load, set(), replicas, deadline, tick)
                answers = first_answers(load.snapshot(), set())
                if len(answers) >= replicas:
                    measured["all_serving_s"] = round(answers[replicas - 1][0] - t0, 3)
                ids = {rid for _, rid in answers}
                found = reports(url, ids, min(deadline, time.monotonic() + 15.0))
            while measured["cli_ready_s"] is None and time.monotonic() < deadline:
                tick()
                time.sleep(POLL_S)
    finally:
        budget_watch = watch.stop() if watch is not None else None
        stopped = stop_cli(proc, host, port)
    timeline = cold_timeline(Path(os.path.realpath(SESSION_LATEST)), t0_epoch_s)
    tail = out_path.read_text(errors="replace")[-1500:]
    note = None if measured["cold_ready_s"] is not None else f"never ready; CLI output: {tail}"
    row = make_row(doc_setup(doc), repeat, found, **measured, stop=stopped, note=note)
    row["timeline"] = timeline
    if budget_watch is not None:
        row["budget_watch"] = budget_watch
    return row


def doc_setup(doc: dict[str, Any]) -> str:
    dep = doc["applications"][0]["deployments"][0]
    gpus = (dep.get("ray_actor_options") or {}).get("num_gpus")
    share = f"{gpus:g}" if gpus else "cpu"
    return f"cold_{dep['num_replicas']}x{share}_minilm"


def cold_part(run: Run, doc: dict[str, Any], repeats: int, deadline: float, work: Path) -> None:
    from serve_app.ops import ports

    took_s = FIRST_GUESS_S  # then the longest repeat seen
    for repeat in range(repeats):
        left = deadline - time.monotonic()
        if left < took_s:
            run.skipped.append(
                f"cold: repeats {repeat + 1}-{repeats} ({left:.0f} s left, one takes ~{took_s:.0f})"
            )
            return
        doc["http_options"]["port"] = ports.free_port()
        t0 = time.monotonic()
        row = cold_once(doc, work, repeat, deadline)
        run.add(row)
        if row["cold_ready_s"] is None:  # the next would most likely fail the same way
            run.skipped.append(f"cold: repeats {repeat + 2}-{repeats} (repeat {repeat + 1} failed)")
            return
        took_s = max(took_s, time.monotonic() - t0)
