"""A replica refuses a memory.budget it cannot keep (gpu/capping._check_stated_budget), on the
CPU with NVML scripted: a node with a GPU but no share for the replica is plain serve deploy of a
file without the derived num_gpus."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.config.args import AppArgs
from serve_app.errors import StartupError
from serve_app.gpu import nvml
from serve_app.gpu.capping import start_partition
from serve_app.plan.derive import facts_from_nvml
from serve_app.testing.nvml import ScriptedSource

GIB = 1 << 30


@pytest.fixture
def node_gpus(tmp_path: Path) -> Iterator[Path]:
    script = tmp_path / "nvml.json"
    nvml.set_source(ScriptedSource(script))
    try:
        yield script
    finally:
        nvml.set_source(None)


def budgeted() -> AppArgs:
    return AppArgs.model_validate({"device": "cpu", "memory": {"budget": "6GiB"}})


def test_no_share_on_a_node_with_a_gpu_fails_naming_the_fix(node_gpus: Path) -> None:
    node_gpus.write_text(json.dumps({"devices": {"GPU-0001": {"total_bytes": 80 * GIB}}}))
    with pytest.raises(StartupError, match="no GPU share.*serve-app check --write-shares"):
        start_partition(budgeted(), 0.0)
    # The same file's derivation at serve-app run reads that GPU.
    assert facts_from_nvml().smallest_bytes == 80 * GIB


def test_on_a_cpu_only_node_the_budget_is_ignored_as_num_gpus_is(node_gpus: Path) -> None:
    node_gpus.write_text(json.dumps({"devices": {}}))
    partition = start_partition(budgeted(), 0.0)
    assert not partition.on_gpu
    assert not facts_from_nvml().any
