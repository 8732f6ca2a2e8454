"""A replica's per-request CPU cost at its HTTP edge, under Serve's replica logger as
``logging_config`` sets it up (TEXT or JSON encoding, access log off), in-process.

It drives ``serving.http.Ingress`` with ASGI messages (no sockets), inside a Serve request
context as direct ingress sets one, for three answers: a 200 (logs nothing), a 404 (logs
nothing) and a 500 from a handler that raises (its error-id line and traceback: one ERROR record
through Serve's filters, formatter and file). Run it from a worktree (PYTHONPATH=$PWD) or from
main to compare the edge before request ids:

    python load_tests/benchmarks/logs/request_cost.py --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from typing import Any


def _configure(encoding: str, logs_dir: str) -> None:
    from ray.serve._private.common import ServeComponentType
    from ray.serve._private.logging_utils import configure_component_logger
    from ray.serve.schema import LoggingConfig

    configure_component_logger(
        component_name="bench_model",
        component_id="r1",
        logging_config=LoggingConfig(encoding=encoding, enable_access_log=False, logs_dir=logs_dir),
        component_type=ServeComponentType.REPLICA,
        max_bytes=512 * 1024 * 1024,
        backup_count=1,
    )
    try:
        from serve_app.serving import requestid
    except ImportError:  # main before request ids: its lines stay outside Serve's logger
        return
    requestid.attach_to_serve()


async def _measure(path: str, n: int, repeats: int) -> list[float]:
    """Microseconds per request, one figure per repeat of ``n`` requests."""
    from ray.serve.context import _RequestContext, _serve_request_context
    from starlette.requests import Request
    from starlette.responses import Response

    from serve_app.serving.http import Ingress, json_response

    async def ok(request: Request) -> Response:
        return json_response({"object": "list", "data": [0.1, 0.2]}, headers={"x-r": "1"})

    async def crash(request: Request) -> Response:
        raise RuntimeError("benchmark: a handler that raises")

    app = Ingress({"/ok": {"POST": ok}, "/crash": {"POST": crash}})
    body = {"type": "http.request", "body": b"{}", "more_body": False}

    async def receive() -> dict[str, Any]:
        return body

    async def send(message: dict[str, Any]) -> None:
        pass

    def scope(i: int) -> dict[str, Any]:
        return {
            "type": "http",
            "method": "POST",
            "path": path,
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"x-request-id", b"req-%d" % i)],
        }

    async def one(i: int) -> None:
        _serve_request_context.set(_RequestContext(request_id=f"req-{i}", app_name="bench"))
        await app(scope(i), receive, send)

    for i in range(min(n, 200)):  # warm-up
        await asyncio.create_task(one(i))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(n):
            await asyncio.create_task(one(i))  # a task per request, as Serve gives each one
        out.append((time.perf_counter() - t0) / n * 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--errors", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "1")  # as a replica by default
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(2)
    os.dup2(devnull, 2)  # Serve's stderr copy of each line: measured, not shown
    cases = (
        ("ok_200", "/ok", args.requests),
        ("not_found_404", "/nope", args.requests),
        ("error_500", "/crash", args.errors),
    )
    runs: dict[str, dict[str, list[float]]] = {e: {c[0]: [] for c in cases} for e in ENCODINGS}
    with tempfile.TemporaryDirectory() as logs_dir:
        # TEXT and JSON in turn, each repeat, so that a busy machine's noise falls on both
        for _ in range(args.repeats):
            for enc in ENCODINGS:
                _configure(enc, os.path.join(logs_dir, enc))
                for label, path, n in cases:
                    runs[enc][label] += asyncio.run(_measure(path, n, 1))
        log_bytes = {
            e: sum(f.stat().st_size for f in os.scandir(os.path.join(logs_dir, e)))
            for e in ENCODINGS
        }
    os.dup2(saved, 2)
    try:
        import serve_app.serving.requestid  # noqa: F401

        edge = "request ids"
    except ImportError:
        edge = "before request ids"
    report = {
        "what": "microseconds of one core per request at the replica's HTTP edge, in-process",
        "edge": edge,
        "python": platform.python_version(),
        "load_average_1m": os.getloadavg()[0],
        "log_bytes": log_bytes,
        "encodings": {
            e: {
                label: {
                    "min_us": round(min(v), 2),
                    "median_us": round(statistics.median(v), 2),
                    "runs_us": [round(x, 2) for x in v],
                }
                for label, v in runs[e].items()
            }
            for e in ENCODINGS
        },
    }
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


ENCODINGS = ("TEXT", "JSON")

if __name__ == "__main__":
    main()
