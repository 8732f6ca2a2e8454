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
from serve_app.startup import warmtokens

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
sys.argv = [
    "default_worker.py",
    "--worker-preload-modules=" + sys.argv[1],
    "--temp-dir=" + sys.argv[2],
    "--session-name=session_test",
]
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


def run_child(tmp_path: Path, modules: str, tokens: int, timeout_s: float = 120.0) -> dict:
    (tmp_path / "nice_probe.py").write_text(PROBE)
    session = tmp_path / "session_test"
    session.mkdir(exist_ok=True)
    warmtokens.leave_tokens(session, tokens)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, modules, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=timeout_s,
    )
    return json.loads(out.stdout)


def test_a_warm_worker_imports_at_idle_priority_and_its_main_thread_does_not(tmp_path) -> None:
    got = run_child(tmp_path, "serve_app.preloading,nice_probe,json", tokens=1)
    assert list((tmp_path / "session_test" / warmtokens.TOKENS_DIR).iterdir()) == []  # taken
    assert got["lowered"] == "SCHED_IDLE"
    assert (got["probe_thread"], got["probe_policy"]) == ("preload-low", os.SCHED_IDLE)
    assert got["main_policy"] == os.sched_getscheduler(0)  # this test's own: untouched
    assert got["main_nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    assert got["json_loaded"]


def test_a_worker_without_a_token_imports_as_ray_does(tmp_path) -> None:
    # one Ray started for an actor waiting now (Serve's proxy, a cold replica)
    got = run_child(tmp_path, "serve_app.preloading,nice_probe,json", tokens=0)
    assert got["lowered"] is None
    assert (got["probe_thread"], got["probe_policy"]) == ("MainThread", os.sched_getscheduler(0))


def test_control_without_the_module_the_main_thread_imports(tmp_path) -> None:
    got = run_child(tmp_path, "nice_probe,json", tokens=1)
    assert got["lowered"] is None
    assert (got["probe_thread"], got["probe_policy"]) == ("MainThread", os.sched_getscheduler(0))


def test_tokens_one_each_and_expired_ones_neither_taken_nor_kept(tmp_path) -> None:
    warmtokens.leave_tokens(tmp_path, 2, now_s=1000.0)
    assert warmtokens.take_token(tmp_path, now_s=1010.0)
    assert warmtokens.take_token(tmp_path, now_s=1010.0)
    assert not warmtokens.take_token(tmp_path, now_s=1010.0)
    warmtokens.leave_tokens(tmp_path, 1, now_s=1000.0)
    assert not warmtokens.take_token(tmp_path, now_s=1000.0 + warmtokens.TOKEN_TTL_S + 1)
    warmtokens.leave_tokens(tmp_path, 1, now_s=2000.0)  # removes the expired one
    assert len(list((tmp_path / warmtokens.TOKENS_DIR).iterdir())) == 1
    assert not warmtokens.take_token(tmp_path / "no-such-session")


def test_session_dir_from_the_workers_flags() -> None:
    argv = ["w.py", "--temp-dir=/tmp/ray", "--session-name", "session_1"]
    assert preloading.session_dir(argv) == Path("/tmp/ray/session_1")
    assert preloading.session_dir(["w.py", "--temp-dir=/tmp/ray"]) is None


def test_the_real_preload_list_finishes_in_the_low_thread(tmp_path) -> None:
    # warmpool is in it and once imported serve_app.preloading, whose import lock the main
    # thread holds while it waits: the thread waited on it for good (every warm worker hung)
    from serve_app.startup import warmpool

    modules = ",".join([*warmpool.preload_modules(["embeddings"]), "nice_probe"])
    got = run_child(tmp_path, modules, tokens=1, timeout_s=60.0)
    assert got["lowered"] == "SCHED_IDLE" and got["probe_thread"] == "preload-low"
