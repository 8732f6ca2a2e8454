"""Ray's Prometheus endpoint on a running server shows every metric serve_app declares
(serving/metrics.exported_names), with Serve's tags, after a few requests, a 503 and a 504.

The session cluster starts Ray through launch.start_ray, so the metrics port is the pinned one
(SERVE_APP_METRICS_PORT, a free port in tests/integration/conftest.py)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serve_app.ops.launch import METRICS_PORT_VAR
from serve_app.serving.metrics import exported_names
from tests.integration.conftest import App

ARGS = {
    "adapter": "embeddings",
    "max_batch_size": 8,
    "batch_wait_timeout_s": 0.0,
    "max_inputs_per_request": 8,
    "max_queued_items": 8,  # one request of 8 fills it: the next one is refused
}
TIMEOUT_ARGS = {**ARGS, "max_queued_items": 64, "queue_deadline_s": 0.02, "request_timeout_s": 0.02}
AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 1,
    "upscale_delay_s": 0,
    "downscale_delay_s": 0,
    "policy": {"policy_function": "serve_app.autoscale:HeadroomPolicy"},
}
TEXT = "a sentence of a dozen words or so, to keep the model busy for a while "
# Exported on their first event only (Ray exports a counter once it was incremented), which a
# CPU replica never has: an OOM split, a cache free by policy, a GPU budget escape; and NVML's
# bytes, which a CPU replica has none of.
FIRST_EVENT_ONLY = {
    "ray_serve_app_oom_recoveries_total",
    "ray_serve_app_cache_frees_total",
    "ray_serve_app_budget_escape_bytes",
    "ray_serve_app_nvml_process_bytes",
}
SCRAPE_TIMEOUT_S = 20.0
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s", re.M)

pytestmark = pytest.mark.filterwarnings("ignore:The `metrics_interval_s`:DeprecationWarning")


@pytest.fixture(scope="module")
def apps(cluster) -> Iterator[tuple[str, str]]:
    opts = {"ray_actor_options": {"num_cpus": 0.5}}
    met, mtmo = cluster.deploy_many(
        App("met", "/met", ARGS, {"autoscaling_config": AUTOSCALING, **opts}),
        App("mtmo", "/mtmo", TIMEOUT_ARGS, opts),
    )
    yield met, mtmo
    cluster.delete("met")
    cluster.delete("mtmo")


def scrape() -> dict[str, list[str]]:
    """Every sample's name on Ray's metrics endpoint, with its label sets."""
    port = os.environ[METRICS_PORT_VAR]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10.0).text
    samples: dict[str, list[str]] = {}
    for name, labels in SAMPLE.findall(text):
        samples.setdefault(name, []).append(labels)
    return samples


def test_every_declared_metric_is_scraped_with_serve_tags(apps) -> None:
    import ray

    met, tmo = apps
    # The port is the pinned one, where Ray binds it.
    assert ray._private.worker.global_worker.node.metrics_export_port == int(
        os.environ[METRICS_PORT_VAR]
    )
    with httpx.Client(timeout=60.0) as client:
        ok = [client.post(f"{met}/v1/embeddings", json={"input": ["hello"] * n}) for n in (1, 4)]
        assert [r.status_code for r in ok] == [200, 200], [r.text for r in ok]

        def burst(_: int) -> int:
            return client.post(f"{met}/v1/embeddings", json={"input": [TEXT * 4] * 8}).status_code

        with ThreadPoolExecutor(max_workers=6) as pool:
            codes = list(pool.map(burst, range(12)))
        assert 503 in codes, codes
        late = client.post(f"{tmo}/v1/embeddings", json={"input": [TEXT * 4] * 8})
        assert late.status_code == 504, late.text

    wanted = set(exported_names()) - FIRST_EVENT_ONLY
    # Earlier tests' applications export some of the same names: wait for this test's samples
    # too, not only for the names.
    labelled = {
        "ray_serve_app_rejections_total": 'reason="queue_full"',
        "ray_serve_app_timeouts_total": 'application="mtmo"',
        "ray_serve_app_autoscale_target_replicas": 'application="met"',
        "ray_serve_app_autoscale_decisions_total": 'application="met"',
    }
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    while True:
        samples = scrape()
        seen = {re.sub(r"_(bucket|sum|count)$", "", n) for n in samples} | set(samples)
        missing = sorted(wanted - seen) + [
            f"{name}{{{label}}}"
            for name, label in labelled.items()
            if label not in " ".join(samples.get(name, []))
        ]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert not missing, f"not on Ray's metrics endpoint after {SCRAPE_TIMEOUT_S:g} s: {missing}"
    # Serve's own tags on a replica's histogram; the reason on an error counter.
    queue = " ".join(samples["ray_serve_app_queue_seconds_count"])
    assert 'application="met"' in queue and "replica=" in queue and "deployment=" in queue, queue
    rejections = " ".join(samples["ray_serve_app_rejections_total"])
    assert 'reason="queue_full"' in rejections, rejections
    timeouts = " ".join(samples["ray_serve_app_timeouts_total"])
    assert 'reason="timeout"' in timeouts and 'application="mtmo"' in timeouts, timeouts
    # The controller's gauges stay on the endpoint between decisions (policy.GAUGE_REFRESH_S).
    assert 'application="met"' in " ".join(samples["ray_serve_app_autoscale_target_replicas"])
    decisions = " ".join(samples["ray_serve_app_autoscale_decisions_total"])
    assert 'application="met"' in decisions and "decision=" in decisions, decisions
