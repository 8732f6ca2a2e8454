"""load_tests.benchmarks.multigpu.common: the scripted NVML of the CPU run."""

from __future__ import annotations

from load_tests.benchmarks.multigpu.common import FAKE_GPUS, fake_nvml_doc

GIB = 1 << 30
A, B = FAKE_GPUS


def test_fake_nvml_doc_two_gpus_and_a_grab() -> None:
    doc = fake_nvml_doc({B: GIB})
    assert doc["devices"][A]["free_bytes"] == 79 * GIB and doc["devices"][B]["free_bytes"] == GIB
    assert "processes" not in doc  # no per-process bytes on the CPU
