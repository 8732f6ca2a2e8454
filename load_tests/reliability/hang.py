"""A hung replica for the fault suites: SIGSTOP it for a while (``freeze``) and watch when
HAProxy takes it out of rotation (``RotationWatch``)."""

from __future__ import annotations

import os
import signal
import threading
import time

from load_tests.harness.cluster import Target, haproxy_up
from serve_app.control.monitor import pid_alive


class RotationWatch:
    """Polls HAProxy every 0.1 s in a thread: when ``victim`` first stops being UP (DOWN,
    MAINT, or gone from the backend), in seconds after ``since``."""

    def __init__(self, target: Target, victim: str, since: float):
        self.target, self.victim, self.since = target, victim, since
        self.out_s: float | None = None
        self.states: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and self.out_s is None:
            try:
                status = haproxy_up(self.target).get(self.victim, "gone")
            except OSError:
                status = None
            if status is not None:
                if not self.states or self.states[-1] != status:
                    self.states.append(status)
                if not status.startswith("UP"):
                    self.out_s = round(time.monotonic() - self.since, 2)
            self._stop.wait(0.1)

    def __enter__(self) -> RotationWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)


def freeze(pid: int, stop_s: float, fault_at: float) -> bool:
    """SIGSTOP ``pid`` for at most ``stop_s``; SIGCONT it unless it died first (Serve replaced
    it). Whether it was still alive at the end."""
    os.kill(pid, signal.SIGSTOP)
    try:
        while time.monotonic() - fault_at < stop_s and pid_alive(pid):
            time.sleep(0.1)
    finally:
        still = pid_alive(pid)
        if still:
            os.kill(pid, signal.SIGCONT)
    return still
