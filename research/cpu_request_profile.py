"""Profile the replica's request path on the CPU: a local Ray with the HAProxy ingress, one
serve_app replica with a tiny BERT (1 layer, width 32, dummy weights, so that the model costs
little and the request path shows) and a plain Ray Serve no-op, both at /sa and /noop.

    .venv/bin/python -m research.cpu_request_profile [SECONDS]   # prints READY, then serves
    .tools/wrk -t1 -c32 -d14s -s post.lua http://127.0.0.1:8123/sa/v1/embeddings &
    .venv/bin/py-spy record -p $(pgrep -f 'ServeReplica:sa:model') -d 10 -r 200 -f raw \\
        -o profile.raw --threads --nonblocking

(post.lua sets method POST, Content-Type application/json and the body.) The profiles in
benchmarks/results/profile/cpu_request_path/ came from this, on the 2-core CPU machine.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORT = 8123


def tiny_model_dir() -> str:
    src = ROOT / "serve_app" / "models" / "minilm-skeleton"
    dst = Path(tempfile.mkdtemp(prefix="tiny-bert-")) / "model"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64)
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def main() -> None:
    # Ray with token auth, as serve-app runs it, and a token of this run's own.
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    sys.path.insert(0, str(ROOT))
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from serve_app.config.args import parse_args
    from serve_app.ops import launch, ports
    from serve_app.serving.replica import ModelServer
    from tests.helpers import wait_http

    ports.private_haproxy_ports()
    launch.start_ray(num_gpus=0, haproxy=True, num_cpus=4)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT}, proxy_location="HeadOnly")
    args = parse_args(
        {"adapter": "embeddings", "model_path": tiny_model_dir(), "load_format": "dummy"}
    ).model_dump()
    app = ModelServer.options(ray_actor_options={"num_cpus": 1}).bind(args)  # type: ignore[attr-defined]
    serve.run(app, name="sa", route_prefix="/sa")

    @serve.deployment(max_ongoing_requests=512, logging_config={"enable_access_log": False})
    class Noop:
        async def __call__(self, request: Request) -> JSONResponse:
            await request.body()
            return JSONResponse({})

    serve.run(Noop.bind(), name="noop", route_prefix="/noop")  # type: ignore[attr-defined]
    wait_http(f"http://127.0.0.1:{PORT}/sa/healthz", 120.0)
    print("READY", flush=True)
    try:
        time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 600.0)
    finally:
        launch.shutdown()


if __name__ == "__main__":
    main()
