"""control.stats: the float metrics a replica reports for the headroom policy."""

from __future__ import annotations

import asyncio

from serve_app.control import stats
from serve_app.control.readings import NodeReadings, gpu_key
from serve_app.control.stats import METRIC_GPU_KEY, stats_from_readings
from serve_app.gpu import nvml
from tests.unit.control.builders import GIB, NOW, UUID0, replica_stats


def test_replica_stats_are_floats_with_the_documented_keys() -> None:
    got = replica_stats(40 * GIB)
    assert all(isinstance(v, float) for v in got.values())
    key = gpu_key(UUID0)
    assert key < 2**53 and got[METRIC_GPU_KEY] == float(key)
    assert got[stats.gpu_metric_name(key, "free_bytes")] == float(40 * GIB)
    assert got[stats.METRIC_NVML_OK] == 1.0
    failed = NodeReadings("n", (), nvml.NvmlError(nvml.NvmlErrorKind.GPU_LOST, "x"), NOW)
    no_gpu = stats_from_readings(
        budget_bytes=1,
        peak_bytes=1,
        gpu_uuid=UUID0,
        gpu_fraction=0.25,
        nvml_process_bytes=5,
        readings=failed,
    )
    assert no_gpu[stats.METRIC_NVML_OK] == 0.0
    assert no_gpu[stats.METRIC_NVML_PROCESS_BYTES] == 5.0
    assert not any(stats.GPU_METRIC.match(k) for k in no_gpu)


def test_replica_autoscaling_stats_on_cpu_needs_no_monitor() -> None:
    got = asyncio.run(
        stats.replica_autoscaling_stats(
            budget_bytes=0, peak_bytes=0, gpu_uuid=None, gpu_fraction=0.0
        )
    )
    assert got[METRIC_GPU_KEY] == 0.0 and got[stats.METRIC_GPU_FRACTION] == 0.0


def test_every_gpu_metric_name_matches_the_pattern_the_policy_reads() -> None:
    key = gpu_key(UUID0)
    for field in ("total_bytes", "free_bytes", "timestamp_s"):
        match = stats.GPU_METRIC.match(stats.gpu_metric_name(key, field))
        assert match is not None and (int(match.group(1), 16), match.group(2)) == (key, field)
    assert set(stats.REPLICA_METRICS) <= set(replica_stats(40 * GIB))
