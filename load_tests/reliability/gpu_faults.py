"""GPU fault suite, one command: faults injected into 4 replicas sharing one GPU, under load.

    python -m load_tests.reliability.gpu_faults --device cuda --out gpu_faults.json   # ~400 s, H200
    python -m load_tests.reliability.gpu_faults --device cpu --quick --out dry.json   # CPU dry run

It reuses the CPU fault suite (load_tests.reliability.faults: Row, sigstop, overload) and the
harness (Load, classify via tally, the cluster)
and deploys ``--replicas`` (4) MiniLM replicas of ``num_gpus`` 0.25 each (args: embeddings,
load_format dummy, dtype float16), with the test-only fault hooks on (SERVE_APP_FAULT_HOOKS=1 in
their runtime_env). The faults (run in the order poisoned, sigstop, hog, overload, kill20):

- ``kill20``: ``--kills`` (20) replica SIGKILLs under load, one at a time: the next once the
  last victim is out of HAProxy's rotation, 2 s have passed, and ``--min-up`` (replicas - 1)
  other replicas are UP, so replacements overlap instead of running one after another.
  sent/lost/failed cover the whole series; recovery_s is the median time from a kill to a new
  replica UP in HAProxy (kills and new replicas matched in order);
- ``poisoned``: the ``device_assert`` hook, sent to one replica's own port under load: its CUDA
  context is poisoned for good, so it must end itself (poison.py) and its requests be replayed;
  recovery_s: until the deployment is whole again. On a CPU the hook simulates the error;
- ``sigstop``: one replica frozen under load for ``--stop-s`` (30 s) or until Serve replaces it;
  detail.out_of_rotation_s is the time until HAProxy has it DOWN;
- ``hog``: a separate process (load_tests.harness.hog: plain torch, not a replica) on the same
  GPU takes most of its free memory with torch.empty in steps, holds it ~10 s, then frees it;
  the replicas, whose budgets were reserved at start-up (serve_app/gpu/partition.py), must
  serve on with no error. GPU only: skipped on a CPU (said in the row);
- ``overload_3x``: faults.overload, an open loop at 3x the measured capacity.

Every row: ``fault, sent, lost, failed, recovery_s, detail`` (faults.py's meanings). The JSON at
``--out`` (rows + metadata) is rewritten after each fault, so a run cut short keeps what it
measured. Everything is bounded: ``--budget-s`` for the whole run (each fault gets what is
left, less the shutdown's share), a deadline for every wait. Only 127.0.0.1 is targeted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from load_tests.harness.cluster import (
    ARGS,
    Target,
    UpLog,
    pick_victim,
    reliability_env,
    start_cluster,
    wait_whole,
)
from load_tests.harness.hog import hog_command
from load_tests.harness.load import BODY, CLIENTS, Load, first_ok
from load_tests.harness.meta import PROVENANCE_HELP, run_meta
from load_tests.harness.nvml import BudgetWatch
from load_tests.harness.run import Budget
from load_tests.reliability.faults import Row, overload, print_rows, sigstop, skipped
from load_tests.reliability.poisoned import poisoned

# kill20 last: it takes whatever the budget has left, the others' actual time, not a reserve.
FAULTS = ("poisoned", "sigstop", "hog", "overload", "kill20")
GPU_ONLY = {"hog"}
KILL_GAP_S = 2.0  # at least this between two kills of the series


def app_args(device: str) -> dict[str, Any]:
    """The cluster's ARGS plus what the GPU suite asks for (the CPU always runs float32 anyway)."""
    return {**ARGS, "load_format": "dummy", "dtype": "float16", "device": device}


def actor_options(device: str) -> dict[str, Any]:
    share = {"num_gpus": 0.25, "num_cpus": 1} if device == "cuda" else {"num_cpus": 0.25}
    return {**share, "runtime_env": {"env_vars": {"SERVE_APP_FAULT_HOOKS": "1"}}}


def start_suite_cluster(device: str, replicas: int, gpus: int, timeout_s: float) -> Target:
    """The suite's cluster: ``replicas`` of ``app_args(device)`` with ``actor_options(device)``
    (start_cluster: Ray, Serve, HAProxy), as the fault suite and the soak both run it."""
    return start_cluster(
        replicas,
        app_args(device),
        actor_options(device),
        num_gpus=gpus,
        num_cpus=max(8, replicas * 2),
        timeout_s=timeout_s,
    )


# ---- kill20 --------------------------------------------------------------------------------


def kill_series(
    target: Target, kills: int, min_up: int, budget: Budget, leave_s: float = 0.0
) -> Row:
    """``leave_s``: what the faults after this one need of the budget."""
    deadline = budget.deadline(budget.left() - leave_s)
    killed: list[tuple[str, float]] = []  # (replica id, kill time)
    notes: list[str] = []
    with Load(target.url) as load, UpLog(target) as ups:
        time.sleep(2.0)
        for i in range(kills):
            victim = None
            while time.monotonic() < deadline:
                gone = {rid for rid, _ in killed}
                up = ups.up(gone)
                # One death at a time: the last victim out of rotation and its requests replayed
                # (two deaths inside one request's retry can lose it: HAProxy retries once).
                settled = not killed or (
                    killed[-1][0] in ups.first_out
                    and time.monotonic() - killed[-1][1] >= KILL_GAP_S
                )
                if settled and len(up) >= min_up:
                    victim = pick_victim(target, up, gone)
                    if victim is not None:
                        break
                time.sleep(0.2)
            if victim is None:
                notes.append(f"stopped after {i} kills: the run's budget ran out")
                break
            rid, pid = victim
            os.kill(pid, signal.SIGKILL)
            killed.append((rid, time.monotonic()))
            print(f"kill20: kill {i + 1}/{kills} {rid} (pid {pid})", flush=True)
        series_end = time.monotonic()
        whole = wait_whole(
            target,
            timeout_s=max(0.0, deadline - time.monotonic()),
            exclude={rid for rid, _ in killed},
        )
        time.sleep(1.0)  # a moment of load on the whole deployment again
    new = ups.new_replicas()
    # Kills and new replicas matched in order: the k-th new replica replaces the k-th kill.
    replaced = [
        round(t_up - t_kill, 2)
        for (_, t_kill), (t_up, _) in zip(killed, new, strict=False)
        if t_up > t_kill
    ]
    out_s = [round(ups.first_out[r] - t, 2) for r, t in killed if r in ups.first_out]
    lost, failed, statuses = load.tally()
    return Row(
        "kill20",
        len(load.results),
        lost,
        failed,
        round(statistics.median(replaced), 2) if replaced else None,
        {
            "kills": len(killed),
            "kills_asked": kills,
            "min_up_before_kill": min_up,
            "series_s": round(series_end - killed[0][1], 1) if killed else 0.0,
            "replacement_s": replaced,
            "replacement_max_s": max(replaced, default=None),
            "out_of_rotation_s": out_s,
            "whole_again": whole is not None,
            "statuses": statuses,
            "notes": notes,
        },
    )


# ---- hog -----------------------------------------------------------------------------------


def hog(target: Target, hold_s: float, keep_free_gib: float, budget: Budget) -> Row:
    deadline = budget.deadline(hold_s + 60.0)
    report = httpx.get(f"{target.base}/v1/memory", timeout=30.0).json()["replicas"]
    gpus = {r.get("gpu_uuid") for r in report}
    gpus.discard(None)
    if len(gpus) != 1:
        return skipped("hog", f"the replicas are on {len(gpus)} GPUs, not one: {sorted(gpus)}")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus.pop()}
    cmd = hog_command(hold_s, keep_free_gib)
    with Load(target.url) as load:
        time.sleep(2.0)
        started = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        released = time.monotonic()
        time.sleep(2.0)
    during = [r for r in load.snapshot() if started <= r[0] <= released]
    lost, failed, statuses = load.tally()
    d_lost, d_failed, _ = load.tally(during)
    lines = [line for line in (out or "").splitlines() if line.startswith("{")]
    return Row(
        "hog",
        len(load.results),
        lost,
        failed,
        first_ok(target, released),
        {
            "hog": json.loads(lines[-1]) if lines else {"exit_code": proc.returncode},
            "requests_while_hogged": len(during),
            "lost_while_hogged": d_lost,
            "failed_while_hogged": d_failed,
            "statuses": statuses,
        },
    )


# ---- the command ---------------------------------------------------------------------------


# On a GPU, 8 short texts a request take the server less time than a Python client takes to
# send them: a closed loop of such requests measures the client, and 3x that overloads
# nothing. Requests of 64 texts of ~130 tokens each make the server the limit; the open loop
# runs in 4 client processes (one sends about a thousand requests a second at most).
HEAVY_BODY = {
    "input": [
        f"request text {i}: " + " ".join(f"word{(i * 31 + j) % 997}" for j in range(60))
        for i in range(64)
    ]
}


def load_shape(device: str) -> tuple[dict[str, Any], int, int]:
    """(body, open-loop client processes, closed-loop clients) of a load the server limits:
    on a CPU the suite's small requests, on a GPU HEAVY_BODY from 4 client processes (the
    capacity from 16 closed-loop clients)."""
    return (HEAVY_BODY, 4, 16) if device == "cuda" else (BODY, 1, CLIENTS)


def gpu_overload(target: Target, device: str, duration_s: float) -> Row:
    """faults.overload at 3x, with ``load_shape(device)``."""
    body, processes, clients = load_shape(device)
    return overload(target, 3.0, duration_s, body=body, processes=processes, clients=clients)


def write(path: Path, meta: dict[str, Any], rows: list[Row], complete: bool) -> None:
    doc = {**meta, "complete": complete, "rows": [asdict(r) for r in rows]}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


PROG = "python -m load_tests.reliability.gpu_faults"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n")[0], epilog=PROVENANCE_HELP
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="3 kills, 15 s stop (the CPU dry run)")
    p.add_argument("--out", type=Path, default=Path("gpu_faults.json"))
    p.add_argument("--only", default=",".join(FAULTS), help=f"comma-separated: {', '.join(FAULTS)}")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--kills", type=int, default=None, help="default 20 (3 with --quick)")
    p.add_argument("--min-up", type=int, default=None, help="default replicas - 1")
    p.add_argument("--stop-s", type=float, default=None, help="default 30 (15 with --quick)")
    p.add_argument("--hog-s", type=float, default=10.0, help="how long the hog holds memory")
    p.add_argument(
        "--hog-keep-free-gib", type=float, default=1.0, help="what the hog leaves free on the GPU"
    )
    p.add_argument("--overload-s", type=float, default=6.0)
    p.add_argument("--budget-s", type=float, default=400.0, help="the whole run's wall clock")
    a = p.parse_args(argv)
    only = {f.strip() for f in a.only.split(",") if f.strip()}
    if only - set(FAULTS):
        p.error(f"unknown faults {sorted(only - set(FAULTS))}; choose from {', '.join(FAULTS)}")
    kills = a.kills if a.kills is not None else (3 if a.quick else 20)
    stop_s = a.stop_s if a.stop_s is not None else (15.0 if a.quick else 30.0)
    min_up = a.min_up if a.min_up is not None else a.replicas - 1
    from serve_app.ops import launch

    t0 = time.monotonic()
    budget = Budget(a.budget_s)
    meta: dict[str, Any] = {
        **run_meta(PROG, argv),
        "device": a.device,
        "quick": a.quick,
        "replicas": a.replicas,
        "args": app_args(a.device),
        "actor_options": actor_options(a.device),
        "cpus": os.cpu_count(),
        "budget_s": a.budget_s,
    }
    rows: list[Row] = []
    gpus = launch.gpu_count() if a.device == "cuda" else 0
    if a.device == "cuda" and gpus == 0:
        p.error("--device cuda, but this machine has no CUDA GPU (use --device cpu --quick)")
    target = start_suite_cluster(a.device, a.replicas, gpus, min(240.0, budget.left()))
    meta["startup_s"] = round(time.monotonic() - t0, 1)
    meta["reliability_env"] = reliability_env()
    # NVML per process against each replica's budget for the whole run (new pids included).
    watch = BudgetWatch(f"{target.base}/v1/memory").start() if a.device == "cuda" else None
    print(f"deployed {a.replicas} replicas in {meta['startup_s']} s", flush=True)
    # What each fault needs of the budget at most (kill20 takes what the others leave).
    needs = {
        "poisoned": 45.0,
        "sigstop": stop_s + 35.0,
        "hog": a.hog_s + 25.0,
        "overload": a.overload_s + 20.0,
    }
    try:
        for i, fault in enumerate(FAULTS):
            if fault not in only:
                continue
            later = sum(needs.get(f, 0.0) for f in FAULTS[i + 1 :] if f in only)
            if fault in GPU_ONLY and a.device != "cuda":
                rows.append(skipped(fault, "GPU only: not run on a CPU dry run"))
            elif budget.left() < 15.0:
                rows.append(skipped(fault, "the run's budget (--budget-s) ran out"))
            elif wait_whole(target, timeout_s=max(0.0, min(120.0, budget.left()))) is None:
                rows.append(skipped(fault, "the deployment was not whole before it"))
            elif fault == "kill20":
                rows.append(kill_series(target, kills, min_up, budget, leave_s=later))
            elif fault == "poisoned":
                rows.append(poisoned(target, budget))
            elif fault == "sigstop":
                rows.append(sigstop(target, min(stop_s, max(1.0, budget.left() - 30.0))))
            elif fault == "hog":
                rows.append(hog(target, a.hog_s, a.hog_keep_free_gib, budget))
            elif fault == "overload":
                rows.append(gpu_overload(target, a.device, a.overload_s))
            meta["took_s"] = round(time.monotonic() - t0, 1)
            write(a.out, meta, rows, complete=False)
            r = rows[-1]
            print(
                f"{r.fault}: sent {r.sent} lost {r.lost} failed {r.failed} "
                f"recovery_s {r.recovery_s}",
                flush=True,
            )
    finally:
        if watch is not None:
            meta["memory"] = watch.stop()
        launch.shutdown()
    meta["took_s"] = round(time.monotonic() - t0, 1)
    write(a.out, meta, rows, complete=True)
    if watch is not None:
        m = meta["memory"]
        print(
            f"budget violations: {m['budget_violations']} in {m['nvml_samples_judged']} NVML "
            f"samples of {m['replica_pids_judged']} replica processes",
            flush=True,
        )
    print_rows(rows, fault_width=12)
    print(f"wrote {a.out} in {meta['took_s']} s")
    return 0 if all(r.lost == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
