"""``serve-app run | node | check | plan | status``: parse, call the library, print."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
DESCRIPTION = (
    "serve_app: model replicas that share a GPU, each held to its share of the GPU's memory, "
    "on Ray Serve. `serve-app run` serves configs/default.yaml on http://127.0.0.1:8000; "
    "`serve-app COMMAND -h` says more. Docs: README.md."
)
INSECURE_FLAG = "--insecure-no-ray-auth"  # ops.ray_auth.INSECURE_FLAG, without its import here
INSECURE_HELP = (
    "run Ray WITHOUT token authentication (RAY_AUTH_MODE=disabled): anyone who reaches Ray's "
    "ports can run code; only on a machine you alone use"
)


def _default_config() -> str:
    return str(DEFAULT_CONFIG) if DEFAULT_CONFIG.is_file() else "configs/default.yaml"


def cmd_check(
    path: str, gpus: int = 1, gpu_memory: list[str] | None = None, write_shares: str | None = None
) -> int:
    from serve_app.config.deploy import check_deploy_config, load_deploy_config
    from serve_app.errors import ConfigError
    from serve_app.plan import derive

    try:
        doc = load_deploy_config(path, rayservice=True)
        if gpu_memory:
            facts = derive.facts_from_flags(gpu_memory)
        elif derive.has_budgets(doc):
            facts = derive.facts_from_nvml()
        else:
            facts = derive.GpuFacts()
    except (ConfigError, ValueError) as exc:
        print(f"error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
    doc, notes, errors = derive.derive_shares(doc, facts)
    errors += check_deploy_config(doc, gpus=gpus)
    if not errors:  # a user model's class, imported as serve-app run's workers would
        from serve_app.adapters.custom.loader import check_classes

        class_errors, class_notes = check_classes(doc, os.getcwd())
        errors, notes = errors + class_errors, notes + class_notes
    for note in notes:
        print(f"note: {note}")
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    if errors:
        return 2
    if write_shares:
        import yaml

        header = f"# {path} with the num_gpus serve-app check derived (docs/planning.md)\n"
        Path(write_shares).write_text(header + yaml.safe_dump(doc, sort_keys=False))
        print(f"{path}: OK; wrote {write_shares} with the derived num_gpus")
        return 0
    print(f"{path}: OK")
    return 0


def cmd_run(path: str, haproxy: bool, ready_timeout_s: float, insecure: bool = False) -> int:
    from serve_app.config.deploy import load_deploy_config
    from serve_app.errors import ServeAppError
    from serve_app.ops import launch

    stop = threading.Event()
    try:
        from serve_app.plan.derive import for_run

        doc, budget_notes = for_run(load_deploy_config(path))
        for note in budget_notes:
            print(note, flush=True)
        started = launch.run(
            doc,
            haproxy=haproxy,
            ready_timeout_s=ready_timeout_s,
            insecure_no_ray_auth=insecure,
            say=lambda line: print(line, flush=True),  # the device, before Ray's start-up logs
        )
    except (ServeAppError, KeyboardInterrupt) as exc:
        if isinstance(exc, ServeAppError):
            print(f"error: {exc.message}", file=sys.stderr)
        launch.shutdown()
        return 2 if isinstance(exc, ServeAppError) else 130

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    # After ray.init, which installs handlers of its own.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    for note in started.notes:
        print(note, flush=True)
    for warning in started.warnings:
        bar = "!" * 78
        print(f"{bar}\n{warning}\n{bar}", file=sys.stderr, flush=True)
    path_note = "HAProxy ingress" if started.haproxy else "default Serve proxy"
    print(f"serve_app is serving at {started.url} ({path_note}); Ctrl-C stops it.", flush=True)
    while not stop.wait(0.5):
        pass
    print("shutting down...", flush=True)
    launch.shutdown()
    print("stopped.", flush=True)
    return 0


def cmd_node(ns: argparse.Namespace) -> int:
    from serve_app.config.deploy import check_deploy_config, load_deploy_config
    from serve_app.errors import ServeAppError
    from serve_app.ops import node
    from serve_app.ops.cluster_env import longest_request_timeout_s
    from serve_app.startup import warmpool

    ray_args = [a for a in ns.ray_args if a != "--"]
    try:
        timeout_s, system_config = None, {}
        if ns.config:
            doc = load_deploy_config(ns.config)
            errors = check_deploy_config(doc)
            if errors:
                print("\n".join(f"error: {e}" for e in errors), file=sys.stderr)
                return 2
            timeout_s = longest_request_timeout_s(doc)
            system_config = warmpool.system_config(*warmpool.app_settings(doc))
        if ns.check:
            found = node.check_cluster(ns.check, timeout_s, insecure=ns.insecure_no_ray_auth)
            bad = 0
            for node_id, seen in found.items():
                for name, why in seen["differs"].items():
                    bad += 1
                    print(f"node {node_id[:12]} ({seen['ip']}): {name} is {why}")
            print(f"{len(found)} node(s); " + (f"{bad} setting(s) differ" if bad else "all set"))
            return 1 if bad else 0
        spec = node.NodeSpec(
            head=ns.head,
            address=ns.address,
            port=ns.port,
            node_ip_address=ns.node_ip_address,
            num_cpus=ns.num_cpus,
            num_gpus=ns.num_gpus,
            system_config=system_config if ns.head else {},
            ray_args=tuple(ray_args),
        )
        return node.start_node(
            spec,
            os.environ,
            request_timeout_s=timeout_s,
            insecure=ns.insecure_no_ray_auth,
            dry_run=ns.dry_run,
        )
    except ServeAppError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2


def cmd_plan(ns: argparse.Namespace) -> int:
    from serve_app.errors import ServeAppError
    from serve_app.plan.solver import Infeasible
    from serve_app.plan.write import write_plan

    try:
        if ns.from_running:
            from serve_app.plan.fromrunning import plan_from_running

            if not ns.targets:
                print(
                    "error: --from-running needs --targets FILE (docs/planning.md)", file=sys.stderr
                )
                return 2
            print(
                plan_from_running(
                    ns.config,
                    ns.from_running,
                    ns.targets,
                    ns.out,
                    window_s=ns.window_s,
                    metrics_url=ns.metrics,
                    cores_per_gpu=ns.cores_per_gpu,
                )
            )
            return 0
        measurements = ns.measurements
        if ns.measure:
            from serve_app.plan.measure import Settings, measure

            if not ns.targets:
                print("error: --measure needs --targets FILE (docs/planning.md)", file=sys.stderr)
                return 2
            keys = ("share", "candidates", "warmup_s", "duration_s", "idle_duration_s")
            settings = Settings(**{k: getattr(ns, k) for k in keys})
            measurements = str(measure(ns.config, ns.targets, ns.out, settings))
            print(f"wrote {measurements}", flush=True)
        print(write_plan(ns.config, measurements, ns.out))
    except (Infeasible, ServeAppError) as exc:
        print(f"error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
    return 0


def cmd_status(url: str, as_json: bool) -> int:
    from serve_app.errors import ServeAppError
    from serve_app.ops.status import read_memory_report, render_status

    try:
        doc = read_memory_report(url)
    except ServeAppError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    print(json.dumps(doc, indent=2) if as_json else render_status(doc))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="serve-app", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start a local Ray, deploy CONFIG, serve until Ctrl-C")
    run.add_argument("config", nargs="?", default=_default_config())
    run.add_argument(
        "--no-haproxy",
        action="store_true",
        help="use Serve's default Python proxy instead of the HAProxy ingress",
    )
    run.add_argument("--ready-timeout-s", type=float, default=300.0)
    run.add_argument(INSECURE_FLAG, action="store_true", help=INSECURE_HELP)
    node = sub.add_parser(
        "node",
        help="start a Ray node with serve_app's settings and token auth (ray start), or "
        "--check a running cluster's nodes",
        description="Extra `ray start` options go after `--`, e.g. `-- --block`.",
    )
    role = node.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true", help="start a head node")
    role.add_argument("--address", help="join the cluster whose head is HOST:PORT")
    role.add_argument(
        "--check", metavar="ADDRESS", help="read serve_app's settings back from every node"
    )
    node.add_argument("--port", type=int, default=6379, help="the head's GCS port")
    node.add_argument("--node-ip-address")
    node.add_argument("--num-cpus", type=float)
    node.add_argument("--num-gpus", type=int)
    node.add_argument(
        "--config",
        help="the deploy config to be served: its longest request_timeout_s sets HAProxy's "
        "server timeout, its warm_workers the head's preload list",
    )
    node.add_argument(INSECURE_FLAG, action="store_true", help=INSECURE_HELP)
    node.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    node.add_argument("ray_args", nargs=argparse.REMAINDER)
    check = sub.add_parser(
        "check",
        help="validate CONFIG (or a KubeRay RayService's serveConfigV2); print every error",
    )
    check.add_argument("config")
    check.add_argument(
        "--gpus", type=int, default=1, help="GPUs the unpinned GPU shares may spread over"
    )
    check.add_argument(
        "--gpu-memory",
        action="append",
        metavar="[TYPE=|GPU-UUID=]BYTES",
        help="the memory of the GPUs a memory.budget is a share of, as CUDA reports it (torch's "
        "total_memory; e.g. 150109880320 for an H200, H200=150109880320); default: this host's "
        "GPUs through NVML, its total less the driver's reserve (docs/planning.md)",
    )
    check.add_argument(
        "--write-shares",
        metavar="OUT",
        help="write CONFIG with the num_gpus derived from each memory.budget to OUT, for "
        "serve deploy",
    )
    plan = sub.add_parser(
        "plan",
        help="pack CONFIG's models onto GPUs and cores from a measurements file; write the "
        "Serve config and a report",
        description="Solves the packing (replicas x share per model per GPU: memory and cores "
        "less the reserve, each model's p99 target at its load, the most weighted throughput) "
        "from MEASUREMENTS (JSON, docs/planning.md) and writes OUT/serve_config.yaml, "
        "OUT/plan.json and OUT/plan.md. --measure measures them first on this host (one "
        "replica of each application at a time, with the targets of --targets FILE) into "
        "OUT/measurements.json. --from-running URL reads a running server's reports instead "
        "and adds OUT/changes.md: what to change.",
    )
    plan.add_argument("config")
    source = plan.add_mutually_exclusive_group(required=True)
    source.add_argument("--measurements", help="the measurements JSON")
    source.add_argument("--measure", action="store_true", help="measure on this host first")
    source.add_argument(
        "--from-running", metavar="URL", help="re-plan from the running server at URL"
    )
    plan.add_argument("--out", required=True, help="folder for the config and the report")
    plan.add_argument("--targets", help="p99 targets, loads, reserve (JSON or YAML)")
    plan.add_argument("--share", type=float, default=0.5, help="--measure: GPU share measured")
    plan.add_argument("--candidates", type=int, default=3, help="--measure: batch caps measured")
    plan.add_argument("--warmup-s", type=float, default=2.0, help="--measure: before a window")
    plan.add_argument("--duration-s", type=float, default=10.0, help="--measure: at saturation")
    plan.add_argument("--idle-duration-s", type=float, default=5.0, help="--measure: one at a time")
    plan.add_argument("--window-s", type=float, default=30.0, help="--from-running: between reads")
    plan.add_argument(
        "--metrics",
        metavar="URL",
        help="--from-running: Ray's metrics endpoint (items a request, p99)",
    )
    plan.add_argument(
        "--cores-per-gpu",
        type=float,
        help="--from-running: default the cores the local replicas may run on, over the GPUs",
    )
    status = sub.add_parser("status", help="per-replica memory table of a running app")
    status.add_argument("--url", default="http://127.0.0.1:8000")
    status.add_argument("--json", action="store_true")
    ns = parser.parse_args(argv)
    if ns.command == "check":
        return cmd_check(ns.config, max(ns.gpus, 1), ns.gpu_memory, ns.write_shares)
    if ns.command == "run":
        return cmd_run(ns.config, not ns.no_haproxy, ns.ready_timeout_s, ns.insecure_no_ray_auth)
    if ns.command == "node":
        return cmd_node(ns)
    if ns.command == "plan":
        return cmd_plan(ns)
    return cmd_status(ns.url, ns.json)
