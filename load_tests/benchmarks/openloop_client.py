"""The open-loop client's own cost: one worker process (load_tests.harness.openloop) pinned to
one core offers fixed Poisson rates to HAProxy's static no-op (the throughput tool's client
ceiling server, which answers MiniLM's one-text answer) pinned to another, and each point
records the worker's CPU share, its send lag and the latency it saw. Run from another checkout's
root (``PYTHONPATH=that/checkout python /path/to/this/file``) it measures that checkout's client:
the way to compare two clients on one host.

    python -m load_tests.benchmarks.openloop_client --out client.json --rates 3000,6000,10000
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from load_tests.harness.meta import run_meta

FIELDS = ("requests_per_s", "p50_ms", "p99_ms", "client_cpu_frac_max", "send_lag_p99_ms")
FIELDS += ("client_keeps_up", "errors")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.benchmarks.openloop_client")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rates", default="3000,6000,10000", help="requests/s, comma-separated")
    p.add_argument("--server-core", type=int, default=0)
    p.add_argument("--client-core", type=int, default=1)
    p.add_argument("--duration-s", type=float, default=4.0)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--label", default="", help="names the client measured in the JSON")
    a = p.parse_args(argv)

    from load_tests.benchmarks.throughput.noop_server import NoopHAProxy
    from load_tests.benchmarks.throughput.payload import model_payload
    from load_tests.harness.openloop import OpenLoopPool

    payload = model_payload("minilm", 1)
    work = Path(tempfile.mkdtemp(prefix="openloop-client-"))
    body = work / "body.json"
    body.write_bytes(payload.body)
    server = NoopHAProxy([a.server_core], [payload], work)
    pool = OpenLoopPool([a.client_core], 1, work)
    points = []
    try:
        for rate in (float(r) for r in a.rates.split(",")):
            s = pool.point(
                server.url_for(payload),
                {"Content-Type": payload.content_type},
                body,
                rate_per_s=rate,
                duration_s=a.duration_s,
                warmup_s=0.5,
                connections=a.connections,
            )
            points.append({"offered_per_s": rate, **{k: s.get(k) for k in FIELDS}})
            print(json.dumps(points[-1]), flush=True)
    finally:
        pool.close()
        server.stop()
    argv_list = list(argv) if argv is not None else None
    meta = run_meta("python -m load_tests.benchmarks.openloop_client", argv_list)
    doc = {"meta": meta, "label": a.label, "payload": payload.key, "points": points}
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
