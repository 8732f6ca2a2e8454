"""serve-app plan --measure: the config each replica is measured with, the load it gets, the
command's checks before anything starts, and one closed-loop window against a local server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from serve_app.config.deploy import check_deploy_config
from serve_app.ops.cli import main
from serve_app.plan.loop import Target, run_window
from serve_app.plan.measure import measure_config, provenance, saturation_concurrency

ROOT = Path(__file__).resolve().parents[3]
RAG = ROOT / "configs" / "rag-stack.yaml"
RAG_TARGETS = ROOT / "examples" / "planning" / "rag-stack-targets.yaml"


def test_each_application_is_measured_alone_at_root_with_one_replica(tmp_path: Path) -> None:
    doc = yaml.safe_load(RAG.read_text())
    doc["applications"][1]["args"]["memory"]["budget"] = "2GiB"
    doc["applications"][1]["deployments"][0]["autoscaling_config"] = {"max_replicas": 3}
    out = measure_config(
        doc, "rerank", 64, share=0.5, port=18123, calibrate=False, cache_dir=tmp_path
    )
    assert out["http_options"] == {"host": "127.0.0.1", "port": 18123}
    assert out["proxy_location"] == doc["proxy_location"]
    (app,) = out["applications"]
    assert app["name"] == "rerank" and app["route_prefix"] == "/"
    dep = app["deployments"][0]
    assert dep["num_replicas"] == 1 and "autoscaling_config" not in dep
    assert dep["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0.5}
    assert dep["max_ongoing_requests"] == 512  # as configured
    args = app["args"]
    assert args["max_batch_size"] == 64 and args["load_format"] == "dummy"
    # Every graph and warm-up batch at start-up: calibration beside the whole pool.
    assert args["cuda_graph_startup_budget_s"] == args["warmup_startup_budget_s"] == 600.0
    assert args["memory"] == {
        "cache_policy": "threshold",
        "calibrate": False,
        "calibration_cache_dir": str(tmp_path),
    }
    assert check_deploy_config(out) == []
    # The config itself is left as it was.
    assert doc["applications"][1]["route_prefix"] == "/v1/rerank"
    assert doc["applications"][1]["args"]["memory"]["budget"] == "2GiB"


def test_saturation_keeps_two_batches_in_flight() -> None:
    assert saturation_concurrency(256, 16) == 34
    assert saturation_concurrency(8, 16) == 4
    assert saturation_concurrency(256, 1) == 512  # capped


def test_provenance_names_the_commit_and_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_APP_CODE_COMMIT", "f00dfeed")
    assert provenance("NVIDIA H200").startswith(
        "measured by serve-app plan --measure at f00dfeed on "
    )
    assert provenance("NVIDIA H200").endswith("/NVIDIA H200")


def test_measure_needs_targets_and_checks_them_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "plan")
    assert main(["plan", str(RAG), "--measure", "--out", out]) == 2
    assert "--measure needs --targets" in capsys.readouterr().err
    partial = tmp_path / "t.yaml"
    partial.write_text("models: {embeddings: {p99_target_s: 0.1}}\n")
    assert main(["plan", str(RAG), "--measure", "--targets", str(partial), "--out", out]) == 2
    err = capsys.readouterr().err
    assert "application rerank: no target" in err and "classify-images" in err
    assert not Path(out).exists()  # nothing started, nothing written
    with pytest.raises(SystemExit):
        main(["plan", str(RAG), "--measure", "--measurements", "m.json", "--out", out])


def test_a_closed_loop_window_counts_answers_latencies_and_cpu(server: str) -> None:
    busy = iter([1.0, 1.5])
    t = Target(f"{server}/spin", b"{}", {}, os.getpid(), None, lambda: next(busy))
    r = run_window(t, concurrency=2, warmup_s=0.2, window_s=1.0)
    assert r.window_s == pytest.approx(1.0, abs=0.01) and r.concurrency == 2
    # Each request takes at least 20 ms, two at a time: at most 100 in the second (and at least
    # one, however little of a core a loaded machine left the client).
    assert 1 <= r.requests <= 100 and r.errors == 0
    assert r.p50_s is not None and r.p99_s is not None and 0.02 <= r.p50_s <= r.p99_s
    assert r.batch_busy_s == pytest.approx(0.5) and r.gpu_busy_s is None
    assert r.replica_cpu_s > 0  # this process, which ran the server too
    bad = Target(f"{server}/busy", b"{}", {}, os.getpid(), None, lambda: 0.0)
    r = run_window(bad, concurrency=1, warmup_s=0.1, window_s=0.5)
    assert r.requests == 0 and r.errors > 0 and r.p99_s is None
