"""load_tests.harness.meta: what a result records about its run, against real git repositories
made in a temporary folder (and a copied tree without .git, as the GPU host gets)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from load_tests.harness import meta

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git CLI")


def git(root: Path, *args: str) -> str:
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    done = subprocess.run(
        ["git", "-C", str(root), *ident, *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    git(root, "init", "-q")
    (root / "code.py").write_text("x = 1\n")
    git(root, "add", "code.py")
    git(root, "commit", "-q", "-m", "first")
    return root


def test_a_clean_checkout_records_its_commit_and_not_dirty(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    assert len(head) == 40
    assert meta.git_state(repo) == (head, False, [])


def test_a_changed_tracked_file_makes_it_dirty_an_untracked_one_does_not(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    (repo / "results.json").write_text("{}")  # output written into the tree: not the code
    assert meta.git_state(repo) == (head, False, [])
    (repo / "code.py").write_text("x = 2\n")
    assert meta.git_state(repo) == (head, True, ["code.py"])


def test_a_tree_without_git_or_inside_another_repository_records_no_commit(
    repo: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"  # a copied working tree, as the GPU host gets it
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    assert meta.git_state(copy) == (None, None, [])
    inner = repo / "sub"  # a folder of some other repository is not a checkout of ours
    inner.mkdir()
    assert meta.git_state(inner) == (None, None, [])


def test_run_meta_records_the_callers_code_commit_without_git(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    monkeypatch.setenv(meta.CODE_COMMIT_ENV, "475a289")
    now = datetime(2026, 12, 1, 9, 30, 5, tzinfo=UTC)
    got = meta.run_meta("python -m tool", ["--out", "a b.json"], root=copy, gpu="H200", now=now)
    assert got == {
        "commit": None,
        "dirty": None,
        "dirty_files": [],
        "code_commit": "475a289",
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "gpu_name": "H200",
        "utc": "2026-12-01T09:30:05+00:00",
        "command": "python -m tool --out 'a b.json'",
    }


def test_run_meta_in_a_checkout_records_git_and_no_code_commit_unless_given(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(meta.CODE_COMMIT_ENV, raising=False)
    (repo / "code.py").write_text("x = 3\n")
    got = meta.run_meta("python -m tool", [], root=repo, gpu="")
    assert (got["commit"], got["dirty"], got["dirty_files"]) == (
        git(repo, "rev-parse", "HEAD"),
        True,
        ["code.py"],
    )
    assert got["code_commit"] is None and got["command"] == "python -m tool"
    assert datetime.fromisoformat(got["utc"]).tzinfo is not None


def test_the_repository_root_is_load_tests_parent() -> None:
    assert (meta.ROOT / "load_tests" / "harness" / "meta.py").is_file()
    assert meta.RESULTS_DIR == meta.ROOT / "benchmarks" / "results"
