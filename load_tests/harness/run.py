"""What every tool's run needs: a log line with the time since the run began, a wall-clock
budget with a reserve for the shutdown, error records for the JSON, and atomic JSON writes (a
run cut short leaves a whole file, never half of one)."""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R")

SHUTDOWN_RESERVE_S = 20.0

_T0 = time.time()


def set_t0(t0_unix: float | None) -> None:
    """Log times relative to ``t0_unix`` (a worker takes its parent's start)."""
    global _T0
    if t0_unix is not None:
        _T0 = t0_unix


def log(msg: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp} +{time.time() - _T0:6.1f}s] {msg}", flush=True)


def error_doc(exc: BaseException) -> dict[str, Any]:
    """``error`` (type and message) and the traceback's tail, for a result JSON."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": tb[-6000:]}


def write_json(path: Path, doc: Any) -> None:
    """``doc`` to ``path`` through a temporary file and a rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)


class Budget:
    """The run's wall-clock budget: what is left (less SHUTDOWN_RESERVE_S), and a deadline no
    later than it allows."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic() - SHUTDOWN_RESERVE_S

    def deadline(self, want_s: float) -> float:
        return time.monotonic() + max(0.0, min(want_s, self.left()))


def each_at_once(fn: Callable[[V], R], items: Mapping[K, V]) -> dict[K, R]:
    """``fn`` on every value of ``items`` at once, a thread each; the results by key. A call
    that raised is missing from the result (threading prints its traceback)."""
    out: dict[K, R] = {}

    def one(key: K, value: V) -> None:
        out[key] = fn(value)

    threads = [threading.Thread(target=one, args=item) for item in items.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
