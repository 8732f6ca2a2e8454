"""load_tests.reliability.tracemem: the replica's env and the snapshot comparison (real
tracemalloc snapshots of this process; no Ray)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from load_tests.reliability import tracemem

KEEP: list[bytes] = []


def grow(filename: str, n: int) -> None:
    """Allocate n KiB-sized objects from code that tracemalloc attributes to ``filename``."""
    code = compile("for _ in range(n): KEEP.append(bytes(1024) + b'x')", filename, "exec")
    exec(code, {"KEEP": KEEP, "n": n})  # noqa: S102 - our own constant code


def test_replica_env_puts_the_site_dir_first_and_keeps_pythonpath(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    env = tracemem.replica_env(tmp_path, 60.0, 30.0)
    assert env["PYTHONPATH"].split(":") == [str(tracemem.SITE_DIR), "/somewhere"]
    assert (tracemem.SITE_DIR / "sitecustomize.py").is_file()
    assert env[tracemem.DIR_VAR] == str(tmp_path.resolve())
    assert (env[tracemem.START_VAR], env[tracemem.EVERY_VAR]) == ("60.0", "30.0")


def test_start_from_env_does_nothing_without_the_variable(monkeypatch) -> None:
    monkeypatch.delenv(tracemem.DIR_VAR, raising=False)
    tracemem.start_from_env()  # no thread, no tracing
    assert not tracemalloc.is_tracing()


def test_analyse_splits_growth_into_serve_app_and_the_rest(tmp_path: Path) -> None:
    tracemalloc.start(tracemem.FRAMES)
    try:
        first = tracemalloc.take_snapshot()
        grow("/repo/serve_app/serving/leaky.py", 300)
        grow("/venv/site-packages/ray/leaky.py", 100)
        last = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
        KEEP.clear()
    first.dump(str(tmp_path / "42-000000.snap"))
    last.dump(str(tmp_path / "42-000060.snap"))
    lines = [{"t_s": 0, "rss_bytes": 1000, "traced_bytes": 1}, {"t_s": 60, "rss_bytes": 5000}]
    (tmp_path / "42.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    e = tracemem.analyse(tmp_path, top=5)["42"]
    assert (e["span_s"], e["rss_growth_bytes"]) == (60, 4000)
    assert 300 * 1024 <= e["ours_growth_bytes"] < 400 * 1024
    assert 100 * 1024 <= e["others_growth_bytes"] < 200 * 1024
    top = e["top"][0]
    assert top["ours"] is True
    assert top["frames"][-1].startswith("/repo/serve_app/serving/leaky.py:")
    assert any(s["frames"][-1].startswith("/venv/site-packages/ray/") for s in e["top"])


# In a fresh process: in pytest's, other tests' objects come and go between the readings.
COUNTS_CHILD = """
import json, threading
from load_tests.reliability import tracemem
before = tracemem.process_counts()
held = [[i] for i in range(20_000)]  # 20,000 gc-tracked lists, each a pymalloc block
stop = threading.Event()
worker = threading.Thread(target=stop.wait)
worker.start()
after = tracemem.process_counts()
stop.set()
worker.join()
print(json.dumps({"before": before, "after": after}))
"""


def test_process_counts_see_objects_and_threads_grow() -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", COUNTS_CHILD], capture_output=True, text=True, env=env, check=True
    )
    got = json.loads(out.stdout)
    before, after = got["before"], got["after"]
    assert after["gc_objects"] - before["gc_objects"] >= 20_000
    assert after["py_allocated_blocks"] - before["py_allocated_blocks"] >= 20_000
    assert after["threads"] == before["threads"] + 1
    # 20,000 small lists and their items: at least a few more of pymalloc's 1 MiB arenas
    assert after["pymalloc_arenas"] > before["pymalloc_arenas"] >= 1, (before, after)
    grown = after["pymalloc_allocated_bytes"] - before["pymalloc_allocated_bytes"]
    assert grown >= 20_000 * 56, (before, after)  # a list object alone is 56 bytes
    assert not any(k.startswith("pinned_") for k in after)  # no CUDA in this process
