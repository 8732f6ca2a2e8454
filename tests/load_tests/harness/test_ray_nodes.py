"""load_tests.harness.ray_nodes: the `ray start` commands of a head and a labelled worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from load_tests.harness import ray_nodes

B = "GPU-bbbbbbbb-0000-4000-8000-00000000000b"


def test_node_commands_for_a_head_and_a_labelled_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    head = ray_nodes.node_command(
        ["ray"], num_cpus=8, num_gpus=1, head_port=6400, temp_dir=Path("/tmp/x/ray")
    )
    assert head[:5] == ["ray", "start", "--head", "--port", "6400"]
    assert "--temp-dir" in head and "--labels" not in head
    worker = ray_nodes.node_command(
        ["py", "-m", "ray.scripts.scripts"],
        num_cpus=0.5,
        num_gpus=1,
        address="127.0.0.1:6400",
        labels={"serve-app/gpu": B},
    )
    assert worker[:6] == ["py", "-m", "ray.scripts.scripts", "start", "--address", "127.0.0.1:6400"]
    assert worker[worker.index("--num-cpus") + 1] == "0.5"
    assert worker[-2:] == ["--labels", f"serve-app/gpu={B}"]
    with pytest.raises(ValueError):
        ray_nodes.node_command(["ray"], num_cpus=1, num_gpus=1)
    # pip install --target leaves the `ray` script off PATH: the same CLI through python -m
    monkeypatch.setattr(ray_nodes.shutil, "which", lambda name: None)
    monkeypatch.setattr(ray_nodes.sys, "executable", "/nowhere/python3")
    assert ray_nodes.ray_cli() == ["/nowhere/python3", "-m", "ray.scripts.scripts"]
