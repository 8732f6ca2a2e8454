"""control.monitor: the node monitor as a plain object (no Ray): it samples, keeps decisions."""

from __future__ import annotations

import json
from pathlib import Path

from serve_app.control import monitor
from serve_app.control.readings import GpuReading
from serve_app.gpu import nvml
from serve_app.testing.nvml import ScriptedSource
from tests.unit.control.builders import UUID0


def test_monitor_samples_and_keeps_decisions(tmp_path: Path) -> None:
    script = tmp_path / "nvml.json"
    script.write_text(json.dumps({"devices": {UUID0: {"total_bytes": 100, "free_bytes": 60}}}))
    nvml.set_source(ScriptedSource(script, clock=lambda: 7.0))
    try:
        mon = monitor.GpuMonitor("node-a", clock=lambda: 7.0, ray_gpu=lambda: 0.75, start=False)
        sample = mon.sample_once()
    finally:
        nvml.set_source(None)
    assert sample.gpus == (GpuReading(UUID0, 100, 60, 40, 7.0),)
    assert sample.error is None and sample.ray_gpu_available == 0.75
    assert mon.latest() == sample
    record = monitor.DecisionRecord("app/model", 3, 2, "up", "scale_up", "load", 7.0)
    mon.record_decision(record)
    assert mon.snapshot() == (sample, {"app/model": record}, [])


def test_monitor_name_and_a_live_pid() -> None:
    import os

    assert monitor.monitor_name("abc") == "serve_app_gpu_monitor_abc"
    assert monitor.pid_alive(os.getpid())
    assert not monitor.pid_alive(2**22 + 12345)  # above Linux's pid_max: no such process
