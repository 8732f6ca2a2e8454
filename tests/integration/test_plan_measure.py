"""serve-app plan --measure end to end on the CPU, with a real local Ray and HAProxy: the user
model of examples/custom_model (a small MLP, seconds to start) measured at two batch caps, the
measurements file written and validated, and the plan solved and written from it. It checks
the measuring path, not the figures (a shared 2-core machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from serve_app.plan.measurements import load_measurements

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom_model" / "config.yaml"
PROV = "measured by serve-app plan --measure at "


def test_measure_a_tiny_config_on_the_cpu_then_plan(tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["applications"][0]["args"]["max_batch_size"] = 4
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(doc))
    targets = tmp_path / "targets.yaml"
    ask = {"p99_target_s": 2.0, "load_rps": 5, "max_replicas": 2, "items_per_request": 4}
    ask["request"] = {"inputs": ["hello world", "a replica", "of a model", "on a CPU"]}
    targets.write_text(yaml.safe_dump({"models": {"byte-scorer": ask}}))
    out = tmp_path / "plan"
    cmd = [sys.executable, "-m", "serve_app", "plan", str(config), "--measure"]
    cmd += ["--targets", str(targets), "--out", str(out), "--candidates", "2"]
    cmd += ["--warmup-s", "0.25", "--duration-s", "1.5", "--idle-duration-s", "0.5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=180)
    detail = proc.stdout[-4000:] + proc.stderr[-4000:]
    print("\n".join(line for line in proc.stdout.splitlines() if "plan --measure" in line))
    assert proc.returncode == 0, detail
    assert "plan --measure: byte-scorer: batch caps [2, 4]" in proc.stderr + proc.stdout, detail

    m = load_measurements(out / "measurements.json")  # as serve-app plan reads it
    assert m.mode == "time-sliced" and m.gpus[0].name.startswith("CPU (no GPU)")
    spec = m.models["byte-scorer"]
    assert [c.batch_size for c in spec.candidates] == [4, 2]
    for c in spec.candidates:
        assert c.throughput_rps > 1 and 0 < c.p99_idle_s < 2 and c.gpu_s_per_request == 0
    assert 0 < spec.cpu_s_per_request < 1
    assert 0 < spec.ingress_cpu_s_per_request < 1  # HAProxy's and Ray's proxy's CPU
    assert spec.weights_bytes > 50 << 20  # the replica's RSS stands in on the CPU
    assert spec.activation_peak_bytes == {2: 0, 4: 0} and spec.context_bytes == 0
    assert spec.load_rps == 5 and spec.max_replicas == 2 and spec.p99_target_s == 2.0
    for field in (
        "throughput_rps",
        "cpu_s_per_request",
        "ingress_cpu_s_per_request",
        "weights_bytes",
        "gpu_s_per_request",
    ):
        assert spec.sources[field].startswith(PROV), (field, spec.sources[field])

    raw = json.loads((out / "readings.json").read_text())
    windows = raw["models"]["byte-scorer"]["candidates"]
    assert [w["batch_size"] for w in windows] == [4, 2]
    for w in windows:
        assert w["saturation"]["errors"] == 0 and w["idle"]["errors"] == 0, w
        assert w["saturation"]["concurrency"] == 4 and w["idle"]["concurrency"] == 1
        # This cluster's HAProxy (and Ray's proxy, idle beside it) read at the window's edges.
        sat = w["saturation"]
        assert sat["ingress_processes_by_kind"].get("haproxy", 0) >= 1, sat
        assert sat["ingress_cpu_s_by_kind"]["haproxy"] > 0, sat
        per_request = sat["ingress_cpu_s"] / sat["requests"]
        assert per_request >= spec.ingress_cpu_s_per_request  # the least of the caps is charged

    # The plan, solved from what was measured.
    plan = json.loads((out / "plan.json").read_text())
    (planned,) = plan["models"]
    assert planned["application"] == "byte-scorer" and 1 <= sum(planned["replicas_per_gpu"]) <= 2
    written = yaml.safe_load((out / "serve_config.yaml").read_text())
    dep = written["applications"][0]["deployments"][0]
    assert dep["num_replicas"] == sum(planned["replicas_per_gpu"])
    assert written["applications"][0]["args"]["max_batch_size"] == planned["batch_size"]
    (gpu,) = plan["gpus"]  # the ingress's cores charged for the load the plan carries
    assert gpu["ingress_cores"] == pytest.approx(5 * spec.ingress_cpu_s_per_request, rel=1e-4)
