"""How long a fresh Python process takes to import what a replica needs (warmpool's preload
list), alone and with N processes importing at once, as a warm worker's preload does while
others start: ``python -m research.import_probe --out probe.json [--concurrent 1,4,16]``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from serve_app.startup.warmpool import preload_modules

CHILD = """
import json, sys, time
t = time.perf_counter(); steps = []
for m in sys.argv[1:]:
    t0 = time.perf_counter(); __import__(m); steps.append([m, round(time.perf_counter() - t0, 3)])
print(json.dumps({"steps": steps, "total_s": round(time.perf_counter() - t, 3)}))
"""


def run_batch(modules: list[str], n: int) -> dict[str, object]:
    """``n`` processes importing ``modules`` at once: each one's steps and the batch's wall."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, *modules], stdout=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    results = [json.loads(p.communicate()[0]) for p in procs]
    totals = sorted(r["total_s"] for r in results)
    return {
        "processes": n,
        "wall_s": round(time.perf_counter() - t0, 3),
        "total_s_min": totals[0],
        "total_s_median": totals[len(totals) // 2],
        "total_s_max": totals[-1],
        "steps_first": results[0]["steps"],
    }


def import_time_top(modules: list[str], top: int = 30) -> list[list[object]]:
    """``python -X importtime``: the ``top`` modules by cumulative microseconds."""
    code = "".join(f"import {m}\n" for m in modules)
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True
    ).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        head, cum_us, name = line.split("|", 2)  # "import time: SELF", CUMULATIVE, NAME
        rows.append([name.strip(), int(head.split()[-1]), int(cum_us)])
    rows.sort(key=lambda r: -int(r[2]))  # type: ignore[call-overload]
    return rows[:top]


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m research.import_probe")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--adapter", default="embeddings")
    p.add_argument("--concurrent", default="1,1,4,16")
    a = p.parse_args()
    modules = preload_modules([a.adapter])
    rows = [run_batch(modules, int(n)) for n in a.concurrent.split(",")]
    doc = {
        "modules": modules,
        "cpu_count": os.cpu_count(),
        "python": sys.version,
        "rows": rows,
        "importtime_top_cumulative_us": import_time_top(modules),
    }
    a.out.write_text(json.dumps(doc, indent=1))
    for r in rows:
        print(r["processes"], r["wall_s"], r["total_s_median"], r["steps_first"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
