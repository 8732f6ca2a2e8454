"""serving/gcwatch.py: each collection counted by generation with its pause, from the
collector's own callbacks."""

from __future__ import annotations

import gc
import time

from serve_app.serving import gcwatch
from serve_app.serving.gcwatch import GcWatch


def test_collections_are_counted_by_generation_with_their_pauses() -> None:
    watch = GcWatch()
    try:
        gc.collect(0)
        gc.collect(2)
        for _ in range(20_000):  # cycles: the collector must walk them
            a: list[object] = []
            a.append(a)
        gc.collect(2)
        got = watch.describe()
        assert got["collections"][0] >= 1 and got["collections"][2] >= 2, got
        assert got["pause_s"][2] > 0 and 0 < got["max_pause_s"][2] <= got["pause_s"][2], got
        assert got["frozen_objects"] == 0  # not counted until read_frozen
        assert watch.read_frozen() == gc.get_freeze_count() == watch.describe()["frozen_objects"]
    finally:
        watch.close()
    assert watch._callback not in gc.callbacks
    before = watch.describe()["collections"]
    gc.collect(2)
    assert watch.describe()["collections"] == before  # closed: no longer counting


def test_the_frozen_objects_are_counted_until_some_are_found_then_never_again(
    monkeypatch,
) -> None:
    """Counting walks every frozen object under the GIL: a replica's report (every second) must
    not; the count is taken at the first health check, after Ray Serve's freeze."""
    counts = iter([0, 0, 120_000, 999])
    calls: list[int] = []

    def count() -> int:
        calls.append(1)
        return next(counts)

    monkeypatch.setattr(gc, "get_freeze_count", count)
    watch = GcWatch()
    try:
        assert [watch.read_frozen() for _ in range(5)] == [0, 0, 120_000, 120_000, 120_000]
        assert len(calls) == 3
        for _ in range(10):
            assert watch.describe()["frozen_objects"] == 120_000
        assert len(calls) == 3
    finally:
        watch.close()


def test_long_collections_are_listed_with_their_time_and_the_list_is_bounded(
    monkeypatch,
) -> None:
    """Each collection of at least LONG_PAUSE_S is listed (the latest LONG_PAUSES_KEPT), with
    when it ended, so that a slow second can be matched to a pause; shorter ones are not."""
    watch = GcWatch()
    try:
        monkeypatch.setattr(gcwatch, "LONG_PAUSE_S", 3600.0)
        gc.collect(2)
        assert watch.describe()["long_pauses"] == []
        monkeypatch.setattr(gcwatch, "LONG_PAUSE_S", 0.0)  # every collection counts as long
        t0 = time.time()
        for _ in range(gcwatch.LONG_PAUSES_KEPT + 5):
            gc.collect(1)
        gc.collect(2)
        pauses = watch.describe()["long_pauses"]
        assert len(pauses) == gcwatch.LONG_PAUSES_KEPT
        assert pauses[-1]["generation"] == 2 and pauses[0]["generation"] == 1
        assert all(t0 - 0.01 <= p["at_unix_s"] <= time.time() + 0.01 for p in pauses)
        assert all(p["pause_s"] >= 0 and p["collected"] >= 0 for p in pauses)
    finally:
        watch.close()
