"""serve_app/preloading.py: a warm worker's imports run in a thread of the lowest priority
(SCHED_IDLE), the main thread keeps its own. In a child process, as Ray's default_worker.py
runs it: the preload list on its command line, each module imported in turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from serve_app import preloading

ROOT = Path(__file__).resolve().parents[3]


def test_listed_after_reads_the_raylets_flag_both_ways() -> None:
    mods = "serve_app.preloading,torch,serve_app.preloaded"
    assert preloading.listed_after(["w.py", f"--worker-preload-modules={mods}"]) == [
        "torch",
        "serve_app.preloaded",
    ]
    assert preloading.listed_after(["w.py", "--worker-preload-modules", mods]) == [
        "torch",
        "serve_app.preloaded",
    ]
    assert preloading.listed_after(["w.py", "--worker-preload-modules=torch,json"]) == []
    assert preloading.listed_after(["w.py", "--other=1"]) == []


# As default_worker.py does it: each module of the list in turn, in the main thread; a probe
# module, listed after the niced one, records the nice of the thread that imports it.
CHILD = """
import importlib, json, os, sys, threading
sys.argv = ["default_worker.py", "--worker-preload-modules=" + sys.argv[1]]
for name in sys.argv[1].split("=", 1)[1].split(","):
    importlib.import_module(name)
import nice_probe
main = threading.get_native_id()
print(json.dumps({
    "probe_thread": nice_probe.THREAD,
    "probe_policy": nice_probe.POLICY,
    "main_policy": os.sched_getscheduler(main),
    "main_nice": os.getpriority(os.PRIO_PROCESS, main),
    "lowered": getattr(sys.modules.get("serve_app.preloading"), "LOWERED", None),
    "json_loaded": "json" in sys.modules,
}))
"""
PROBE = """
import os, threading
THREAD = threading.current_thread().name
POLICY = os.sched_getscheduler(threading.get_native_id())
"""


def run_child(tmp_path: Path, modules: str) -> dict:
    (tmp_path / "nice_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, modules], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout)


def test_the_rest_of_the_list_is_imported_at_idle_priority_and_the_main_thread_is_not(
    tmp_path,
) -> None:
    got = run_child(tmp_path, "serve_app.preloading,nice_probe,json")
    assert got["lowered"] == "SCHED_IDLE"
    assert (got["probe_thread"], got["probe_policy"]) == ("preload-low", os.SCHED_IDLE)
    assert got["main_policy"] == os.sched_getscheduler(0)  # this test's own: untouched
    assert got["main_nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    assert got["json_loaded"]


def test_control_without_it_the_main_thread_imports_at_its_own_priority(tmp_path) -> None:
    got = run_child(tmp_path, "nice_probe,json")
    assert got["lowered"] is None
    assert (got["probe_thread"], got["probe_policy"]) == ("MainThread", os.sched_getscheduler(0))
