"""The command: the parts in order, each in its own process with its share of the budget, and
the summary (multigpu.json) rewritten after each."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from load_tests.benchmarks.multigpu import rows
from load_tests.benchmarks.multigpu.common import gpu_uuids, run_part, write_json
from load_tests.harness.meta import PROVENANCE_HELP, machine_info, run_meta
from load_tests.harness.run import error_doc, log, set_t0

# Most valuable first: the two-GPU speedup, then the per-GPU grab, then placement.
PARTS: tuple[str, ...] = ("throughput", "grab", "placement")
WEIGHTS = {"throughput": 0.55, "grab": 0.28, "placement": 0.17}
FINAL_RESERVE_S = 10.0  # the summary, after the last part
# Per device: (GPU host, CPU dry run).
MIN_S = {"throughput": (120.0, 60.0), "grab": (70.0, 60.0), "placement": (45.0, 40.0)}
TEARDOWN_S = (15.0, 10.0)  # a part's own cleanup, inside its share
CLIENT_CEILING_S = (40.0, 25.0)  # wrk and the open-loop client against the no-op, two payloads
TOOL_GRACE_S = 15.0  # the throughput tool past its --max-time-s by this much is stopped


def settings(device: str, quick: bool) -> dict[str, Any]:
    """Every figure of the run: the GPU host's, or the CPU dry run's (small and short)."""
    cpu = device == "cpu"
    return {
        # throughput: the same per-GPU layout on one GPU and on two
        "per_gpu": 1 if cpu else 4,
        "inputs_per_request": [64, 1],
        "duration_s": None if cpu or quick else 5.0,  # the tool's --quick durations on the CPU
        # grab
        "grab_per_gpu": 2 if cpu else 4,
        "grab_clients": 3 if cpu else 16,
        "steady_s": 5.0 if cpu or quick else 8.0,
        "hold_s": 12.0 if cpu or quick else 20.0,
        "keep_free_gib": 1.0,  # under controller.yaml's 2 GiB margin
        "release_s": 25.0,
        # placement
        "placement_clients": 2 if cpu else 4,
        "placement_load_s": 6.0 if cpu or quick else 10.0,
    }


PROG = "python -m load_tests.benchmarks.multigpu"


def build_parser() -> argparse.ArgumentParser:
    from load_tests.benchmarks.throughput.options import DEFAULT_WRK

    p = argparse.ArgumentParser(
        prog=PROG,
        epilog=PROVENANCE_HELP + " (in multigpu.json)",
        description="Two GPUs: throughput against one, a per-GPU memory grab under the headroom "
        "controller, fractional placement. Raw JSON under --out-dir.",
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="short phases (the CPU dry run)")
    p.add_argument("--out-dir", type=Path, help="where the JSON goes (required)")
    p.add_argument("--budget-s", type=float, default=None, help="wall clock (500; CPU 360)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {PARTS}")
    p.add_argument("--wrk", default=DEFAULT_WRK, help="wrk binary (its libluajit beside it)")
    p.add_argument("--no-client-ceiling", action="store_true", help="skip the no-op ceiling")
    p.add_argument("--_part", choices=("grab", "placement"), help=argparse.SUPPRESS)
    p.add_argument("--_spec", help=argparse.SUPPRESS)
    return p


def throughput_command(cfg: dict[str, Any], out: Path, max_time_s: float, phases: str) -> list:
    """load_tests.benchmarks.throughput on one node with both GPUs: ``per_gpu`` replicas (one
    GPU, Ray packs them) then twice that (two GPUs), at 1/per_gpu of a GPU each."""
    p = cfg["per_gpu"]
    cmd = [sys.executable, "-m", "load_tests.benchmarks.throughput", "--out", str(out)]
    cmd += ["--device", cfg["device"], "--models", "minilm", "--gpu", "0,1"]
    cmd += ["--replica-share", f"{1 / p:g}", "--replicas", f"{p},{2 * p}"]
    cmd += ["--inputs-per-request", ",".join(str(n) for n in cfg["inputs_per_request"])]
    cmd += ["--phases", phases, "--max-time-s", f"{max_time_s:.0f}", "--wrk", cfg["wrk"]]
    if cfg["quick"] or cfg["device"] == "cpu":
        cmd.append("--quick")
    if cfg["duration_s"]:
        cmd += ["--duration-s", f"{cfg['duration_s']:g}"]
    if phases == "client":
        cmd.append("--merge")
    return cmd


def run_throughput(cfg: dict[str, Any], out_dir: Path, allot_s: float, phases: str) -> int:
    import subprocess

    from load_tests.benchmarks.throughput.workers import Worker, wait_worker

    tp = out_dir / "throughput"
    tp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    wrk_dir = str(Path(cfg["wrk"]).resolve().parent)  # wrk's libluajit, as gpu_throughput.sh
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [wrk_dir, env.get("LD_LIBRARY_PATH")]))
    cmd = throughput_command(cfg, tp, allot_s, phases)
    log_path = out_dir / f"throughput-{phases}.log"
    with log_path.open("ab") as f:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=f, stderr=f)
    # The tool keeps to its --max-time-s; past it by TOOL_GRACE_S it is stopped.
    hard = time.time() + allot_s + TOOL_GRACE_S
    _, rc = wait_worker(Worker(proc, tp / "meta.json", log_path), hard)
    return rc


def throughput_summary(cfg: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    tp = out_dir / "throughput"
    table: list[dict[str, Any]] = _read(tp / "throughput.json") or []
    meta: dict[str, Any] = _read(tp / "meta.json") or {}
    reports: dict[str, Any] = _read(tp / "server_reports.json") or {}
    p = cfg["per_gpu"]
    speed = rows.speedup(table, p, 2 * p)
    by_job = {k: rows.replicas_per_gpu(v) for k, v in reports.items()}
    summary = {
        "speedup": speed,
        "replicas_by_gpu": by_job,
        "layout_ok": rows.layout_check(by_job, p),
        **rows.violations_total(table),
        "cores": meta.get("cores"),
        "client_ceiling": [
            {k: r.get(k) for k in ("client", "payload", "status", "requests_per_s", "note")}
            for r in table
            if r.get("setup") == "client_ceiling"
        ],
        "not_measured": [
            {k: r.get(k) for k in ("replicas", "payload", "client", "status", "note")}
            for r in table
            if r.get("status") != "ok"
        ],
        "errors": meta.get("errors"),
    }
    wanted = [s for s in speed if s["inputs_per_request"] > 1]
    summary["status"] = "ok" if wanted and all(s["speedup"] for s in wanted) else "partial"
    if cfg["device"] == "cpu":
        summary["note"] = (
            "CPU dry run: the tool's CPU mode runs the replicas on the CPU with no GPU share "
            "(num_gpus null) and no NVML; the layout (per_gpu on one GPU, twice that on two) "
            "is only real on the GPU host"
        )
    return summary


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def part_spec(name: str, cfg: dict[str, Any], end_unix: float) -> dict[str, Any]:
    cpu = cfg["device"] == "cpu"
    spec = {
        "device": cfg["device"],
        "out_dir": str(cfg["out_dir"]),
        "scratch": cfg["scratch"],
        "t0_unix": cfg["t0_unix"],
        "deadline_unix": end_unix - TEARDOWN_S[cpu],
        "gpus": cfg["gpus"],
        "gpu_name": cfg.get("gpu_name"),
        "nvml_script": cfg.get("nvml_script"),
    }
    if name == "grab":
        spec.update(per_gpu=cfg["grab_per_gpu"], clients=cfg["grab_clients"])
        spec.update({k: cfg[k] for k in ("steady_s", "hold_s", "keep_free_gib", "release_s")})
    else:
        spec.update(clients=cfg["placement_clients"], load_s=cfg["placement_load_s"])
    return spec


def part_main(a: argparse.Namespace) -> int:
    """A part's worker process (``--_part``)."""

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    spec = json.loads(Path(a._spec).read_text())
    set_t0(spec.get("t0_unix"))
    if a._part == "grab":
        from load_tests.benchmarks.multigpu.grab import grab_worker

        grab_worker(spec)
    else:
        from load_tests.benchmarks.multigpu.placement import placement_worker

        placement_worker(spec)
    # Its JSON is written and its cluster stopped: leave now, not after a load client still
    # blocked on a request (harness.load.Load's threads are not daemons).
    sys.stdout.flush()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a._part:
        return part_main(a)
    if a.out_dir is None:
        parser.error("--out-dir is required")
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    if not parts or set(parts) - set(PARTS):
        parser.error(f"--parts {a.parts!r}: choose from {', '.join(PARTS)}")
    cpu = a.device == "cpu"
    budget_s = a.budget_s or (360.0 if cpu else 500.0)
    t0 = time.time()
    set_t0(t0)
    end = t0 + budget_s - FINAL_RESERVE_S
    for name, value in {
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # CUDA's indices as NVML's: the labels' UUIDs
    }.items():
        os.environ.setdefault(name, value)
    # Ray with token auth, and one token for every node and driver of this run.
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    out_dir: Path = a.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="mg-", dir="/tmp"))  # short: Ray's socket paths
    cfg: dict[str, Any] = {**settings(a.device, a.quick), "device": a.device, "quick": a.quick}
    cfg.update(out_dir=out_dir, scratch=str(scratch), t0_unix=t0, wrk=a.wrk)
    doc: dict[str, Any] = {
        **run_meta(PROG, argv),
        "schema_version": 1,
        "created_unix_s": t0,
        "device": a.device,
        "quick": a.quick,
        "budget_s": budget_s,
        "order": parts,
        "settings": {k: v for k, v in cfg.items() if k not in ("out_dir", "scratch", "t0_unix")},
        "parts": {},
        "notes": [],
        "errors": [],
    }
    summary = out_dir / "multigpu.json"
    try:
        doc["machine"] = machine_info()
        cfg["gpus"] = gpu_uuids(a.device)
        gpu_list = doc["machine"].get("gpus") or []
        cfg["gpu_name"] = gpu_list[0]["name"] if gpu_list else None
        if len(cfg["gpus"]) < 2:
            raise RuntimeError(f"two GPUs needed, NVML sees {len(cfg['gpus'])}: {cfg['gpus']}")
        doc["gpus"] = cfg["gpus"][:2]
        if cpu:
            from load_tests.benchmarks.multigpu.common import fake_nvml_doc

            cfg["nvml_script"] = str(scratch / "nvml.json")
            write_json(Path(cfg["nvml_script"]), fake_nvml_doc())
            doc["notes"].append(
                "CPU dry run: no CUDA and no NVML; GPUs are Ray's logical ones, named by a "
                "scripted NVML (serve_app.testing.nvml), and NVML per-process fields "
                "are null"
            )
    except Exception as exc:  # noqa: BLE001 - nothing can run; say why in the summary
        doc["errors"].append(error_doc(exc))
        write_json(summary, doc)
        log(f"cannot run: {exc}")
        return 2
    write_json(summary, doc)
    weights = {p: WEIGHTS[p] for p in parts}
    try:
        for name in parts:
            left = end - time.time()
            allot = rows.allot_s(left, weights, name, MIN_S[name][cpu])
            weights.pop(name)
            entry: dict[str, Any] = {"allotted_s": round(allot)}
            entry["started_s"] = round(time.time() - t0)
            doc["parts"][name] = entry
            if allot < MIN_S[name][cpu]:
                entry.update(status="skipped", reason=f"time budget: {allot:.0f} s for it")
                log(f"part {name}: skipped ({allot:.0f} s for it)")
                continue
            log(f"part {name}: {allot:.0f} s of the {left:.0f} s left")
            part_end = time.time() + allot
            try:
                if name == "throughput":
                    entry["exit_code"] = run_throughput(cfg, out_dir, allot, "serve")
                    entry.update(throughput_summary(cfg, out_dir))
                else:
                    spec = part_spec(name, cfg, part_end)
                    entry["exit_code"] = run_part(name, spec, out_dir, part_end)
                    entry.update(part_summary(name, out_dir))
            except Exception as exc:  # noqa: BLE001 - recorded; the next part still runs
                entry.update(status="error", error=error_doc(exc))
            entry["took_s"] = round(time.time() - t0 - entry["started_s"], 1)
            write_json(summary, doc)
        client_ceiling(cfg, doc, out_dir, a.no_client_ceiling, end)
    finally:
        doc["took_s"] = round(time.time() - t0, 1)
        write_json(summary, doc)
        shutil.rmtree(scratch, ignore_errors=True)
    print_summary(doc)
    return 0 if all(p.get("status") == "ok" for p in doc["parts"].values()) else 1


def client_ceiling(
    cfg: dict[str, Any], doc: dict[str, Any], out_dir: Path, skip: bool, end: float
) -> None:
    """The clients' own ceiling against HAProxy's no-op, last: only with time to spare."""
    entry = doc["parts"].get("throughput")
    if skip or entry is None or entry.get("status") == "skipped":
        return
    left = end - time.time()
    if left - TOOL_GRACE_S < CLIENT_CEILING_S[cfg["device"] == "cpu"]:
        entry["client_ceiling_note"] = f"not measured: {left:.0f} s left at the end"
        return
    meta = out_dir / "throughput" / "meta.json"
    if meta.is_file():  # the serve run's meta, before the merge run rewrites it
        shutil.copy(meta, out_dir / "throughput" / "meta_serve.json")
    log(f"client ceiling: {left:.0f} s left")
    run_throughput(cfg, out_dir, left - TOOL_GRACE_S, "client")
    entry.update(throughput_summary(cfg, out_dir))
    write_json(out_dir / "multigpu.json", doc)


def part_summary(name: str, out_dir: Path) -> dict[str, Any]:
    """The headline figures of a part's JSON."""
    file = "grab_timeline.json" if name == "grab" else "placement.json"
    got = _read(out_dir / file) or {}
    keys = {
        "grab": ("status", "reason", "verdict", "grab", "load", "deployed_s", "nodes_up_s"),
        "placement": (
            "status",
            "reason",
            "replicas_by_gpu",
            "all_budgets_within_total",
            "budget_violations",
            "load",
            "deploy_s",
        ),
    }[name]
    out = {k: got.get(k) for k in keys}
    if name == "grab":
        out["phases"] = got.get("phases")
        out["transitions"] = rows.transitions(got.get("samples") or [])
    if name == "placement":
        out["by_gpu"] = [
            {k: v for k, v in r.items() if k != "replica_detail"} for r in got.get("by_gpu") or []
        ]
    out["status"] = out["status"] or "error"
    out["file"] = file
    out["errors"] = [e.get("error") for e in got.get("errors", [])]
    return out


def print_summary(doc: dict[str, Any]) -> None:
    print(f"multigpu: {doc['device']} in {doc.get('took_s')} s of {doc['budget_s']:.0f}")
    for name, p in doc["parts"].items():
        print(f"  {name}: {p.get('status')} ({p.get('took_s')} s) {p.get('reason') or ''}")
        for e in p.get("errors") or []:
            print(f"    error: {str(e)[:300]}")
    tp = doc["parts"].get("throughput") or {}
    for s in tp.get("speedup") or []:
        ratio = "not measured" if s["speedup"] is None else f"{s['speedup']}x"
        print(
            f"  x{s['inputs_per_request']}: {s['one_gpu_texts_per_s']} texts/s on one GPU, "
            f"{s['two_gpu_texts_per_s']} on two: {ratio} (wanted {s['wanted']})"
        )
    if tp:
        print(f"  throughput: budget violations {tp.get('budget_violations')}")
        print(f"  throughput: cores {tp.get('cores')}")
    grab = doc["parts"].get("grab") or {}
    if grab.get("verdict"):
        print(f"  grab: {json.dumps(grab['verdict'])}")
    pl = doc["parts"].get("placement") or {}
    if pl.get("replicas_by_gpu") is not None:
        print(
            f"  placement: {pl['replicas_by_gpu']}, budgets within total "
            f"{pl.get('all_budgets_within_total')}, violations {pl.get('budget_violations')}"
        )
