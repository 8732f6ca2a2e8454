"""Python's garbage collector in a replica: every collection's pause, by generation.

A replica's heap after start-up (torch, Ray, Serve, the model's Python objects) holds hundreds
of thousands of container objects. Ray Serve collects once and freezes them at the end of a
replica's initialisation (``RAY_SERVE_FREEZE_GC_ON_STARTUP``, on by default), so that later
collections walk only what serving allocates; a full collection of the unfrozen heap would
stall the event loop and the model thread for hundreds of milliseconds. ``GcWatch`` times each
collection through ``gc.callbacks``, so the replica's report (``/v1/memory``) shows what the
collector costs while it serves, and whether the heap was frozen. Counting the frozen objects
walks them all under the GIL (``gc.get_freeze_count``: tens of milliseconds for a replica's
heap), so it is done once, by ``read_frozen``, and never per report.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from typing import Any, TypedDict

# A collection at least this long is listed with the time it ended (``long_pauses``): a pause
# the size of a p99 can then be matched to the seconds it fell in.
LONG_PAUSE_S = 0.01
LONG_PAUSES_KEPT = 32  # the most recent ones


class LongPause(TypedDict):
    at_unix_s: float  # when it ended
    generation: int
    pause_s: float
    collected: int  # the objects it freed


class GcFigures(TypedDict):
    """Collections since the watch began: per generation (0, 1, 2) the count, the seconds they
    took and the longest; the latest collections of LONG_PAUSE_S or more; the objects in the
    permanent generation (``gc.freeze``, ``read_frozen``)."""

    collections: list[int]
    pause_s: list[float]
    max_pause_s: list[float]
    long_pauses: list[LongPause]
    frozen_objects: int


class GcWatch:
    """Times each collection (``gc.callbacks`` run under the GIL, at a collection's start and
    end, in the thread that triggered it). ``close`` removes the callback."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.pause_s = [0.0, 0.0, 0.0]
        self.max_pause_s = [0.0, 0.0, 0.0]
        self._started: dict[int, float] = {}  # thread id -> start of its collection
        self.frozen_objects = 0  # read_frozen's count
        self.long_pauses: deque[LongPause] = deque(maxlen=LONG_PAUSES_KEPT)
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        key = threading.get_ident()
        if phase == "start":
            self._started[key] = time.perf_counter()
            return
        t0 = self._started.pop(key, None)
        gen = int(info.get("generation", 2))
        if t0 is None or not 0 <= gen <= 2:
            return
        took_s = time.perf_counter() - t0
        self.collections[gen] += 1
        self.pause_s[gen] += took_s
        if took_s > self.max_pause_s[gen]:
            self.max_pause_s[gen] = took_s
        if took_s >= LONG_PAUSE_S:
            collected = int(info.get("collected", 0))
            at = round(time.time(), 3)
            pause_s = round(took_s, 6)
            self.long_pauses.append(
                LongPause(at_unix_s=at, generation=gen, pause_s=pause_s, collected=collected)
            )

    def read_frozen(self) -> int:
        """The objects in the permanent generation, counted until a count finds some (an empty
        one costs nothing to count); after that the count stands: Ray Serve freezes once."""
        if not self.frozen_objects:
            self.frozen_objects = gc.get_freeze_count()
        return self.frozen_objects

    def describe(self) -> GcFigures:
        return GcFigures(
            collections=list(self.collections),
            pause_s=[round(s, 6) for s in self.pause_s],
            max_pause_s=[round(s, 6) for s in self.max_pause_s],
            long_pauses=list(self.long_pauses),
            frozen_objects=self.frozen_objects,
        )

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
