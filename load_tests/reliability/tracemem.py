"""tracemalloc in a replica process, for finding what grows (issue 29, item 6).

Off unless asked: ``soak --tracemalloc-dir DIR`` sets SOAK_TRACEMALLOC_DIR in the replicas'
runtime_env and puts ``tracemalloc_site`` (a sitecustomize) first on their PYTHONPATH; nothing in
serve_app/ knows of it. In such a process a daemon thread waits ``SOAK_TRACEMALLOC_START_S``
(120 s: start-up and warm-up allocations are not traced, so what a later snapshot holds was
allocated after them), starts tracemalloc with ``FRAMES`` frames, then every
``SOAK_TRACEMALLOC_EVERY_S`` (300 s) dumps a snapshot to ``DIR/PID-T.snap`` (T: seconds since
tracing began) and a line to ``DIR/PID.jsonl`` (RSS, tracemalloc's traced bytes, malloc's
statistics and ``process_counts``).

    python -m load_tests.reliability.tracemem DIR [--top 25] [--out growth.json]

compares each pid's first and last snapshot: the top allocation sites by size growth, each
tagged ``ours`` when a frame of its traceback is in serve_app/, and the totals (traced growth,
ours, the rest, RSS growth) per pid. The snapshots are our own files (pickles written by
tracemalloc.Snapshot.dump), never client data.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

DIR_VAR = "SOAK_TRACEMALLOC_DIR"
START_VAR = "SOAK_TRACEMALLOC_START_S"
EVERY_VAR = "SOAK_TRACEMALLOC_EVERY_S"
FRAMES_VAR = "SOAK_TRACEMALLOC_FRAMES"  # 0: no tracemalloc, only the RSS and malloc lines
FRAMES = 12
TRIM_VAR = "SOAK_MALLOC_TRIM_EVERY_S"  # > 0: malloc_trim(0) that often, RSS before and after
MALLINFO2_FIELDS = (
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
)
SITE_DIR = Path(__file__).parent / "tracemalloc_site"
OURS = f"{os.sep}serve_app{os.sep}"
MIB = 1 << 20


def replica_env(
    out_dir: Path, start_s: float, every_s: float, frames: int = FRAMES
) -> dict[str, str]:
    """The env_vars that switch tracing on in a replica (PYTHONPATH keeps the driver's)."""
    path = [str(SITE_DIR), os.environ.get("PYTHONPATH", "")]
    return {
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        DIR_VAR: str(out_dir.resolve()),
        START_VAR: str(start_s),
        EVERY_VAR: str(every_s),
        FRAMES_VAR: str(frames),
        **{k: v for k, v in os.environ.items() if k == TRIM_VAR},
    }


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2_FIELDS]


def mallinfo() -> dict[str, int]:
    """glibc's mallinfo2 over all arenas: ``uordblks`` in use, ``fordblks`` free but kept,
    ``hblkhd`` in mmapped chunks, ``arena`` from sbrk and arenas ({} without glibc 2.33+)."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {
        f"malloc_{k}": int(getattr(info, k)) for k in ("arena", "hblkhd", "uordblks", "fordblks")
    }


def pymalloc_arenas() -> dict[str, int]:
    """pymalloc's arenas now and the bytes in their allocated blocks, from
    ``sys._debugmallocstats`` (which writes to the C stderr: fd 2 points at a temporary file
    meanwhile). Arenas are anonymous mmaps outside glibc's count: arenas that grow while the
    blocks do not are pymalloc's fragmentation. {} when the report has no such lines."""
    import re
    import tempfile

    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    out = {}
    for key, label in (
        ("pymalloc_arenas", "arenas allocated current"),
        ("pymalloc_allocated_bytes", "bytes in allocated blocks"),
        ("pymalloc_available_bytes", "bytes in available blocks"),
    ):
        m = re.search(rf"# {label}\s*=\s*([\d,]+)", text)
        if m:
            out[key] = int(m.group(1).replace(",", ""))
    return out


def process_counts() -> dict[str, int]:
    """What else can hold anonymous memory outside malloc's count: the interpreter's blocks
    and pymalloc's arenas (1 MiB mmaps), the objects the gc tracks, the threads (their stacks)
    and torch's pinned host memory once CUDA is up. Cheap enough for every line: the gc count
    walks the tracked objects, a few ms every ``SOAK_TRACEMALLOC_EVERY_S``."""
    import gc

    out = {"py_allocated_blocks": sys.getallocatedblocks(), "gc_objects": len(gc.get_objects())}
    out.update(pymalloc_arenas())
    try:
        status = Path("/proc/self/status").read_text()
        out["threads"] = int(status.split("Threads:", 1)[1].split()[0])
    except (OSError, IndexError, ValueError):
        pass  # not Linux: no thread count
    torch = sys.modules.get("torch")  # never imported here: only a process that has it
    if torch is not None and torch.cuda.is_initialized():
        stats = torch.cuda.host_memory_stats()
        for key in ("allocated_bytes.current", "active_bytes.current"):
            if key in stats:
                out["pinned_" + key.split(".")[0]] = int(stats[key])
    return out


def _trace(out_dir: Path, start_s: float, every_s: float, frames: int) -> None:
    time.sleep(start_s)
    if frames > 0:
        tracemalloc.start(frames)
    t0, pid, trims = time.monotonic(), os.getpid(), 0
    trim_every = float(os.environ.get(TRIM_VAR, "0"))
    while True:
        t_s = round(time.monotonic() - t0)
        traced = 0
        if frames > 0:
            snap = tracemalloc.take_snapshot()
            snap.dump(str(out_dir / f"{pid}-{t_s:06d}.snap"))
            traced, _ = tracemalloc.get_traced_memory()
        line = {"t_s": t_s, "rss_bytes": _rss_bytes(), "traced_bytes": traced, **mallinfo()}
        line.update(process_counts())
        if trim_every > 0 and t_s >= trim_every * (trims + 1):  # what malloc_trim gives back
            trims += 1
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            line["rss_after_trim_bytes"] = _rss_bytes()
        with open(out_dir / f"{pid}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        time.sleep(every_s)


def start_from_env() -> None:
    """Start the snapshot thread when SOAK_TRACEMALLOC_DIR is set (the sitecustomize calls it)."""
    out = os.environ.get(DIR_VAR)
    if not out:
        return
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    start_s = float(os.environ.get(START_VAR, "120"))
    every_s = float(os.environ.get(EVERY_VAR, "300"))
    frames = int(os.environ.get(FRAMES_VAR, str(FRAMES)))
    threading.Thread(
        target=_trace,
        args=(out_dir, start_s, every_s, frames),
        name="soak-tracemalloc",
        daemon=True,
    ).start()


# ---- the comparison ----------------------------------------------------------------------


def is_ours(frames: list[str]) -> bool:
    return any(OURS in f for f in frames)


def site(stat: tracemalloc.StatisticDiff) -> dict[str, Any]:
    frames = [f"{fr.filename}:{fr.lineno}" for fr in stat.traceback]
    return {
        "size_diff_bytes": stat.size_diff,
        "count_diff": stat.count_diff,
        "size_bytes": stat.size,
        "ours": is_ours(frames),
        "frames": frames[-FRAMES:],
    }


def compare(first: Path, last: Path, top: int) -> dict[str, Any]:
    """Growth from ``first`` to ``last`` snapshot of one pid, by traceback."""
    old = tracemalloc.Snapshot.load(str(first))
    new = tracemalloc.Snapshot.load(str(last))
    diffs = new.compare_to(old, "traceback")
    ours = sum(d.size_diff for d in diffs if is_ours([fr.filename for fr in d.traceback]))
    total = sum(d.size_diff for d in diffs)
    growing = sorted(diffs, key=lambda d: d.size_diff, reverse=True)[:top]
    return {
        "first": first.name,
        "last": last.name,
        "traced_growth_bytes": total,
        "ours_growth_bytes": ours,
        "others_growth_bytes": total - ours,
        "top": [site(d) for d in growing],
    }


def analyse(out_dir: Path, top: int) -> dict[str, Any]:
    by_pid: dict[str, list[Path]] = {}
    for p in sorted(out_dir.glob("*.snap")):
        by_pid.setdefault(p.name.split("-")[0], []).append(p)
    result: dict[str, Any] = {}
    for pid, snaps in sorted(by_pid.items()):
        if len(snaps) < 2:
            continue
        entry = compare(snaps[0], snaps[-1], top)
        lines = [json.loads(x) for x in (out_dir / f"{pid}.jsonl").read_text().splitlines()]
        entry["rss"] = lines
        entry["rss_growth_bytes"] = lines[-1]["rss_bytes"] - lines[0]["rss_bytes"]
        entry["span_s"] = lines[-1]["t_s"] - lines[0]["t_s"]
        result[pid] = entry
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.reliability.tracemem")
    p.add_argument("dir", type=Path)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    result = analyse(a.dir, a.top)
    for pid, e in result.items():
        print(
            f"pid {pid} over {e['span_s']} s: RSS {e['rss_growth_bytes'] / MIB:+.2f} MiB, "
            f"traced {e['traced_growth_bytes'] / MIB:+.2f} MiB "
            f"(serve_app {e['ours_growth_bytes'] / MIB:+.2f}, "
            f"others {e['others_growth_bytes'] / MIB:+.2f})"
        )
        for s in e["top"][:8]:
            tag = "OURS" if s["ours"] else "    "
            print(f"  {tag} {s['size_diff_bytes'] / 1024:+9.1f} KiB {s['count_diff']:+6d}")
            for fr in s["frames"][-4:]:
                print(f"         {fr}")
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
