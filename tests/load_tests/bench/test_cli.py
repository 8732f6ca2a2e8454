"""load_tests.bench.cli: what it refuses, and a sweep end to end (JSON, plots, provenance)."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from pathlib import Path

import pytest

from load_tests import bench

RUN_KEYS = ("commit", "dirty", "dirty_files", "code_commit", "host", "cpu_count", "gpu_name")
RUN_KEYS += ("utc", "command")


def sweep_args(server_url: str, out: Path) -> list[str]:
    """Two short rates against the live server, raw records, no NVML, JSON and plots to out."""
    args = ["--url", f"{server_url}/v1/embeddings", "--rates", "20,40", "--duration-s", "0.5"]
    args += ["--warmup-s", "0", "--pause-s", "0", "--out", str(out), "--raw", "--no-progress"]
    return [*args, "--no-nvml", "--max-error-rate", "0", "--memory-interval-s", "0.2"]


def test_cli_refuses_remote_target_without_allow_remote() -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--url", "http://10.0.0.1:8000/v1/embeddings", "--rate", "1"])
    assert exc.value.code == 2


def test_cli_refuses_sweep_over_max_requests() -> None:
    args = ["--url", "http://127.0.0.1:9/v1/embeddings", "--rates", "100,200"]
    with pytest.raises(SystemExit) as exc:
        bench.main([*args, "--duration-s", "10", "--max-requests", "1000"])
    assert exc.value.code == 2


def test_cli_end_to_end_writes_json_and_plots(server_url: str, tmp_path: Path) -> None:
    args = sweep_args(server_url, tmp_path)
    assert bench.main(args) == 0
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["schema_version"] == 1
    assert [r["offered_rate_per_s"] for r in doc["rates"]] == [20.0, 40.0]
    assert all(r["error_rate"] == 0.0 and len(r["raw"]) == r["requests"] for r in doc["rates"])
    assert doc["verdict"]["passed"] is True
    server = [m for m in doc["memory"]["samples"] if m["source"] == "server"]
    assert server and server[0]["budget_bytes"] == 1 << 30
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert (tmp_path / "memory.png").stat().st_size > 0
    # The run records itself: the command as typed, the host, and the checkout's state.
    assert set(RUN_KEYS) <= set(doc)
    assert doc["command"] == "python -m load_tests.bench " + shlex.join(args)
    assert (doc["host"], doc["cpu_count"]) == (platform.node(), os.cpu_count())
    assert doc["dirty"] in (True, False, None) and isinstance(doc["dirty_files"], list)


def test_cli_without_matplotlib_writes_the_json_and_says_how_to_install(
    server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    assert bench.main(sweep_args(server_url, tmp_path)) == 0
    assert json.loads((tmp_path / "bench.json").read_text())["verdict"]["passed"] is True
    assert not (tmp_path / "bench.png").exists()
    assert "pip install -e '.[plots]'" in capsys.readouterr().err
