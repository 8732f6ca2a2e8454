"""serving/gcwatch.py: each collection counted by generation with its pause, from the
collector's own callbacks."""

from __future__ import annotations

import gc

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
        assert got["frozen_objects"] == gc.get_freeze_count()
    finally:
        watch.close()
    assert watch._callback not in gc.callbacks
    before = watch.describe()["collections"]
    gc.collect(2)
    assert watch.describe()["collections"] == before  # closed: no longer counting
