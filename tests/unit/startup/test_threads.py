"""The tokenizer's threads follow the replica's cores (startup/threads.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
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


def test_the_real_tokenizer_starts_no_pool_after_sizing() -> None:
    """In a fresh process that imported tokenizers first (as a warm worker does), sizing the
    threads for one core leaves encode_batch in the calling thread: no rayon workers appear."""
    code = textwrap.dedent(
        """
        import os
        from tokenizers import Tokenizer
        from serve_app.startup.threads import size_tokenizer_threads
        tok = Tokenizer.from_file("serve_app/models/minilm-skeleton/tokenizer.json")
        before = len(os.listdir("/proc/self/task"))
        os.environ["OMP_NUM_THREADS"] = "1"
        size_tokenizer_threads()
        for _ in range(20):
            tok.encode_batch([f"a short text number {i}" for i in range(64)])
        print(before, len(os.listdir("/proc/self/task")))
        """
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, cwd=ROOT
    )
    before, after = (int(x) for x in out.stdout.split())
    assert after == before, out.stdout


def test_without_sizing_the_real_tokenizer_starts_a_pool() -> None:
    """The control: the same process without the sizing grows rayon's threads (so the test
    above can fail)."""
    code = textwrap.dedent(
        """
        import os
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file("serve_app/models/minilm-skeleton/tokenizer.json")
        before = len(os.listdir("/proc/self/task"))
        for _ in range(20):
            tok.encode_batch([f"a short text number {i}" for i in range(64)])
        print(before, len(os.listdir("/proc/self/task")))
        """
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RAYON_NUM_THREADS": "4"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, cwd=ROOT
    )
    before, after = (int(x) for x in out.stdout.split())
    assert after > before, out.stdout
