"""Poll a server's process tree every 0.1 s: when a HAProxy process first shows, print its
start time (psutil's create_time) and whether each earlier snapshot of the tree (the throughput
tool's proccpu.snapshot) held it. Usage: python poll.py ROOT_PID SECONDS (repository root on
PYTHONPATH)."""

import sys
import time

import psutil

from load_tests.benchmarks.throughput.proccpu import snapshot

root, end = int(sys.argv[1]), time.time() + float(sys.argv[2])
history: list[tuple[float, dict]] = []
seen: set[int] = set()
while time.time() < end:
    now = time.time()
    snap = snapshot([root], count_roots=False)
    history = [*history[-59:], (now, snap)]
    for p in psutil.process_iter(["name", "create_time"]):
        if p.info["name"] != "haproxy" or p.pid in seen:
            continue
        seen.add(p.pid)
        created = p.info["create_time"]
        print(f"{now:.2f} haproxy pid {p.pid} created {created:.2f}", flush=True)
        for then, earlier in history:
            if then >= created - 0.1:
                e = earlier.get(p.pid)
                held = "absent" if e is None else f"{e.kind}, created {e.create_time_s:.2f}"
                print(f"   snapshot at {then:.2f}: {held}", flush=True)
    time.sleep(0.1)
