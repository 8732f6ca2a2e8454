"""GPU tests: one real Ray Serve cluster per session on the GPU host, skipped without CUDA.

Every test here is marked ``@pytest.mark.gpu``. Without a CUDA device (CI, a laptop) the whole
directory is skipped at collection, before Ray starts. On the GPU host Ray declares every
visible GPU, HAProxy ingress is on (as in ``serve-app run``), and everything listens on
127.0.0.1.

Fixtures:
    gpu_base_url: the Serve HTTP base URL (``http://127.0.0.1:<port>``), session scoped.
    results_dir: where tests write their JSON results (``$SERVE_APP_RESULTS_DIR``, default
        ``benchmarks/results/gpu_tests``), created if missing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.ops.ports import free_port, private_haproxy_ports

RAY_CPUS = 16


def _cuda_available() -> bool:
    try:
        import torch
    except Exception:  # noqa: BLE001 - no torch means no GPU tests
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: GPU tests run on the GPU host")
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def results_dir() -> Path:
    path = Path(os.environ.get("SERVE_APP_RESULTS_DIR", "benchmarks/results/gpu_tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def gpu_base_url() -> Iterator[str]:
    """Start Ray (all visible GPUs, 16 logical CPUs, HAProxy) and Serve; shut both down after."""
    import torch

    from serve_app.gpu import nvml
    from serve_app.ops import launch

    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "2")
    # Real NVML here, even after the integration suite scripted it in this process.
    if os.environ.pop(nvml.FAKE_NVML_VAR, None) is not None or nvml.is_scripted():
        nvml.set_source(None)
    # HAProxy's side ports are fixed by default; free ones survive a leftover server.
    private_haproxy_ports()
    port = free_port()
    gpus = torch.cuda.device_count()
    t0 = time.monotonic()
    print(f"[gpu conftest] starting Ray with {gpus} GPU(s), {RAY_CPUS} CPUs, port {port}")
    launch.start_ray(num_gpus=gpus, haproxy=True, num_cpus=RAY_CPUS)
    try:
        launch.start_serve(port)  # and the registry first, as serve-app run starts it
        print(f"[gpu conftest] Ray + Serve up in {time.monotonic() - t0:.1f} s")
        yield f"http://127.0.0.1:{port}"
    finally:
        print("[gpu conftest] shutting down Serve and Ray")
        launch.shutdown()
