"""One real local Ray Serve cluster per test session, on 127.0.0.1, with logical GPUs.

Applications are deployed under their own route prefixes, so modules share the cluster.
The HAProxy ingress is on, as in `serve-app run`. NVML is scripted (SERVE_APP_FAKE_NVML) for
the controller tests only at the NVML boundary; everything else is real.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from serve_app.ops.ports import free_port, private_haproxy_ports
from tests.helpers import wait_http

LOGICAL_GPUS = 1
LOGICAL_CPUS = 8


@dataclass
class Cluster:
    base_url: str
    nvml_script: Path

    def url(self, prefix: str, path: str) -> str:
        return f"{self.base_url}{prefix.rstrip('/')}{path}"

    def deploy(self, name: str, route_prefix: str, args: dict[str, Any], **options: Any) -> str:
        """Deploy a serve_app application and wait until it answers; returns its base URL."""
        from ray import serve

        from serve_app.config.args import parse_args
        from serve_app.serving.replica import ModelServer

        app_args = parse_args(args).model_dump()
        serve.run(
            ModelServer.options(**options).bind(app_args),  # type: ignore[attr-defined]
            name=name,
            route_prefix=route_prefix,
        )
        base = f"{self.base_url}{route_prefix.rstrip('/')}"
        wait_http(f"{base}/healthz", 120.0)
        return base

    def delete(self, name: str) -> None:
        from ray import serve

        serve.delete(name)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from serve_app.ops import launch
    from serve_app.startup import warmpool

    script = tmp_path_factory.mktemp("nvml") / "nvml-script.json"
    script.write_text(json.dumps({"t0_unix_s": time.time(), "devices": {}, "steps": []}))
    os.environ["SERVE_APP_FAKE_NVML"] = str(script)
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "2")
    # HAProxy's side ports are fixed by default; free ones let this suite run beside a server.
    private_haproxy_ports()
    port = free_port()
    # Ray's metrics endpoint on a free port, not the pinned default another server may hold.
    os.environ.setdefault(launch.METRICS_PORT_VAR, str(free_port()))
    # As serve-app run starts it: every worker preloads what a replica imports (warmpool).
    launch.start_ray(
        num_gpus=LOGICAL_GPUS,
        haproxy=True,
        num_cpus=LOGICAL_CPUS,
        system_config=warmpool.system_config(["embeddings", "image-classification"], 2),
    )
    from ray import serve

    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    try:
        yield Cluster(base_url=f"http://127.0.0.1:{port}", nvml_script=script)
    finally:
        launch.shutdown()
