"""The tokenizer's threads follow the replica's cores (startup/threads.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from serve_app.startup.threads import size_tokenizer_threads

ROOT = Path(__file__).resolve().parents[3]


def test_one_core_encodes_in_the_calling_thread() -> None:
    env = {"OMP_NUM_THREADS": "1"}
    assert size_tokenizer_threads(env) == {"TOKENIZERS_PARALLELISM": "false"}
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    assert "RAYON_NUM_THREADS" not in env


def test_several_cores_get_a_pool_of_that_size() -> None:
    env = {"OMP_NUM_THREADS": "3"}
    assert size_tokenizer_threads(env) == {"RAYON_NUM_THREADS": "3"}
    assert env == {"OMP_NUM_THREADS": "3", "RAYON_NUM_THREADS": "3"}


@pytest.mark.parametrize("own", [{"TOKENIZERS_PARALLELISM": "true"}, {"RAYON_NUM_THREADS": "8"}])
def test_the_deployments_own_setting_is_kept(own: dict[str, str]) -> None:
    env = {"OMP_NUM_THREADS": "1", **own}
    assert size_tokenizer_threads(env) == {}
    assert env == {"OMP_NUM_THREADS": "1", **own}


@pytest.mark.parametrize("cores", ["", "0", "two", "-1"])
def test_no_core_count_changes_nothing(cores: str) -> None:
    env = {"OMP_NUM_THREADS": cores} if cores else {}
    before = dict(env)
    assert size_tokenizer_threads(env) == {}
    assert env == before


CHILD = """
import os, sys
from tokenizers import Tokenizer
from serve_app.startup.threads import size_tokenizer_threads
tok = Tokenizer.from_file("serve_app/models/minilm-skeleton/tokenizer.json")
before = len(os.listdir("/proc/self/task"))
if sys.argv[1] == "size":
    os.environ["OMP_NUM_THREADS"] = "1"
    size_tokenizer_threads()
for _ in range(20):
    tok.encode_batch([f"a short text number {i}" for i in range(64)])
print(before, len(os.listdir("/proc/self/task")))
"""


def _threads_around_encoding(size: bool, env_extra: dict[str, str]) -> tuple[int, int]:
    """A fresh process that imports tokenizers first (as a warm worker does), sizes its
    threads for one core or not, encodes: its thread count before and after."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env_extra}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, "size" if size else "leave"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=ROOT,
    )
    before, after = (int(x) for x in out.stdout.split())
    return before, after


def test_the_real_tokenizer_starts_no_pool_after_sizing() -> None:
    """Sizing the threads for one core leaves encode_batch in the calling thread: no rayon
    workers appear."""
    before, after = _threads_around_encoding(True, {})
    assert after == before


def test_without_sizing_the_real_tokenizer_starts_a_pool() -> None:
    """The control: the same process without the sizing grows rayon's threads (so the test
    above can fail)."""
    before, after = _threads_around_encoding(False, {"RAYON_NUM_THREADS": "4"})
    assert after > before
