"""What the parts share: the GPUs (real UUIDs from NVML, or two scripted ones on the CPU), the
scripted NVML file, the worker subprocesses (one per part, in its own process group, stopped at
its deadline by load_tests.benchmarks.throughput.workers.wait_worker) and the light load's clean
stop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from load_tests.benchmarks.throughput.workers import Worker, wait_worker
from load_tests.harness.load import Load
from load_tests.harness.meta import ROOT
from load_tests.harness.run import error_doc

GIB = 1 << 30
# Two logical GPUs on the CPU, as in tests/integration/test_two_nodes.py.
FAKE_GPUS = (
    "GPU-aaaaaaaa-0000-4000-8000-00000000000a",
    "GPU-bbbbbbbb-0000-4000-8000-00000000000b",
)
FAKE_TOTAL_BYTES = 80 * GIB
FAKE_USED_BYTES = GIB
NODE_LABEL = "serve-app/gpu"  # docs/cluster.md's node-per-GPU label


def fake_nvml_doc(free_by_gpu: dict[str, int] | None = None) -> dict[str, Any]:
    """The scripted NVML (serve_app.testing.nvml) of the CPU run: FAKE_GPUS, 80 GiB each,
    1 GiB used unless ``free_by_gpu`` says otherwise; no processes (so no per-process bytes)."""
    free = free_by_gpu or {}
    return {
        "devices": {
            u: {
                "total_bytes": FAKE_TOTAL_BYTES,
                "free_bytes": free.get(u, FAKE_TOTAL_BYTES - FAKE_USED_BYTES),
            }
            for u in FAKE_GPUS
        }
    }


def failed(exc: BaseException, deadline_unix: float) -> dict[str, Any]:
    """A part's status, reason and error for an exception: ``partial`` when its time ran out
    (a TimeoutError, SIGTERM at its hard deadline, or anything within 20 s of its deadline,
    such as a start-up that was not ready in the time left), else ``error``."""
    out_of_time = isinstance(exc, TimeoutError | SystemExit | KeyboardInterrupt)
    out_of_time = out_of_time or time.time() > deadline_unix - 20.0
    return {
        "status": "partial" if out_of_time else "error",
        "reason": f"stopped at the part's hard deadline (SIGTERM: SystemExit {exc})"
        if isinstance(exc, SystemExit)
        else f"{type(exc).__name__}: {str(exc)[:500]}",
        "errors": [error_doc(exc)],
    }


def write_json(path: Path, doc: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)


def gpu_uuids(device: str) -> list[str]:
    """The GPUs in CUDA_VISIBLE_DEVICES index order: NVML's (PCI bus) order on the GPU host, where
    CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA's the same; FAKE_GPUS on the CPU."""
    if device == "cpu":
        return list(FAKE_GPUS)
    from serve_app.gpu import nvml

    devices = nvml.all_devices()
    if isinstance(devices, nvml.NvmlError):
        raise RuntimeError(f"--device cuda, but NVML failed: {devices.message}")
    return [d.uuid for d in devices]


def spawn_part(name: str, spec: dict[str, Any], out_dir: Path) -> Worker:
    """``python -m load_tests.benchmarks.multigpu --_part NAME`` in its own process group; it
    rewrites ``out_dir/NAME.json`` as it goes, its output goes to ``out_dir/NAME.log``."""
    spec_path = Path(spec["scratch"]) / f"{name}-spec.json"
    spec_path.write_text(json.dumps(spec))
    log_path = out_dir / f"{name}.log"
    cmd = [sys.executable, "-m", "load_tests.benchmarks.multigpu", "--_part", name]
    cmd += ["--_spec", str(spec_path)]
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=str(ROOT),
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Worker(proc, out_dir / f"{name}.json", log_path)


def run_part(name: str, spec: dict[str, Any], out_dir: Path, hard_deadline: float) -> int:
    """Spawn the part and wait for it; past ``hard_deadline`` it is stopped (SIGTERM, then
    SIGKILL) and what its Ray session left is killed. The part's exit code (-15/-9 if stopped)."""
    _, rc = wait_worker(spawn_part(name, spec, out_dir), hard_deadline)
    return rc


def start_load(url: str, clients: int) -> Load:
    """Closed-loop clients (harness.load.Load) on ``url``, started (stop with ``stop_load``)."""
    return Load(url, clients=clients).__enter__()


def cleanup_first() -> None:
    """From here on a SIGTERM (the part's hard deadline) waits: the cleanup that follows stops
    the part's Ray cluster, and SIGKILL 20 s later still bounds it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def stop_load(load: Load, timeout_s: float = 15.0) -> None:
    """Stop harness.load.Load's clients, waiting at most ``timeout_s`` in all (its own exit waits up
    to a minute per client for a request in flight)."""
    load.stop.set()
    deadline = time.monotonic() + timeout_s
    for t in load._threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
