"""The first module of a Ray worker's preload list (warmpool.preload_modules): in a warm worker
(one a replica asked for ahead of need, which took a token for it), it imports the rest of that
list in a thread of the lowest priority (Linux's SCHED_IDLE) and waits for it, so that the
imports (seconds of CPU each: torch, Ray Serve, serve_app) yield the cores to the replicas
serving.

Replicas ask for warm workers as they start, so the imports fall on a server's first seconds
of serving, where they took most of a loaded one-core replica's CPU
(docs/benchmarks.md, "The first seconds after /readyz"). Ray already starts every worker at
nice 15 (its ``worker_niceness``), replicas too, so a nicer value gains little; SCHED_IDLE
weighs a twelfth of that. A Linux scheduling class is per thread: only the importing thread is
lowered, which needs no privilege, and the worker's main thread, which later runs a replica,
keeps its own. Ray's own import of each module in the list then finds it done. A worker that
Ray hands a replica while it is still importing starts that replica once the imports are done,
as it would without this, only later when the cores are busy.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

# Never serve_app.startup.warmpool (or any module of the preload list): while this module runs,
# its import lock is held, and the import thread would wait on it forever.
from serve_app.startup.warmtokens import take_token

FLAG = "--worker-preload-modules"  # how the raylet gives default_worker.py the list
JOIN_TIMEOUT_S = 120.0


def listed_after(argv: Sequence[str], me: str = __name__) -> list[str]:
    """The modules after ``me`` in the worker's preload list on its command line ([] when
    there is none, or ``me`` is not in it)."""
    names = [n for n in (_flag(argv, FLAG) or "").split(",") if n]
    return names[names.index(me) + 1 :] if me in names else []


def _flag(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def session_dir(argv: Sequence[str]) -> Path | None:
    """Ray's session directory from a worker's command line (``--temp-dir``, ``--session-name``)."""
    temp_dir, session = _flag(argv, "--temp-dir"), _flag(argv, "--session-name")
    return Path(temp_dir) / session if temp_dir and session else None


def _threads() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:  # not Linux
        return set()


def lower_this_thread() -> str:
    """Put the calling thread (alone) in Linux's SCHED_IDLE class, or at nice 19 where that is
    refused; says which (``none`` where neither is allowed)."""
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (OSError, AttributeError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, tid, 19)
        return "nice 19"
    except (OSError, AttributeError):
        return "none"


def _import_low(names: Sequence[str], said: list[str]) -> None:
    said.append(lower_this_thread())
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - Ray's own import of it, next, logs the error
            continue


def preload_low(names: Sequence[str]) -> str:
    """Import ``names`` in a thread of the lowest priority and wait for it; returns the class
    it ran in. Threads the imports start inherit it; they are put back to this thread's class
    and nice where the process may (as root)."""
    before = _threads()
    said: list[str] = []
    worker = threading.Thread(target=_import_low, args=(names, said), name="preload-low")
    worker.daemon = True
    worker.start()
    # Bounded: were an import in the thread ever to need this module, it would wait on this
    # import's lock; past the bound Ray's own imports go on here and the lock is let go.
    worker.join(timeout=JOIN_TIMEOUT_S)
    tid = threading.get_native_id()
    policy, nice = os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)
    for started in _threads() - before:
        try:
            os.sched_setscheduler(started, policy, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, started, nice)
        except OSError:
            pass  # needs privilege; torch's import-time thread only waits on a futex
    return said[0] if said else "none"


LOWERED: str | None = None  # how this worker's imports ran, when it took a token
if (_names := listed_after(sys.argv)) and (_session := session_dir(sys.argv)) is not None:
    if take_token(_session):
        LOWERED = preload_low(_names)
