"""Four replicas at num_gpus 0.25 share one logical GPU and all four serve."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx


def test_four_replicas_on_one_logical_gpu(cluster) -> None:
    base = cluster.deploy(
        "four",
        "/four",
        {"adapter": "embeddings", "max_batch_size": 8, "batch_wait_timeout_s": 0.002},
        num_replicas=4,
        ray_actor_options={"num_gpus": 0.25, "num_cpus": 0.25},
    )
    try:
        import ray

        assert ray.cluster_resources().get("GPU") == 1.0
        seen: set[str] = set()
        with httpx.Client(timeout=60.0) as client, ThreadPoolExecutor(max_workers=16) as pool:
            for _ in range(5):
                resps = list(
                    pool.map(
                        lambda i: client.post(
                            f"{base}/v1/embeddings", json={"input": f"request {i}"}
                        ),
                        range(64),
                    )
                )
                assert all(r.status_code == 200 for r in resps), [r.text for r in resps][:3]
                seen |= {r.headers["x-serve-app-replica"] for r in resps}
                if len(seen) == 4:
                    break
        assert len(seen) == 4, seen
        # each replica pushes its report every REPORT_PERIOD_S: one may lag its first answer
        deadline = time.monotonic() + 10.0
        while True:
            report = httpx.get(f"{base}/v1/memory").json()["replicas"]
            ours = [r for r in report if r["replica_id"] in seen]
            if len(ours) == 4 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(ours) == 4 and all(r["num_gpus"] == 0.25 for r in ours), ours
        assert ray.available_resources().get("GPU", 0.0) == 0.0
    finally:
        cluster.delete("four")
