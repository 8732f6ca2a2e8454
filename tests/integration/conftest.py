"""One real local Ray Serve cluster for the integration tests, on 127.0.0.1, with logical GPUs.

Applications are deployed under their own route prefixes, so modules share the cluster.
The HAProxy ingress is on, as in `serve-app run`. NVML is scripted (SERVE_APP_FAKE_NVML) for
the controller tests only at the NVML boundary; everything else is real.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from serve_app.ops.ports import free_port, private_haproxy_ports
from tests.helpers import wait_http

LOGICAL_GPUS = 1
LOGICAL_CPUS = 8


@dataclass
class App:
    """One serve_app application to deploy: its name, route prefix, args and Serve options."""

    name: str
    route_prefix: str
    args: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Cluster:
    base_url: str
    nvml_script: Path

    def url(self, prefix: str, path: str) -> str:
        return f"{self.base_url}{prefix.rstrip('/')}{path}"

    def deploy(self, name: str, route_prefix: str, args: dict[str, Any], **options: Any) -> str:
        """Deploy a serve_app application and wait until it answers; returns its base URL."""
        (base,) = self.deploy_many(App(name, route_prefix, args, options))
        return base

    def deploy_many(self, *apps: App) -> list[str]:
        """Deploy serve_app applications in one request to Serve, so that their replicas start
        side by side, and wait until every one answers; returns their base URLs in order."""
        from ray import serve

        from serve_app.config.args import parse_args
        from serve_app.serving.replica import ModelServer

        targets = []
        for app in apps:
            app_args = parse_args(app.args).model_dump()
            self.wait_deleted(app.name)
            bound = ModelServer.options(**app.options).bind(app_args)  # type: ignore[attr-defined]
            targets.append(serve.RunTarget(bound, name=app.name, route_prefix=app.route_prefix))
        serve.run_many(targets)  # returns once every application is RUNNING
        bases = [f"{self.base_url}{app.route_prefix.rstrip('/')}" for app in apps]
        for base in bases:
            wait_http(f"{base}/healthz", 120.0)
        return bases

    def delete(self, name: str) -> None:
        """Start deleting the application and return once Serve has taken the delete: its
        replicas drain (Serve's draining period, 2 s, then the controller's stop; ~3 s when
        waited for) while the next test deploys. deploy() of the same name waits it out."""
        from ray import serve

        serve.delete(name, _blocking=False)
        self._wait_for(name, lambda status: status == "DELETING", 10.0)

    def wait_deleted(self, name: str, timeout_s: float = 60.0) -> None:
        """Wait while an application ``name`` is being deleted (a redeploy of a running one,
        e.g. to scale it, goes ahead at once)."""
        self._wait_for(name, lambda status: status != "DELETING", timeout_s)

    def _wait_for(self, name: str, done: Callable[[str], bool], timeout_s: float) -> None:
        """Poll Serve until application ``name`` is gone or ``done`` holds for its status."""
        from ray import serve

        deadline = time.monotonic() + timeout_s
        while (app := serve.status().applications.get(name)) is not None:
            if done(app.status):  # a str enum
                return
            assert time.monotonic() < deadline, f"application {name}: {app.status}"
            time.sleep(0.1)


# Package scope: the cluster stops after the last integration test, not idles beside the unit
# tests collected after this folder (benchmarks/journal/2026-12-02-ci-time.md).
@pytest.fixture(scope="package")
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
    launch.start_serve(port)  # and the registry first, as serve-app run starts it
    _STOP.append(launch.shutdown)
    try:
        yield Cluster(base_url=f"http://127.0.0.1:{port}", nvml_script=script)
    finally:
        stop_cluster()


# How to stop the shared cluster, once it runs (stop_cluster empties it: stopping is once).
_STOP: list[Callable[[], None]] = []


def stop_cluster() -> None:
    while _STOP:
        _STOP.pop()()


def _uses_cluster(item: pytest.Item) -> bool:
    return "cluster" in getattr(item, "fixturenames", ()) and Path(__file__).parent in (
        item.path.parents
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that use the shared cluster first, then those that start their own Ray
    (serve-app run, the benchmark tools' dry runs, the two-node test), each group in its
    collected order: the shared cluster is stopped between the two, not left idling beside
    them (benchmarks/journal/2026-12-02-ci-time.md)."""
    here = Path(__file__).parent
    ours = [i for i in items if here in i.path.parents]
    if not ours:
        return
    shared = {i.path for i in ours if _uses_cluster(i)}
    ordered = [i for i in ours if i.path in shared] + [i for i in ours if i.path not in shared]
    start = items.index(ours[0])
    if items[start : start + len(ours)] == ours:  # one run of this folder's tests: reorder it
        items[start : start + len(ours)] = ordered


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last module that uses the shared cluster (its module-scoped fixtures torn
    down: pytest's own teardown of this hook ran first), stop the cluster."""
    if not _uses_cluster(item) or (nextitem is not None and nextitem.path == item.path):
        return
    rest = item.session.items[item.session.items.index(item) + 1 :]
    if not any(_uses_cluster(i) for i in rest):
        stop_cluster()
