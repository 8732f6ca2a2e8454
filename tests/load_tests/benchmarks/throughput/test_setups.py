"""load_tests.benchmarks.throughput.setups: what each job deploys and sends, and the plan's time
estimate."""

from __future__ import annotations

import pytest

from load_tests.benchmarks.throughput.cli import plan_jobs
from load_tests.benchmarks.throughput.setups import noop_doc, ray_serve_batch_doc, serve_app_doc


def test_serve_app_doc_is_the_default_config_with_dummy_fp16_weights() -> None:
    from serve_app.config.deploy import check_deploy_config

    cfg = {"server_cores": list(range(16))}
    doc = serve_app_doc("resnet50", 12, cfg, 8123)
    assert check_deploy_config(doc) == []
    app = doc["applications"][0]
    assert app["import_path"] == "serve_app.app:build_app" and app["route_prefix"] == "/"
    assert app["args"]["adapter"] == "image-classification"
    assert (app["args"]["load_format"], app["args"]["dtype"]) == ("dummy", "float16")
    assert app["args"]["model_name"] == "resnet50"
    dep = app["deployments"][0]
    assert dep["num_replicas"] == 12
    assert dep["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.08}
    assert doc["http_options"] == {"host": "127.0.0.1", "port": 8123}
    minilm = serve_app_doc("minilm", 4, cfg, 8123)["applications"][0]["args"]
    assert minilm["adapter"] == "embeddings" and minilm["model_name"] == "all-MiniLM-L6-v2"


def test_client_payloads_follow_the_served_setups_or_the_models_alone() -> None:
    from load_tests.benchmarks.throughput.setups import client_payloads

    cfg = {"models": ["minilm"], "inputs_per_request": [64, 1], "encoding_format": "float"}
    keys = {
        phases: [p.key for p in client_payloads(dict(cfg, phases=phases.split(",")))]
        for phases in ("client,serve,noop", "client,noop", "client")
    }
    assert keys == {
        "client,serve,noop": ["minilm-x64-float", "minilm-x1-float", "noop"],
        "client,noop": ["noop"],
        "client": ["minilm-x64-float", "minilm-x1-float"],  # added to an earlier run's rows
    }


def test_noop_doc_validates_as_a_serve_config() -> None:
    from ray.serve.schema import ServeDeploySchema

    doc = noop_doc(8, {"server_cores": [0, 1, 2, 3]}, 8123)
    ServeDeploySchema.model_validate(doc)
    dep = doc["applications"][0]["deployments"][0]
    assert dep["num_replicas"] == 8 and dep["ray_actor_options"] == {"num_cpus": 0.5}
    assert dep["logging_config"] == {"enable_access_log": False}


def test_plan_estimate_counts_the_jobs_that_fit_the_budget() -> None:
    from load_tests.benchmarks.throughput.options import build_parser, make_config
    from load_tests.benchmarks.throughput.setups import plan_estimate

    parser = build_parser()
    argv = ["--out", "/tmp/x", "--device", "cpu", "--quick", "--replicas", "1,2"]
    cfg = make_config(parser.parse_args(argv), parser)
    jobs = plan_jobs(cfg["models"], cfg["replicas"], cfg["phases"])
    assert [j["key"] for j in jobs] == [
        "minilm/r1",
        "noop/r1",
        "ray_serve_batch-minilm/r1",
        "litserve-minilm/r1",
        "minilm/r2",
        "noop/r2",
        "ray_serve_batch-minilm/r2",
        "litserve-minilm/r2",
    ]
    roomy = plan_estimate(dict(cfg, max_time_s=10_000.0), jobs)
    assert roomy["jobs_fitting"] == 8 and [j["key"] for j in roomy["jobs"]] == [
        j["key"] for j in jobs
    ]
    fixed = roomy["ceiling_s"] + roomy["client_s"] + roomy["ray_start_s"]
    assert roomy["total_s"] == pytest.approx(
        fixed + cfg["teardown_reserve_s"] + sum(j["s"] for j in roomy["jobs"]), abs=4
    )
    assert plan_estimate(dict(cfg, max_time_s=fixed), jobs)["jobs_fitting"] == 0


def test_ray_serve_batch_doc_is_the_noops_deployment_with_the_model_and_batch_settings() -> None:
    from ray.serve.schema import ServeDeploySchema

    cfg = {
        "server_cores": list(range(16)),
        "device": "cuda",
        "peer_max_batch_size": 64,
        "peer_batch_wait_s": 0.01,
    }
    doc = ray_serve_batch_doc(12, cfg, 8123)
    ServeDeploySchema.model_validate(doc)
    app = doc["applications"][0]
    assert app["import_path"] == "load_tests.benchmarks.throughput.ray_serve_batch_app:build"
    assert app["args"] == {
        "device": "cuda",
        "model_name": "all-MiniLM-L6-v2",
        "max_batch_size": 64,
        "batch_wait_timeout_s": 0.01,
    }
    dep = app["deployments"][0]
    assert dep["num_replicas"] == 12 and dep["max_ongoing_requests"] == 512
    assert dep["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.08}  # as serve_app's
    cpu = ray_serve_batch_doc(1, dict(cfg, device="cpu"), 8123)["applications"][0]
    assert cpu["args"]["device"] == "cpu"
    assert "num_gpus" not in cpu["deployments"][0]["ray_actor_options"]


def test_the_peers_get_the_model_payloads_and_serve_minilm_only() -> None:
    from load_tests.benchmarks.throughput.setups import client_payloads, job_payloads

    phases = ["ray_serve_batch", "litserve"]
    jobs = plan_jobs(["minilm", "resnet50"], [12], phases)
    assert [(j["key"], j["kind"]) for j in jobs] == [
        ("ray_serve_batch-minilm/r12", "ray_serve_batch"),
        ("litserve-minilm/r12", "litserve"),
    ]
    cfg = {"inputs_per_request": [1, 16], "encoding_format": "float", "phases": phases}
    assert [p.key for p in job_payloads(jobs[0], cfg)] == ["minilm-x1-float", "minilm-x16-float"]
    keys = [p.key for p in client_payloads(dict(cfg, models=["minilm"]))]
    assert keys == ["minilm-x1-float", "minilm-x16-float"]


def test_the_mixed_workload_applies_to_minilm_and_its_ceiling_embeds_the_same_texts() -> None:
    from load_tests.benchmarks.throughput.setups import ceiling_texts, client_payloads

    cfg = {"models": ["minilm", "resnet50"], "inputs_per_request": [1, 4]}
    cfg.update(encoding_format="float", phases=["client"], workload="mixed")
    keys = [p.key for p in client_payloads(cfg)]
    assert keys == [
        "minilm-x1-mixed-float",
        "minilm-x4-mixed-float",
        "resnet50-x1-raw",
        "resnet50-x4-b64",
    ]
    x4 = client_payloads(cfg)[1]
    assert ceiling_texts("minilm", cfg) == list(x4.texts) and len(x4.texts) == 64 * 4
    assert ceiling_texts("minilm", dict(cfg, ceiling_max_texts=8)) == list(x4.texts[:8])
    assert ceiling_texts("resnet50", cfg) is None
    assert ceiling_texts("minilm", dict(cfg, workload="short")) is None
