"""The replica's host heap: glibc's free memory given back to the system between batches.

A loaded CPU replica's RSS grew about 1 MiB a minute while the bytes malloc had in use stayed
flat: the growth was memory freed inside glibc's arenas and kept there (batches of changing
shapes free blocks that later batches do not fit back into), which glibc's own trimming, only
ever of an arena's top, does not return. ``malloc_trim(0)`` also releases the free pages inside
each arena (benchmarks/journal/2026-12-01-replica-memory.md). ``HostHeap.after_batch`` calls it
on the model thread, at most every ``TRIM_EVERY_S``, so a trim never runs beside a batch.
Without glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# A trim took 1.8 to 3.6 ms beside a thread running torch CPU batches of changing shapes (the
# journal): every 10 s costs the model thread under 0.05% of its time.
TRIM_EVERY_S = 10.0


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if fn is None:
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn  # type: ignore[no-any-return]


@dataclass
class HostHeap:
    """Trims the heap after a batch when ``every_s`` has passed since the last trim.

    Attributes:
        trims: how many trims ran.
        trim_s: the seconds they took, in all.
    """

    every_s: float = TRIM_EVERY_S
    trims: int = 0
    trim_s: float = 0.0
    _trim: Callable[[int], int] | None = field(default_factory=_load_malloc_trim, repr=False)
    _last_s: float = field(default_factory=time.monotonic, repr=False)

    @property
    def available(self) -> bool:
        return self._trim is not None

    def after_batch(self) -> bool:
        """Trim when due; True when it trimmed."""
        now = time.monotonic()
        if self._trim is None or now - self._last_s < self.every_s:
            return False
        self._trim(0)
        done = time.monotonic()
        self._last_s = done
        self.trims += 1
        self.trim_s += done - now
        return True
