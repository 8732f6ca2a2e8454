"""control.readings: a node monitor reports only the GPUs its Ray node was given (a Ray node
per GPU), NVML failures come back as data, and a GPU's key is exact as a float metric."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.control import readings
from serve_app.gpu import nvml
from serve_app.testing.nvml import ScriptedSource

GIB = 1 << 30


@pytest.fixture
def two_gpu_script(tmp_path: Path) -> Iterator[None]:
    script = tmp_path / "nvml.json"
    devices = {
        "GPU-00000000-0000-4000-8000-000000000001": {"total_bytes": 80 * GIB},
        "GPU-00000000-0000-4000-8000-000000000002": {"total_bytes": 80 * GIB},
    }
    script.write_text(json.dumps({"devices": devices}))
    nvml.set_source(ScriptedSource(script))
    try:
        yield
    finally:
        nvml.set_source(None)


@pytest.mark.usefixtures("two_gpu_script")
@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, ["...01", "...02"]),
        ("", ["...01", "...02"]),  # empty: not set (Ray's old override on zero GPUs)
        ("1", ["...02"]),
        ("1,0", ["...02", "...01"]),
        ("GPU-00000000-0000-4000-8000-000000000001", ["...01"]),
        ("GPU-00000000-0000-4000-8000-00000000000", "error"),  # a prefix of both
        ("2", "error"),
    ],
)
def test_node_devices_follow_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, expected: list[str] | str
) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    got = readings.node_devices()
    if expected == "error":
        assert isinstance(got, nvml.NvmlError) and got.kind is nvml.NvmlErrorKind.NOT_FOUND
        assert "CUDA_VISIBLE_DEVICES" in got.message
        return
    assert not isinstance(got, nvml.NvmlError)
    assert ["..." + d.uuid[-2:] for d in got] == expected


def test_monitor_reports_nvml_errors_as_data() -> None:
    error = nvml.NvmlError(nvml.NvmlErrorKind.LIBRARY_NOT_FOUND, "no driver")
    sample = readings.sample_node("node-a", 1.0, read=lambda: error)
    assert sample.gpus == () and sample.error == error


def test_gpu_key_is_exact_as_a_float_and_labels_in_hex() -> None:
    uuid = "GPU-11111111-2222-3333-4444-555555555555"
    key = readings.gpu_key(uuid)
    assert 0 < key < 2**48 and float(key) == key
    assert readings.gpu_label(key) == f"gpu:{key:012x}"
    reading = readings.GpuReading(uuid, 100, 60, 40, 7.0)
    assert reading.key == key
