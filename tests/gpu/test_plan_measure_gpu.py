"""serve-app plan --measure on the GPU host: configs/rag-stack.yaml's embeddings application
(MiniLM, fp16, ``load_format: dummy``) measured at three batch caps (64, 128, 256), its bytes
checked against what NVML saw, and the plan written from them.

It starts its own local Ray (the command does, as ``serve-app run``), so it does not use the
session cluster of conftest.py; run it alone:

    python -m pytest -p no:cacheprovider -q tests/gpu/test_plan_measure_gpu.py   # ~3 min

While the command runs, a thread here samples NVML's bytes per process every 0.1 s. Checked:
the context, weights and graph pool are in plausible ranges for MiniLM; the replica's NVML
bytes after its loads are at least context + weights + pool; the budget the measurements give
at the largest cap holds every sample NVML took of the measured replica; activation peaks grow
with the batch; the GPU was busy no more than the window. Writes plan_measure_gpu.json under
``$SERVE_APP_RESULTS_DIR`` (default benchmarks/results/gpu_tests) before asserting.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from serve_app.plan.measurements import budget_bytes, load_measurements

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
RAG = ROOT / "configs" / "rag-stack.yaml"
MIB = 1 << 20


class _NvmlPeaks:
    """The largest NVML bytes of each process on any GPU, sampled every 0.1 s."""

    def __init__(self) -> None:
        self.peaks: dict[int, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from serve_app.gpu import nvml

        while not self._stop.wait(0.1):
            for dev in nvml.value(nvml.all_devices()) or []:
                for pid, used in (nvml.value(nvml.processes(dev.uuid)) or {}).items():
                    self.peaks[pid] = max(self.peaks.get(pid, 0), used)
            self.samples += 1

    def __enter__(self) -> _NvmlPeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_measure_the_embeddings_of_the_rag_stack(tmp_path: Path, results_dir: Path) -> None:
    doc = yaml.safe_load(RAG.read_text())
    doc["applications"] = [a for a in doc["applications"] if a["name"] == "embeddings"]
    doc["applications"][0]["args"]["load_format"] = "dummy"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(doc))
    targets = tmp_path / "targets.yaml"
    targets.write_text(
        yaml.safe_dump(
            {
                "reserve": {"memory_bytes": 2 << 30, "cores": 4, "gpu_time": 0.05},
                "models": {"embeddings": {"p99_target_s": 0.1, "max_replicas": 8}},
            }
        )
    )
    out = tmp_path / "plan"
    cmd = [sys.executable, "-m", "serve_app", "plan", str(config), "--measure"]
    cmd += ["--targets", str(targets), "--out", str(out), "--candidates", "3"]
    cmd += ["--warmup-s", "2", "--duration-s", "5", "--idle-duration-s", "3"]
    with _NvmlPeaks() as nv:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=420)
    print(proc.stdout[-6000:], proc.stderr[-3000:], sep="\n")
    measured = json.loads((out / "measurements.json").read_text()) if proc.returncode == 0 else {}
    readings = out / "readings.json"
    raw = json.loads(readings.read_text()) if readings.is_file() else {}
    result = {
        "command": " ".join(cmd[1:]),
        "returncode": proc.returncode,
        "measurements": measured,
        "readings": raw,
        "nvml_peak_bytes_by_pid": {str(k): v for k, v in nv.peaks.items()},
        "nvml_samples": nv.samples,
    }
    (results_dir / "plan_measure_gpu.json").write_text(json.dumps(result, indent=1) + "\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = raw["models"]["embeddings"]["report"]

    m = load_measurements(out / "measurements.json")
    spec = m.models["embeddings"]
    assert m.gpus[0].total_bytes > 16 << 30 and "NVIDIA" in m.gpus[0].name
    assert [c.batch_size for c in spec.candidates] == [256, 128, 64]
    # MiniLM in fp16: 22.7 M parameters, 45 MB; the context and kernels a few hundred MiB.
    assert 30 * MIB <= spec.weights_bytes <= 300 * MIB, spec.weights_bytes
    assert 200 * MIB <= spec.context_bytes <= 3 << 30, spec.context_bytes
    assert 0 < spec.graph_pool_bytes <= 4 << 30, spec.graph_pool_bytes
    peaks = spec.activation_peak_bytes
    assert peaks[64] <= peaks[128] <= peaks[256] and peaks[256] > 0, peaks
    # NVML after the loads: the process holds at least what the figures say it always holds.
    held = spec.context_bytes + spec.weights_bytes + spec.graph_pool_bytes
    assert last["nvml_process_bytes"] >= held - 64 * MIB, (last["nvml_process_bytes"], held)
    # The budget at the largest cap holds every NVML sample of the measured replica.
    pid = int(last["pid"])
    assert pid in nv.peaks, sorted(nv.peaks)
    assert nv.peaks[pid] <= budget_bytes(spec, 256, m.margin_fraction), nv.peaks[pid]
    for c in spec.candidates:
        assert c.throughput_rps > 50 and 0 < c.p99_idle_s < 0.1, c
        # The GPU was busy no more than the window (NVML's utilisation, per request).
        assert 0 < c.gpu_s_per_request * c.throughput_rps <= 1.05, c
    assert (out / "plan.json").is_file() and (out / "serve_config.yaml").is_file()
