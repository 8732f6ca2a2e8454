"""CI's smoke load test: 15 s of the open-loop load generator against the CPU server, at a low
rate, to 127.0.0.1 only; every request must succeed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_smoke_zero_errors(cluster, tmp_path: Path) -> None:
    base = cluster.deploy(
        "smoke",
        "/smoke",
        {"adapter": "embeddings", "max_batch_size": 16, "batch_wait_timeout_s": 0.005},
        ray_actor_options={"num_cpus": 0.5},
    )
    try:
        out = tmp_path / "bench"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "load_tests.bench",
                "--url",
                f"{base}/v1/embeddings",
                "--kind",
                "embeddings",
                "--model",
                "all-MiniLM-L6-v2",
                "--memory-url",
                f"{base}/v1/memory",
                "--texts",
                "mixed",
                "--rate",
                "10",
                "--duration-s",
                "8",
                "--warmup-s",
                "1",
                "--max-requests",
                "200",
                "--max-error-rate",
                "0",
                "--no-progress",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        doc = json.loads((out / "bench.json").read_text())
        rate = doc["rates"][0]
        assert rate["errors"] == 0 and rate["ok"] >= 50, rate
        assert doc["verdict"]["passed"] is True
        assert (out / "bench.png").is_file()
        replicas = {s["replica_id"] for s in doc["memory"]["samples"] if s["source"] == "server"}
        assert replicas, doc["memory"]["notes"]
    finally:
        cluster.delete("smoke")
