"""``serve-app run | check | status``: parse, call the library, print."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"


def _default_config() -> str:
    return str(DEFAULT_CONFIG) if DEFAULT_CONFIG.is_file() else "configs/default.yaml"


def cmd_check(path: str, gpus: int = 1) -> int:
    from serve_app.config.deploy import check_deploy_config, load_deploy_config
    from serve_app.errors import ConfigError

    try:
        doc = load_deploy_config(path)
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    errors = check_deploy_config(doc, gpus=gpus)
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    if errors:
        return 2
    print(f"{path}: OK")
    return 0


def cmd_run(path: str, haproxy: bool, ready_timeout_s: float) -> int:
    from serve_app.config.deploy import load_deploy_config
    from serve_app.errors import ServeAppError
    from serve_app.ops import launch

    stop = threading.Event()
    try:
        doc = load_deploy_config(path)
        started = launch.run(doc, haproxy=haproxy, ready_timeout_s=ready_timeout_s)
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
    parser = argparse.ArgumentParser(prog="serve-app", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start a local Ray, deploy CONFIG, serve until Ctrl-C")
    run.add_argument("config", nargs="?", default=_default_config())
    run.add_argument(
        "--no-haproxy",
        action="store_true",
        help="use Serve's default Python proxy instead of the HAProxy ingress",
    )
    run.add_argument("--ready-timeout-s", type=float, default=300.0)
    check = sub.add_parser("check", help="validate CONFIG and print every error")
    check.add_argument("config")
    check.add_argument(
        "--gpus", type=int, default=1, help="GPUs the unpinned GPU shares may spread over"
    )
    status = sub.add_parser("status", help="per-replica memory table of a running app")
    status.add_argument("--url", default="http://127.0.0.1:8000")
    status.add_argument("--json", action="store_true")
    ns = parser.parse_args(argv)
    if ns.command == "check":
        return cmd_check(ns.config, max(ns.gpus, 1))
    if ns.command == "run":
        return cmd_run(ns.config, not ns.no_haproxy, ns.ready_timeout_s)
    return cmd_status(ns.url, ns.json)
