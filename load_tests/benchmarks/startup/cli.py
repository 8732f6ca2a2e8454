"""The command line: parse, run the parts within the budget, write the JSON, print."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import psutil
import yaml

from load_tests.benchmarks.startup.cold import ROOT, cold_part
from load_tests.benchmarks.startup.output import Run, print_summary
from load_tests.benchmarks.startup.rows import autoscaling_config, cold_config
from load_tests.benchmarks.startup.scaling import decision_part, replacement_part
from load_tests.harness.cluster import start_cluster
from load_tests.harness.meta import PROVENANCE_HELP, machine_info, run_meta
from load_tests.harness.nvml import BudgetWatch
from load_tests.harness.run import Budget, log

PART_WEIGHTS = {"cold": 0.45, "replacement": 0.2, "decision": 0.35}
WATCHDOG_GRACE_S = 30.0
CLUSTER_START_MAX_S = 240.0
FAKE_GPU_UUID = "GPU-57a27000-0000-4000-8000-000000000001"


def part_deadline(budget: Budget, part: str, parts: tuple[str, ...]) -> float:
    """The share of ``part`` (PART_WEIGHTS) in what is left of the budget, split between it and
    the ``parts`` after it, as a deadline."""
    share = PART_WEIGHTS[part] / sum(PART_WEIGHTS[p] for p in parts[parts.index(part) :])
    return budget.deadline(budget.left() * share)


def script_fake_gpu(work: Path) -> None:
    """On a CPU: NVML scripted (one 80 GiB GPU, 79 GiB free) for the Ray cluster started next,
    so that replicas holding a logical GPU share run in logical-scripted mode."""
    from serve_app.gpu import nvml

    path = work / "nvml-script.json"
    devices = {FAKE_GPU_UUID: {"total_bytes": 80 << 30, "free_bytes": 79 << 30}}
    path.write_text(json.dumps({"devices": devices}))
    os.environ[nvml.FAKE_NVML_VAR] = str(path)


def kill_descendants() -> int:
    """SIGKILL every process this one started (by pid); how many there were."""
    procs = psutil.Process().children(recursive=True)
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    return len(procs)


def start_watchdog(run: Run, seconds: float) -> threading.Timer:
    """Past ``seconds``: write what was measured, stop every process this one started, exit 3."""

    def fire() -> None:
        run.errors.append(f"watchdog: still running {seconds:.0f} s after the start; stopped")
        run.meta["complete"] = False
        try:
            run.write()
        finally:
            log(f"watchdog: killed {kill_descendants()} processes; exiting")
            os._exit(3)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


def load_config(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "configs" / name).read_text())
    return doc


PROG = "python -m load_tests.benchmarks.startup"


def main(argv: list[str] | None = None) -> int:
    import load_tests.benchmarks.startup as package

    title = (package.__doc__ or "").split("\n")[0]
    p = argparse.ArgumentParser(prog=PROG, description=title, epilog=PROVENANCE_HELP)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="the CPU dry run: 2 repeats, 240 s")
    p.add_argument("--out", type=Path, default=Path("startup.json"))
    p.add_argument("--repeats", type=int, default=None, help="per part; default 5 (2 --quick)")
    p.add_argument("--budget-s", type=float, default=None, help="default 420 (240 --quick)")
    p.add_argument("--only", default=",".join(PART_WEIGHTS), help="comma-separated parts")
    a = p.parse_args(argv)
    only = tuple(part for part in PART_WEIGHTS if part in a.only.split(","))
    if not only:
        p.error(f"--only: choose from {', '.join(PART_WEIGHTS)}")
    repeats = a.repeats or (2 if a.quick else 5)
    budget_s = a.budget_s or (240.0 if a.quick else 420.0)
    from serve_app.ops import launch

    gpus = launch.gpu_count() if a.device == "cuda" else 0
    if a.device == "cuda" and gpus == 0:
        p.error("--device cuda, but this machine has no CUDA GPU (use --device cpu --quick)")
    t0 = time.monotonic()
    budget = Budget(budget_s)
    work = Path(tempfile.mkdtemp(prefix="startup-bench-"))
    on_gpu = a.device == "cuda"
    replicas, max_replicas, clients = (4, 4, 16) if on_gpu else (2, 2, 8)
    base = load_config("gpu-shared.yaml" if on_gpu else "cpu.yaml")
    doc = cold_config(base, a.device, replicas, work / "calibration-cache")
    args = doc["applications"][0]["args"]
    # In this process's cluster: a quarter GPU each (of a logical GPU on a CPU).
    options = {"num_cpus": 1 if on_gpu else 0.25, "num_gpus": 0.25}
    autoscaling = autoscaling_config(load_config("controller.yaml"), max_replicas)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    meta: dict[str, Any] = {
        **run_meta(PROG, argv, gpu=machine["gpu_name"]),
        "args": {**vars(a), "out": str(a.out), "repeats": repeats, "budget_s": budget_s},
        "started_unix_s": time.time(),
        "machine": machine,
        "work_dir": str(work),  # the cold starts' configs and CLI output, the NVML script
        "cold_config": doc,
        "in_process": {"replicas": replicas, "actor_options": options, "app_args": args},
        "decision": {"clients": clients, "autoscaling_config": autoscaling},
        "complete": False,
    }
    run = Run(a.out, meta)
    run.write()
    watchdog = start_watchdog(run, budget_s + WATCHDOG_GRACE_S)
    # A `timeout` or a scheduler's SIGTERM: unwind through the clean-ups below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    watch: BudgetWatch | None = None
    try:
        if "cold" in only:
            cold_part(run, doc, repeats, part_deadline(budget, "cold", only), work)
        if "replacement" in only or "decision" in only:
            if not on_gpu:
                script_fake_gpu(work)
            target = start_cluster(
                replicas,
                # Replacements and scale-ups with the warm pool up, as later in a server's life
                # (by default a replica asks for warm workers only after its first minute).
                {**args, "warm_workers_delay_s": 0.0},
                options,
                num_gpus=gpus or 1,
                num_cpus=max(8, 2 * max_replicas),
                timeout_s=max(10.0, min(CLUSTER_START_MAX_S, budget.left())),
            )
            log(f"cluster of {replicas} replicas up ({budget.left():.0f} s of the budget left)")
            if on_gpu:  # NVML per process, against every replica's budget, old and new
                watch = BudgetWatch(f"{target.base}/v1/memory").start()
        if "replacement" in only:
            deadline = part_deadline(budget, "replacement", only)
            replacement_part(run, target, repeats, deadline)
        if "decision" in only:
            deadline = part_deadline(budget, "decision", only)
            decision_part(run, target, args, options, autoscaling, clients, repeats, deadline)
    except Exception as exc:  # noqa: BLE001 - keep what was measured, say what went wrong
        run.errors.append("".join(traceback.format_exception(exc))[-3000:])
        log(f"error: {exc!r}")
    finally:
        if watch is not None:
            meta["budget_watch"] = watch.stop()
            log(f"budget violations: {meta['budget_watch']['budget_violations']}")
        launch.shutdown()
        watchdog.cancel()
    meta.update(complete=True, took_s=round(time.monotonic() - t0, 1))
    run.write()
    print_summary(run)
    return 0
