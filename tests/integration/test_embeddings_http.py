"""The embeddings API over real HTTP on a real local Ray Serve cluster (HAProxy ingress)."""

from __future__ import annotations

import base64
import gzip
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.helpers import wait_for

MODEL = "all-MiniLM-L6-v2"
ARGS = {
    "adapter": "embeddings",
    "max_batch_size": 16,
    "batch_wait_timeout_s": 0.05,
    "max_inputs_per_request": 8,
    "max_body_bytes": 65536,
}


@pytest.fixture(scope="module")
def emb(cluster) -> Iterator[str]:
    base = cluster.deploy(
        "emb", "/emb", ARGS, ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=256
    )
    yield base
    cluster.delete("emb")


def embed(base: str, inputs, **extra) -> httpx.Response:
    return httpx.post(f"{base}/v1/embeddings", json={"input": inputs, "model": MODEL, **extra})


def vectors(resp: httpx.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    data = sorted(resp.json()["data"], key=lambda d: d["index"])
    return np.array([d["embedding"] for d in data], dtype=np.float32)


def test_shape_and_unit_norm(emb: str) -> None:
    resp = embed(emb, ["The cat sat on the mat.", "Hello there"])
    body = resp.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    vecs = vectors(resp)
    assert vecs.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert resp.headers["x-serve-app-replica"]


def test_paraphrase_closer_than_unrelated(emb: str) -> None:
    a, b, c = vectors(
        embed(
            emb,
            [
                "A man is playing a guitar on stage.",
                "Someone performs music with a guitar in front of an audience.",
                "The quarterly tax report is due next Tuesday.",
            ],
        )
    )
    assert float(a @ b) > float(a @ c) + 0.3, (float(a @ b), float(a @ c))


def test_batch_and_single_agree(emb: str) -> None:
    texts = ["short", "a somewhat longer sentence about the weather today", "third one"]
    batch = vectors(embed(emb, texts))
    singles = np.stack([vectors(embed(emb, t))[0] for t in texts])
    np.testing.assert_allclose(batch, singles, atol=1e-5)


def test_base64_encoding_matches_float(emb: str) -> None:
    floats = vectors(embed(emb, ["encode me"]))[0]
    resp = embed(emb, ["encode me"], encoding_format="base64")
    assert resp.status_code == 200
    raw = base64.b64decode(resp.json()["data"][0]["embedding"])
    np.testing.assert_allclose(np.frombuffer(raw, dtype="<f4"), floats, atol=1e-6)


def test_openai_client(emb: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{emb}/v1", api_key="unused", max_retries=0)
    out = client.embeddings.create(model=MODEL, input=["hello world", "goodbye"])
    assert len(out.data) == 2 and len(out.data[0].embedding) == 384
    expected = vectors(embed(emb, ["hello world"]))[0]
    np.testing.assert_allclose(np.array(out.data[0].embedding), expected, atol=1e-5)


@pytest.mark.parametrize(
    ("content", "status", "needle"),
    [
        (b'{"input": ', 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"model": "all-MiniLM-L6-v2"}', 400, "'input' is required"),
        (b'{"input": 42}', 400, "string or a list of strings"),
        (b'{"input": ["ok", 7]}', 400, "'input[1]' must be a string"),
        (b'{"input": [[101, 7592, 102]]}', 400, "holds token ids"),
        (b'{"input": []}', 400, "must not be an empty list"),
        (b'{"input": "x", "model": "gpt-4"}', 404, "'gpt-4' is not served here"),
        (b'{"input": ["a","b","c","d","e","f","g","h","i"]}', 400, "at most 8 per request"),
        (b'{"input": "x", "encoding_format": "int8"}', 400, "encoding_format"),
    ],
)
def test_bad_input_gets_json_error(emb: str, content: bytes, status: int, needle: str) -> None:
    resp = httpx.post(
        f"{emb}/v1/embeddings", content=content, headers={"content-type": "application/json"}
    )
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert needle in err["message"], err
    assert err["type"]


def test_a_gzipped_body_is_415_naming_the_coding(emb: str) -> None:
    resp = httpx.post(
        f"{emb}/v1/embeddings",
        content=gzip.compress(b'{"input": "hi"}'),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert resp.status_code == 415, resp.text
    assert resp.headers["accept-encoding"] == "identity"
    assert resp.json()["error"]["code"] == "unsupported_content_encoding"


def test_too_long_input_is_400_not_truncated(emb: str) -> None:
    resp = embed(emb, ["word " * 400])
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["code"] == "input_too_long" and "at most 256" in err["message"]


def test_an_over_long_input_fails_alone_among_requests_batched_with_it(emb: str) -> None:
    # tokenizing is the batch's (one encode_batch in the model thread): the request with a
    # text over 256 tokens gets its 400 naming it, the ones sent with it their vectors
    good = [[f"request {i} sentence {j}" for j in range(4)] for i in range(12)]
    bad = ["fine", "also fine", "word " * 400]
    with httpx.Client(timeout=60.0) as client, ThreadPoolExecutor(max_workers=13) as pool:
        post = lambda texts: client.post(  # noqa: E731
            f"{emb}/v1/embeddings", json={"input": texts, "model": MODEL}
        )
        resps = list(pool.map(post, [*good[:6], bad, *good[6:]]))
    err = resps[6].json()["error"]
    assert resps[6].status_code == 400 and err["param"] == "input[2]", resps[6].text
    assert err["code"] == "input_too_long" and "is 402 tokens" in err["message"], err
    for texts, resp in zip(good, resps[:6] + resps[7:], strict=True):
        np.testing.assert_allclose(vectors(resp), vectors(embed(emb, texts)), atol=1e-5)


def test_text_past_the_character_bound_is_400_before_tokenizing(emb: str) -> None:
    # 20,000 characters, a token each: past 256 tokens x 32 characters, refused uncounted
    resp = embed(emb, ["ok", "!" * 20_000])
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert (err["code"], err["param"]) == ("input_too_long", "input[1]")
    assert "at most 8192 characters" in err["message"], err


def test_body_over_limit_is_413(emb: str) -> None:
    resp = embed(emb, ["x" * 70000])
    assert resp.status_code == 413
    assert "args.max_body_bytes" in resp.json()["error"]["message"]


def test_unknown_route_and_method(emb: str) -> None:
    resp = httpx.get(f"{emb}/v1/nothing")
    assert resp.status_code == 404 and "error" in resp.json()
    resp = httpx.get(f"{emb}/v1/embeddings")
    assert resp.status_code == 405 and "error" in resp.json()
    resp = httpx.post(
        f"{emb}/v1/classify", content=b"\xff\xd8", headers={"content-type": "image/jpeg"}
    )
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "route_not_served"
    # The test-only fault hooks exist only where SERVE_APP_FAULT_HOOKS=1 (serve_app/faults.py).
    resp = httpx.post(f"{emb}/v1/_faults", json={"kind": "raw_alloc", "bytes": 1 << 30})
    assert resp.status_code == 404 and "error" in resp.json()


def test_models_health_ready_openapi(emb: str) -> None:
    models = httpx.get(f"{emb}/v1/models").json()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["dimensions"] == 384
    assert httpx.get(f"{emb}/healthz").status_code == 200
    ready = httpx.get(f"{emb}/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    spec = httpx.get(f"{emb}/openapi.json").json()
    assert "/v1/embeddings" in spec["paths"] and "/v1/memory" in spec["paths"]
    assert not [p for p in spec["paths"] if "fault" in p]


def test_concurrent_requests_are_batched(emb: str) -> None:
    texts = [f"sentence number {i} about batching" for i in range(100)]
    with httpx.Client(timeout=60.0) as client, ThreadPoolExecutor(max_workers=50) as pool:
        resps = list(
            pool.map(
                lambda t: client.post(f"{emb}/v1/embeddings", json={"input": t, "model": MODEL}),
                texts,
            )
        )
    assert [r.status_code for r in resps] == [200] * 100
    # Replicas report every second (serving/report.REPORT_PERIOD_S): the one read right after
    # the load may have been taken during it, items still queued; wait for one after it.
    mine = wait_for(
        "a report taken after the load",
        lambda: [r for r in httpx.get(f"{emb}/v1/memory").json()["replicas"] if r["app"] == MODEL],
        lambda reps: bool(reps) and all(r["queued_items"] == 0 for r in reps),
        10.0,
    )
    assert mine and max(r["largest_batch"] for r in mine) > 1, mine
    for r in mine:
        # the model worker's busy time is counted; nothing is left queued
        assert r["batch_busy_s"] > 0 and r["queued_items"] == 0, r
        # Ray Serve froze the start-up heap (RAY_SERVE_FREEZE_GC_ON_STARTUP); pauses counted
        assert r["gc"]["frozen_objects"] > 10_000 and sum(r["gc"]["collections"]) > 0, r["gc"]
    # Bad input never took the replica down: it still serves.
    assert embed(emb, "still alive").status_code == 200


def test_memory_figures_are_ray_metrics(emb: str) -> None:
    import time

    from serve_app.startup import ray_compat

    port = ray_compat.metrics_export_port()
    deadline = time.monotonic() + 60.0
    text = ""
    while time.monotonic() < deadline:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text
        except httpx.HTTPError:
            text = ""
        lines = [ln for ln in text.splitlines() if ln.startswith("ray_serve_app_max_batch_size")]
        # Wait for this app's replica: an earlier module's replica (deleted, its gauge still
        # exported for a while) can be the first one listed.
        if any(ln.rstrip().endswith(" 16.0") for ln in lines):
            break
        time.sleep(1.0)
    lines = [ln for ln in text.splitlines() if ln.startswith("ray_serve_app_max_batch_size")]
    assert lines, text[-2000:]
    assert any(ln.rstrip().endswith(" 16.0") for ln in lines), lines


def test_replicas_run_user_code_on_serves_own_loop(emb: str) -> None:
    """launch.start_ray sets RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0 before Ray starts, so
    every Ray process (replicas included) reads it; the replica still serves concurrently."""
    import ray

    from serve_app.ops.cluster_env import SAME_THREAD_VAR

    @ray.remote(num_cpus=0)
    def read_env() -> str | None:
        import os

        return os.environ.get(SAME_THREAD_VAR)

    assert ray.get(read_env.remote()) == "0"
    with httpx.Client(timeout=60.0) as client, ThreadPoolExecutor(max_workers=20) as pool:
        codes = list(
            pool.map(
                lambda i: (
                    client.post(
                        f"{emb}/v1/embeddings", json={"input": f"loop {i}", "model": MODEL}
                    ).status_code
                ),
                range(40),
            )
        )
    assert codes == [200] * 40


def test_proxy_statuses_reads_serves_own(emb: str) -> None:
    from serve_app.startup import ray_compat

    statuses = ray_compat.proxy_statuses()
    assert statuses and set(statuses.values()) == {"HEALTHY"}, statuses
