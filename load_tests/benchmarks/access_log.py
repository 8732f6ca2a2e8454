"""CPU per request of Ray Serve's access-log call, as a replica makes it after every request:
with the access log off (``enable_access_log: false``, serve_app's default) as Ray 2.60 does it
(the record built, then dropped by a filter), the same through serve_app's gate
(``serving/accesslog.py``: not built), and with the access log on for scale (written to the log
file as JSON and to stderr, as a replica writes it by default).
Serve's own logger setup, record factory and message, in this process; no cluster.

    python -m load_tests.benchmarks.access_log --out access_log.json
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from load_tests.harness.meta import write_cpu_bench

PROG = "python -m load_tests.benchmarks.access_log"


def _configure(logs_dir: str, access_log: bool) -> logging.Logger:
    from ray.serve._private.logging_utils import configure_component_logger
    from ray.serve.schema import LoggingConfig

    config = LoggingConfig(encoding="JSON", enable_access_log=access_log, logs_dir=logs_dir)
    configure_component_logger(
        component_name="app#model",
        component_id="bench",
        logging_config=config,
        max_bytes=1 << 30,
        backup_count=1,
    )
    return logging.getLogger("ray.serve")


def cpu_us_per_call(log: Any, calls: int) -> float:
    """CPU microseconds per access-log call, as Serve's replica makes it
    (replica.py, ``_record_errors_and_metrics``)."""
    from ray.serve._private.logging_utils import access_log_msg

    context = {"skip_context_filter": True, "serve_access_log": True}
    t0 = time.process_time()
    for _ in range(calls):
        log.info(
            access_log_msg(
                method="POST",
                route="/v1/embeddings",
                status="200",
                latency_ms=1.234,
                client="127.0.0.1:50000",
            ),
            extra=context,
        )
    return (time.process_time() - t0) / calls * 1e6


def main() -> None:
    import ray._private.log as ray_log

    from serve_app.serving.accesslog import AccessLogGate

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--calls", type=int, default=50_000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    ray_log._setup_log_record_factory()  # as in every Ray worker
    rows = []
    with tempfile.TemporaryDirectory() as logs_dir:
        settings = [
            ("off, as Ray does it", False, lambda lg: lg),
            ("off, through serve_app's gate", False, AccessLogGate),
            ("on (written: the log file as JSON, and stderr)", True, lambda lg: lg),
        ]
        for name, access_log, wrap in settings:
            log = wrap(_configure(logs_dir, access_log))
            runs = [cpu_us_per_call(log, a.calls) for _ in range(a.repeats)]
            rows.append(
                {
                    "setting": name,
                    "enable_access_log": access_log,
                    "cpu_us_per_request_runs": [round(x, 3) for x in runs],
                    "cpu_us_per_request_median": round(statistics.median(runs), 3),
                }
            )
            print(f"{name}: {statistics.median(runs):.2f} us CPU a request (median of {a.repeats})")
    write_cpu_bench(a.out, PROG, rows, calls_per_run=a.calls)


if __name__ == "__main__":
    main()
