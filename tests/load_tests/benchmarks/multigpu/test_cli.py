"""load_tests.benchmarks.multigpu.cli: the throughput command that packs one GPU, then two."""

from __future__ import annotations

from pathlib import Path

from load_tests.benchmarks.multigpu.cli import settings, throughput_command


def test_throughput_command_packs_one_gpu_then_fills_two() -> None:
    cfg = {**settings("cuda", False), "device": "cuda", "quick": False, "wrk": "/x/wrk"}
    cmd = throughput_command(cfg, Path("/o"), 250.0, "serve")
    text = " ".join(cmd)
    assert "--gpu 0,1 --replica-share 0.25 --replicas 4,8" in text
    assert "--inputs-per-request 64,1 --phases serve --max-time-s 250 --wrk /x/wrk" in text
    assert "--duration-s 5" in text and "--quick" not in cmd and "--merge" not in cmd
    cpu = {**settings("cpu", True), "device": "cpu", "quick": True, "wrk": "/x/wrk"}
    cmd = throughput_command(cpu, Path("/o"), 30.0, "client")
    assert "--quick" in cmd and "--merge" in cmd and "--duration-s" not in cmd
    assert "--replica-share 1 --replicas 1,2" in " ".join(cmd)
