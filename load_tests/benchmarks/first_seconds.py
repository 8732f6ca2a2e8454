"""Is a fresh server as fast in its first seconds as later? ``python -m serve_app run CONFIG`` as
a user starts it; from the moment ``/readyz`` turns 200, wrk back to back in ``--windows``
windows of ``--window-s`` seconds each, with the same connections and bodies; each window's
requests/s, errors and latency percentiles. Issue 28's target: the first window's p99 at most
``--max-ratio`` (2) times the last window's. Each repeat starts the server afresh (a new
port, the same calibration cache: a restart as users see it). On a GPU, NVML per process is
judged against each replica's budget from the start (BudgetWatch), and each window records the
server's CPU seconds by kind of process (replicas, HAProxy, Serve's control plane, Ray's
daemons, the rest: proccpu.py), which says what else is busy while the first window is slow,
and what the replicas did meanwhile (garbage collections, start-up work still left: /v1/memory).
Before the starts, one window of the same wrk against HAProxy's static no-op on the server's
cores gives the client's own ceiling (``client_ceiling``, with its headroom over the windows).

    python -m load_tests.benchmarks.first_seconds --device cuda --replicas 4 --out first.json
    python -m load_tests.benchmarks.first_seconds --device cpu --replicas 1 --out first.json
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

from load_tests.benchmarks.startup.cold import stop_cli
from load_tests.benchmarks.startup.probes import first_200
from load_tests.benchmarks.startup.rows import cold_config
from load_tests.benchmarks.throughput.options import parse_cores
from load_tests.benchmarks.throughput.payload import model_payload
from load_tests.benchmarks.throughput.proccpu import ProcCpu, ServerCpu, same_process
from load_tests.harness.meta import PROVENANCE_HELP, ROOT, run_meta
from load_tests.harness.nvml import BudgetWatch
from load_tests.harness.wrk import WrkTarget, find_wrk, pin_prefix, run_wrk

PROG = "python -m load_tests.benchmarks.first_seconds"


def window_verdict(windows: list[dict[str, Any]], max_ratio: float) -> dict[str, Any]:
    """The first window's p99 against the last's; ``ok`` when every window ran without an
    error and the ratio is at most ``max_ratio``."""
    ran = [w for w in windows if "error" not in w]
    if len(ran) < 2 or len(ran) != len(windows):
        return {"ok": False, "why": "a window did not run", "p99_ratio": None}
    first, last = ran[0]["p99_ms"], ran[-1]["p99_ms"]
    ratio = first / last if last > 0 else None
    errors = sum(int(w["errors"]) for w in ran)
    ok = ratio is not None and ratio <= max_ratio and errors == 0
    why = None if ok else (f"{errors} errors" if errors else f"p99 ratio {ratio} > {max_ratio}")
    return {"ok": ok, "why": why, "p99_ratio": round(ratio, 3) if ratio else None, "errors": errors}


# What a window's replicas still had of their start-up work (idle.LeftoverStartup), by report
# field: graph captures between batches under load stall a replica's queue (up to
# idle.WANTED_CAPTURE_S a step).
LEFTOVER_FIELDS = ("cuda_graphs", "cuda_graphs_pending", "warmup_pending")
LONG_PAUSES_SETTLE_S = 1.5  # more than the replicas' REPORT_PERIOD_S (serving/report.py)


def replica_reports(url: str) -> dict[str, dict[str, Any]]:
    """Each replica's report (``GET /v1/memory``) by replica id; empty when unreadable."""
    import httpx

    try:
        reps = httpx.get(f"{url}/v1/memory", timeout=10.0).json().get("replicas", [])
    except (httpx.HTTPError, ValueError):
        return {}
    return {r["replica_id"]: r for r in reps if "replica_id" in r}


def during(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict:
    """Between two ``replica_reports`` readings, summed over the replicas in both: garbage
    collections by generation (0, 1, 2) and their seconds, and the start-up work left
    (``LEFTOVER_FIELDS``) at each end. The reports refresh once a second (REPORT_PERIOD_S)."""
    common = [k for k in after if k in before and before[k].get("gc") and after[k].get("gc")]

    def delta(key: str, g: int) -> float:
        return sum(after[k]["gc"][key][g] - before[k]["gc"][key][g] for k in common)

    def total(reports: dict[str, dict[str, Any]], key: str) -> int:
        return sum(int(reports[k].get(key) or 0) for k in common)

    return {
        "replicas": len(common),
        "gc_collections": [int(delta("collections", g)) for g in range(3)],
        "gc_pause_s": [round(delta("pause_s", g), 4) for g in range(3)],
        "before": {key: total(before, key) for key in LEFTOVER_FIELDS},
        "after": {key: total(after, key) for key in LEFTOVER_FIELDS},
    }


def long_pauses(reports: dict[str, dict[str, Any]], since_s: float, until_s: float) -> dict:
    """Over every replica's report, the long collections (``gc.long_pauses``, serving/gcwatch:
    each replica's latest 32 of 10 ms or more) that ended between two unix times: how many
    and the longest, by generation (0, 1, 2)."""
    found = [
        p
        for rep in reports.values()
        for p in (rep.get("gc") or {}).get("long_pauses", [])
        if since_s <= p["at_unix_s"] < until_s
    ]
    by_gen = [[p["pause_s"] for p in found if p["generation"] == g] for g in range(3)]
    return {
        "count": [len(x) for x in by_gen],
        "longest_s": [round(max(x, default=0.0), 4) for x in by_gen],
    }


def top_processes(
    before: dict[int, ProcCpu], after: dict[int, ProcCpu], n: int = 6
) -> list[dict[str, Any]]:
    """The ``n`` processes that used the most CPU between two snapshots (``ServerCpu.last``;
    one that started in between counts whole)."""
    used = []
    for pid, a in after.items():
        b = before.get(pid)
        cpu_s = a.cpu_s - b.cpu_s if b is not None and same_process(b, a) else a.cpu_s
        used.append({"pid": pid, "title": a.title, "kind": a.kind, "cpu_s": round(cpu_s, 3)})
    return sorted(used, key=lambda u: -u["cpu_s"])[:n]


def app_arg(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--arg``/``--ab-arg``: an application arg, VALUE read as YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. warmup=false")
    return key, yaml.safe_load(value)


def arm_order(repeats: int, arms: int) -> list[int]:
    """Which arm each repeat starts: one arm throughout, or two in ABBA order (A B B A A B ...),
    so that neither arm always has the earlier, cooler start."""
    if arms == 1:
        return [0] * repeats
    return [(0, 1, 1, 0)[r % 4] for r in range(repeats)]


def window_wrk(a: argparse.Namespace, target: WrkTarget, work: Path) -> dict[str, Any]:
    """One window of wrk at ``target``: the run's connections, threads, cores and seconds."""
    return run_wrk(
        a.wrk,
        target,
        connections=a.connections,
        threads=a.threads,
        duration_s=a.window_s,
        cores=a.client_cores,
        work_dir=work,
    )


def client_ceiling(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """wrk as the windows run it (connections, threads, cores, body, one window's seconds)
    against HAProxy's static no-op on the server's cores, answering with a body of the
    model's answer's size: the most this client carries, beside the windows' figures."""
    from load_tests.benchmarks.throughput.noop_server import NoopHAProxy

    payload = model_payload("minilm", a.inputs_per_request, workload=a.workload)
    server = NoopHAProxy(a.server_cores, [payload], work)
    try:
        w = window_wrk(
            a, WrkTarget(server.url_for(payload), payload.headers, payload.write(work)), work
        )
    finally:
        server.stop()
    keep = ("requests_per_s", "p50_ms", "p99_ms", "errors", "command")
    return {"server": "haproxy-static-noop", **{k: w.get(k) for k in keep}}


def one_start(a: argparse.Namespace, doc: dict[str, Any], work: Path, repeat: int) -> dict:
    from serve_app.ops import launch, ports

    doc["http_options"]["port"] = ports.free_port()
    host, port = launch.http_address(doc)
    url = f"http://{host}:{port}"
    config = work / f"first-{repeat}.yaml"
    config.write_text(yaml.safe_dump(doc))
    log_path = work / f"first-{repeat}.log"
    payload = model_payload("minilm", a.inputs_per_request, workload=a.workload)
    target = WrkTarget(url + payload.path, payload.headers, payload.write(work))
    cmd = [*pin_prefix(a.server_cores), sys.executable, "-m", "serve_app", "run", str(config)]
    cmd += ["--ready-timeout-s", str(int(a.ready_timeout_s))]
    env = {**os.environ, **ports.haproxy_side_ports()}
    row: dict[str, Any] = {"repeat": repeat, "windows": []}
    with log_path.open("wb") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    watch = BudgetWatch(f"{url}/v1/memory").start() if a.device == "cuda" else None
    try:
        deadline = t0 + a.ready_timeout_s
        ready_at = first_200(f"{url}/readyz", deadline, lambda: proc.poll() is None, lambda: None)
        if ready_at is None:
            tail = log_path.read_text(errors="replace")[-1500:]
            return {**row, "note": f"never ready; CLI output: {tail}"}
        row["ready_s"] = round(ready_at - t0, 3)
        spans: list[tuple[float, float]] = []  # each window's unix start and end
        for i in range(a.windows):
            started_s = time.monotonic() - ready_at
            cpu = ServerCpu([proc.pid])  # the CLI's tree: Ray's daemons, workers, HAProxy
            cpu.start()
            reports_before, w_start = replica_reports(url), time.time()
            w = window_wrk(a, target, work)
            w_end = time.time()
            w["server_cpu"] = cpu.stop(int(w.get("requests", 0)))
            w["top_processes"] = top_processes(*cpu.last)
            w["replicas"] = during(reports_before, replica_reports(url))
            spans.append((w_start, w_end))
            row["windows"].append({"window": i, "started_after_ready_s": round(started_s, 3), **w})
            if "error" not in w:
                print(
                    f"repeat {repeat} window {i} (+{started_s:.1f} s): {w['requests_per_s']:,.0f} "
                    f"req/s, p50 {w['p50_ms']:.1f} ms, p99 {w['p99_ms']:.1f} ms, "
                    f"{w['errors']} errors; server cores busy "
                    f"{w['server_cpu']['server_cores_busy']} "
                    f"{w['server_cpu']['server_cpu_s_by_kind']}; replicas {w['replicas']}",
                    flush=True,
                )
        # The replicas' long collections, read once the last window's are in the reports
        # (refreshed every REPORT_PERIOD_S), each counted in the window it ended in.
        time.sleep(LONG_PAUSES_SETTLE_S)
        final = replica_reports(url)
        for w, (since_s, until_s) in zip(row["windows"], spans, strict=True):
            w["replicas"]["gc_long_pauses"] = long_pauses(final, since_s, until_s)
        row["verdict"] = window_verdict(row["windows"], a.max_ratio)
    finally:
        if watch is not None:
            row["budget_watch"] = watch.stop()
        row["stop"] = stop_cli(proc, host, port)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=PROG, description=(__doc__ or "").split("\n\n")[0], epilog=PROVENANCE_HELP
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--inputs-per-request", type=int, default=1)
    p.add_argument("--workload", choices=("short", "mixed"), default="short")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--threads", type=int, default=4, help="wrk's threads")
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-ratio", type=float, default=2.0)
    p.add_argument("--ready-timeout-s", type=float, default=240.0)
    p.add_argument("--server-cores", type=parse_cores, default=[], help="e.g. 0-11 (taskset)")
    p.add_argument("--client-cores", type=parse_cores, default=[], help="wrk's, e.g. 12-15")
    p.add_argument("--warm-workers", type=int, default=None, help="args.warm_workers (A/B)")
    p.add_argument(
        "--arg",
        type=app_arg,
        action="append",
        default=[],
        help="KEY=VALUE: an application arg for every start (repeatable)",
    )
    p.add_argument(
        "--ab-arg",
        type=app_arg,
        action="append",
        default=[],
        help="KEY=VALUE: the args of arm B (repeatable); repeats alternate A and B, ABBA",
    )
    p.add_argument("--wrk", default=str(ROOT / ".tools" / "wrk"))
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    a.wrk = find_wrk(a.wrk)
    if a.wrk is None:
        p.error("wrk not found: build .tools/wrk (../shared/gpu-host/make-tools.sh) or install it")
    if a.windows < 2:
        p.error("--windows: at least 2 (the first is judged against the last)")
    from serve_app.ops import launch

    if a.device == "cuda" and launch.gpu_count() == 0:
        p.error("--device cuda, but this machine has no CUDA GPU (use --device cpu)")
    work = Path(tempfile.mkdtemp(prefix="first-seconds-"))
    base = yaml.safe_load(
        (ROOT / "configs" / ("gpu-shared.yaml" if a.device == "cuda" else "cpu.yaml")).read_text()
    )
    doc = cold_config(base, a.device, a.replicas, work / "calibration-cache")
    if a.warm_workers is not None:
        doc["applications"][0]["args"]["warm_workers"] = a.warm_workers
    doc["applications"][0]["args"].update(dict(a.arg))
    arms = [doc]
    if a.ab_arg:
        arms.append(copy.deepcopy(doc))
        arms[1]["applications"][0]["args"].update(dict(a.ab_arg))
    ceiling = client_ceiling(a, work)
    print(f"client ceiling (wrk against HAProxy's no-op): {ceiling['requests_per_s']} req/s")
    rows = []
    for r, arm in enumerate(arm_order(a.repeats, len(arms))):
        rows.append({"arm": "AB"[arm], **one_start(a, copy.deepcopy(arms[arm]), work, r)})
    carried = [w.get("requests_per_s") or 0.0 for r in rows for w in r.get("windows", [])]
    ceiling["headroom"] = (
        round(ceiling["requests_per_s"] / max(carried), 2)
        if carried and max(carried) > 0 and ceiling.get("requests_per_s")
        else None
    )
    verdicts = [r.get("verdict", {"ok": False}) for r in rows]
    violations = sum(int(r.get("budget_watch", {}).get("budget_violations", 0)) for r in rows)
    result = {
        "meta": run_meta(PROG, argv),
        "config": doc,
        "config_b": arms[1] if len(arms) > 1 else None,
        "args": {k: v for k, v in vars(a).items() if k not in ("out",)} | {"out": str(a.out)},
        "client_ceiling": ceiling,
        "p99_ratio_by_arm": {
            arm: [r.get("verdict", {}).get("p99_ratio") for r in rows if r["arm"] == arm]
            for arm in "AB"[: len(arms)]
        },
        "rows": rows,
        "all_ok": all(v["ok"] for v in verdicts) and violations == 0,
        "budget_violations": violations,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    for r in rows:
        said = r.get("verdict") or r.get("note")
        print(f"repeat {r['repeat']} (arm {r['arm']}): ready after {r.get('ready_s')} s; {said}")
    print(f"first p99 / last, by arm: {result['p99_ratio_by_arm']}")
    print(f"client headroom {ceiling['headroom']}x the busiest window")
    print(f"all_ok {result['all_ok']}; budget violations {violations}; wrote {a.out}")
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
