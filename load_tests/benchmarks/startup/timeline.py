"""Where a cold start's seconds go, from the Ray session's own logs: when Ray's GCS started, when
the CLI's driver connected, when the first worker started, when Serve's controller started, got
the deploy, built the application and asked for the replicas, and when the replicas started and
finished initialising and were marked running. Each as seconds after the CLI was spawned (the
rows' ``timeline``); log times are local time to the millisecond."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from pathlib import Path

LOG_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[,.](\d{3})")
# (event, where, the text its line carries) for the Serve logs; "first"/"last" of each.
SERVE_EVENTS = (
    ("controller_started", "controller", "Controller starting"),
    ("deploy_received", "controller", "Deploying new app"),
    ("app_built", "controller", "Imported and built app"),
    ("replicas_requested", "controller", "replicas to Deployment"),
    ("replica_init_started", "replica", "Started initializing replica"),
    ("replica_init_finished", "replica", "Finished initializing replica"),
    ("replica_running", "controller", "started successfully on node"),
)


def log_time_s(line: str) -> float | None:
    """The epoch seconds of a Ray or Serve log line's timestamp, or None when it has none."""
    m = LOG_TIME.search(line)
    if m is None:
        return None
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1e3


def first_time_s(path: Path) -> float | None:
    with path.open(errors="replace") as f:
        for line in f:
            at = log_time_s(line)
            if at is not None:
                return at
    return None


def _times(paths: Iterable[Path], text: str) -> list[float]:
    found = []
    for path in paths:
        with path.open(errors="replace") as f:
            found += [t for line in f if text in line and (t := log_time_s(line)) is not None]
    return found


def cold_timeline(session: Path, t0_s: float) -> dict[str, float | None]:
    """The events of one Ray session (``session``: its folder), in seconds after ``t0_s``
    (epoch seconds); None for an event its logs do not show."""
    logs = session / "logs"

    def since(values: Iterable[float | None]) -> list[float]:
        return sorted(round(v - t0_s, 3) for v in values if v is not None)

    out: dict[str, float | None] = {}
    gcs = since(first_time_s(p) for p in logs.glob("gcs_server.out"))
    driver = since(first_time_s(p) for p in logs.glob("python-core-driver-*.log"))
    workers = since(first_time_s(p) for p in logs.glob("python-core-worker-*.log"))
    out["ray_gcs_started"] = gcs[0] if gcs else None
    out["driver_connected"] = driver[0] if driver else None
    out["first_worker_started"] = workers[0] if workers else None
    serve = logs / "serve"
    files = {
        "controller": sorted(serve.glob("controller_*.log")),
        "replica": sorted(serve.glob("replica_*.log")),
    }
    for name, where, text in SERVE_EVENTS:
        times = since(_times(files[where], text))
        if where == "replica" or name == "replica_running":
            out[f"{name}_first"] = times[0] if times else None
            out[f"{name}_last"] = times[-1] if times else None
        else:
            out[name] = times[0] if times else None
    return out
