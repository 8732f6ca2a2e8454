"""Names, models, setups and phases of the side-by-side run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS_ENV = "SERVE_APP_RESULTS_DIR"
DEFAULT_OUT = "docs/results/benchmarks"
NOOP_LIMIT_S = 0.002  # "the stack adds no more than 2 ms p50"

MODELS: dict[str, dict[str, Any]] = {
    "resnet50": {
        "kind": "image",
        "items": "images",
        "model_name": "resnet50",
        "route": "/v1/classify",
        "p99_target_s": 0.2,
    },
    "minilm": {
        "kind": "embeddings",
        "items": "texts",
        "model_name": "all-MiniLM-L6-v2",
        "route": "/v1/embeddings",
        "p99_target_s": 0.1,
    },
}
# server: which deployment; shared: N replicas at 1/N of the GPU (else one at a whole GPU).
SETUPS: dict[str, dict[str, Any]] = {
    "plain_1": {"server": "plain", "shared": False, "proxy": "default"},
    "plain_shared": {"server": "plain", "shared": True, "proxy": "default"},
    "serve_app": {"server": "serve_app", "shared": True, "proxy": "haproxy"},
    "plain_1_haproxy": {"server": "plain", "shared": False, "proxy": "haproxy"},
    "plain_shared_haproxy": {"server": "plain", "shared": True, "proxy": "haproxy"},
}
PHASES = ("ceiling", "client", "noop", "plain_1", "plain_shared", "serve_app", "haproxy_plain")
DEFAULT_PHASES = PHASES[:-1]  # haproxy_plain only with --haproxy-plain (or --only)


def setup_label(key: str, replicas: int) -> str:
    spec = SETUPS[key]
    who = "serve_app" if spec["server"] == "serve_app" else "plain Ray Serve"
    layout = f"{replicas} x {1 / replicas:g} GPU" if spec["shared"] else "1 x 1 GPU"
    proxy = "HAProxy" if spec["proxy"] == "haproxy" else "default proxy"
    return f"{who}, {layout}, {proxy}"
