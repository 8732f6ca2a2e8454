"""What each job deploys and sends: serve_app's config (configs/default.yaml, what
``serve-app run`` deploys, with dummy fp16 weights), plain Ray Serve's no-op config, the payloads,
the time one payload's measurement takes."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from load_tests.benchmarks.throughput import noop_app, ray_serve_batch_app, stats
from load_tests.benchmarks.throughput.payload import MODELS, Payload, model_payload, noop_payload
from load_tests.harness.meta import ROOT

DEFAULT_CONFIG = ROOT / "configs" / "default.yaml"
# Seconds a deploy takes until it answers: (GPU, CPU); on a GPU each replica captures CUDA
# graphs, calibrates and warms up, and 16 of them start at once.
DEPLOY_EST_S = {
    "serve_app": (60.0, 20.0),
    "noop": (15.0, 8.0),
    "ray_serve_batch": (40.0, 15.0),
    "litserve": (45.0, 15.0),
}
# The row's ``setup`` for each job kind.
SETUP_OF_KIND = {
    "serve_app": "serve_app",
    "noop": "ray_serve_noop",
    "ray_serve_batch": "ray_serve_batch",
    "litserve": "litserve",
}
PEERS: tuple[str, ...] = ("ray_serve_batch", "litserve")
PEER_MODELS = ("minilm",)  # the peers serve the embeddings model only
RAY_START_EST_S = (15.0, 8.0)  # (GPU, CPU)


def serve_app_doc(model: str, replicas: int, cfg: Mapping[str, Any], port: int) -> dict:
    """configs/default.yaml (what ``serve-app run`` deploys) for ``model`` with dummy weights in
    fp16, ``replicas`` replicas at ``gpu_share`` of a GPU each; real defaults otherwise."""
    from serve_app.config.deploy import load_deploy_config

    doc = load_deploy_config(DEFAULT_CONFIG)
    doc["http_options"] = {"host": "127.0.0.1", "port": port}
    app = doc["applications"][0]
    app["name"] = f"{model}-r{replicas}"
    m = MODELS[model]
    app["args"].update(load_format="dummy", dtype="float16", model_name=m["model_name"])
    if cfg.get("serve_app_layers") is not None and m["kind"] == "embeddings":
        app["args"]["model_path"] = str(layered_minilm_dir(cfg["serve_app_layers"]))
    if m["kind"] == "image":
        app["args"].update(adapter="image-classification", arch="resnet50")
    if cfg.get("mps"):  # serve_app's MPS mode: a driver limit per replica, concurrent kernels
        app["args"].setdefault("memory", {})["enforcement"] = "mps"
    dep = app["deployments"][0]
    dep["num_replicas"] = replicas
    dep["ray_actor_options"] = {
        "num_cpus": stats.replica_cpus(replicas, len(cfg["server_cores"])),
        "num_gpus": gpu_share(replicas, cfg),
    }
    return doc


def layered_minilm_dir(layers: int) -> Path:
    """The packaged MiniLM's tokenizer and width with ``layers`` encoder layers (dummy weights
    only): with none (the embedding layer, then pooling) the forward is nearly free, so a row
    measures serve_app's own path (parse, tokenize, batch, pool, respond) against the no-op's.
    Rewritten on each call, in the temporary directory, since every replica of the run reads
    it."""
    from serve_app.adapters.embeddings.modeldir import SKELETON_DIR

    if layers < 0:
        raise ValueError(f"layers must be >= 0, not {layers}")
    path = Path(tempfile.gettempdir()) / f"serve_app_bench_minilm_l{layers}"
    path.mkdir(exist_ok=True)
    for src in SKELETON_DIR.iterdir():
        if src.name != "config.json" and not (path / src.name).exists():
            (path / src.name).symlink_to(src)
    config = json.loads((SKELETON_DIR / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def gpu_share(replicas: int, cfg: Mapping[str, Any]) -> float:
    """Each replica's num_gpus: ``--replica-share`` when given (Ray packs fractional replicas
    onto one GPU before the next, so 4 x 0.25 on a two-GPU node is one GPU's worth), else the
    share that fits all ``replicas`` on one GPU."""
    share = cfg.get("replica_share")
    return float(share) if share else stats.replica_share(replicas)


def noop_doc(replicas: int, cfg: Mapping[str, Any], port: int) -> dict:
    """Plain Ray Serve's no-op at ``replicas`` replicas (no GPU), as a Serve config."""
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [
            {
                "name": f"noop-r{replicas}",
                "route_prefix": "/",
                "import_path": noop_app.IMPORT_PATH,
                "args": {},
                "deployments": [
                    {
                        "name": noop_app.DEPLOYMENT_NAME,
                        "num_replicas": replicas,
                        "max_ongoing_requests": 512,
                        # As serve_app's deployment: a log line per request costs the replica.
                        "logging_config": {"enable_access_log": False},
                        "ray_actor_options": {
                            "num_cpus": stats.replica_cpus(replicas, len(cfg["server_cores"]))
                        },
                    }
                ],
            }
        ],
    }


def ray_serve_batch_doc(replicas: int, cfg: Mapping[str, Any], port: int) -> dict:
    """The ``ray_serve_batch`` peer at ``replicas`` replicas as a Serve config: the no-op's
    deployment options (same ingress, queue bound and access log), the model on a GPU share as
    serve_app's replicas get, ``@serve.batch`` at the run's peer batch settings."""
    doc = noop_doc(replicas, cfg, port)
    app = doc["applications"][0]
    cuda = cfg["device"] == "cuda"
    app.update(
        name=f"ray-serve-batch-r{replicas}",
        import_path=ray_serve_batch_app.IMPORT_PATH,
        args={
            "device": "cuda" if cuda else "cpu",
            "model_name": MODELS["minilm"]["model_name"],
            "max_batch_size": cfg["peer_max_batch_size"],
            "batch_wait_timeout_s": cfg["peer_batch_wait_s"],
        },
    )
    dep = app["deployments"][0]
    dep["name"] = ray_serve_batch_app.DEPLOYMENT_NAME
    if cuda:
        dep["ray_actor_options"]["num_gpus"] = gpu_share(replicas, cfg)
    return doc


def payload_for(model: str, n: int, cfg: Mapping[str, Any]) -> Payload:
    """``model``'s payload of ``n`` inputs; the run's ``--workload`` applies to text models."""
    text = MODELS[model]["kind"] == "embeddings"
    workload = cfg.get("workload", "short") if text else "short"
    return model_payload(model, n, cfg["encoding_format"], workload=workload)


def ceiling_texts(model: str, cfg: Mapping[str, Any]) -> list[str] | None:
    """The texts the in-process ceiling embeds for ``model`` under the mixed workload: those of
    its payload with the most inputs per request (the first ``ceiling_max_texts`` of them when
    set); None for other workloads and for images."""
    if MODELS[model]["kind"] != "embeddings" or cfg.get("workload", "short") == "short":
        return None
    texts = list(payload_for(model, max(cfg["inputs_per_request"]), cfg).texts)
    return texts[: cfg.get("ceiling_max_texts") or len(texts)]


def job_payloads(job: Mapping[str, Any], cfg: Mapping[str, Any]) -> list[Payload]:
    if job["kind"] == "noop":
        return [noop_payload()]
    return [payload_for(job["model"], n, cfg) for n in cfg["inputs_per_request"]]


def client_payloads(cfg: Mapping[str, Any]) -> list[Payload]:
    """The payloads whose client ceiling the run measures: those of the setups it serves, or
    the models' when it serves none (``--phases client`` alone, e.g. with ``--merge`` to add
    the ceilings to an earlier run's rows)."""
    phases = set(cfg["phases"])
    out = []
    model_served = {"serve", *PEERS}
    if phases & model_served or not phases & {*model_served, "noop"}:
        out = [payload_for(m, n, cfg) for m in cfg["models"] for n in cfg["inputs_per_request"]]
    if "noop" in phases:
        out.append(noop_payload())
    return out


def measure_est_s(cfg: Mapping[str, Any]) -> float:
    """Seconds one payload's wrk tries and open-loop point take, with pauses and start-up."""
    d, pause = cfg["duration_s"], cfg["pause_s"]
    return len(cfg["connections"]) * (d + 1.0 + pause) + d + cfg["warmup_s"] + 4.0 + pause


def client_ceiling_est_s(cfg: Mapping[str, Any]) -> float:
    """Seconds one payload's client ceiling takes at most: wrk's tries and the open-loop
    search's points, each with its start and pause."""
    d, pause = cfg["ceiling_duration_s"], cfg["pause_s"]
    point_s = d + cfg["ceiling_warmup_s"] + 0.8 + pause / 2
    return len(cfg["connections"]) * (d + 0.2 + pause) + cfg["ceiling_max_points"] * point_s


def plan_estimate(cfg: Mapping[str, Any], jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """About how long each phase and job will take, in seconds, and how many jobs fit the
    budget (the rest will be skipped), for the log and meta.json."""
    cuda = cfg["device"] == "cuda"
    per_payload = measure_est_s(cfg)
    n_payloads = len(client_payloads(cfg))
    est = {
        "ceiling_s": (10.0 + sum(len(b) for b in cfg["model_batches"].values()) * 2.0)
        if "ceiling" in cfg["phases"] and cuda
        else (5.0 + sum(len(b) for b in cfg["model_batches"].values()) * 0.8)
        if "ceiling" in cfg["phases"]
        else 0.0,
        "client_s": n_payloads * client_ceiling_est_s(cfg) if "client" in cfg["phases"] else 0.0,
        "ray_start_s": RAY_START_EST_S[0 if cuda else 1] if jobs else 0.0,
    }
    used = sum(est.values()) + cfg["teardown_reserve_s"]
    fitting, job_s = 0, []
    for job in jobs:
        s = DEPLOY_EST_S[job["kind"]][0 if cuda else 1] + per_payload * len(job_payloads(job, cfg))
        job_s.append({"key": job["key"], "s": round(s)})
        used += s
        fitting += used <= cfg["max_time_s"]
    est = {k: round(v) for k, v in est.items()}
    return {**est, "jobs": job_s, "jobs_fitting": fitting, "total_s": round(used)}
