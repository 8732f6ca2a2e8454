"""API keys over real HTTP: a replica whose environment names a key file refuses requests
without a valid key with 401 before any model work; probes and the OpenAPI document stay open."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

KEYS = ("first-key-3b9c", "second-key-77e1")
ARGS = {"adapter": "embeddings", "max_batch_size": 8}
WRONG_KEY_REQUESTS = 20


@pytest.fixture(scope="module")
def keyed(cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    keys_file = tmp_path_factory.mktemp("keys") / "api-keys.txt"
    keys_file.write_text("# serve_app test keys\n" + "\n".join(KEYS) + "\n")
    base = cluster.deploy(
        "keyed",
        "/keyed",
        ARGS,
        ray_actor_options={
            "num_cpus": 0.5,
            # The file's path through the replica's environment: never the key in the config.
            "runtime_env": {"env_vars": {"SERVE_APP_API_KEYS_FILE": str(keys_file)}},
        },
    )
    yield base
    cluster.delete("keyed")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def batches(base: str, replica_id: str) -> int:
    report = httpx.get(f"{base}/v1/memory", headers=bearer(KEYS[0]), timeout=30.0).json()
    return int(next(r["batches"] for r in report["replicas"] if r["replica_id"] == replica_id))


def test_probes_and_the_openapi_document_stay_open(keyed: str) -> None:
    assert httpx.get(f"{keyed}/healthz").status_code == 200
    assert httpx.get(f"{keyed}/readyz").status_code == 200
    spec = httpx.get(f"{keyed}/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert spec["paths"]["/v1/embeddings"]["post"]["security"] == [{"bearerAuth": []}]


@pytest.mark.parametrize("path", ["/v1/models", "/v1/memory"])
def test_read_routes_need_a_key(keyed: str, path: str) -> None:
    resp = httpx.get(f"{keyed}{path}", timeout=30.0)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "missing_api_key"
    assert httpx.get(f"{keyed}{path}", headers=bearer(KEYS[1]), timeout=30.0).status_code == 200


def test_a_wrong_key_costs_no_model_work(keyed: str) -> None:
    url = f"{keyed}/v1/embeddings"
    body = {"input": ["a sentence to embed"]}
    ok = httpx.post(url, json=body, headers=bearer(KEYS[0]), timeout=60.0)
    assert ok.status_code == 200, ok.text
    replica = ok.headers["x-serve-app-replica"]
    before = batches(keyed, replica)
    with httpx.Client(timeout=30.0) as client:
        for i in range(WRONG_KEY_REQUESTS):
            headers = bearer(f"{KEYS[0]}x") if i % 2 else {}
            resp = client.post(url, json=body, headers=headers)
            assert resp.status_code == 401, resp.text
            assert resp.headers["www-authenticate"].startswith("Bearer")
            assert resp.json()["error"]["type"] == "authentication_error"
    assert batches(keyed, replica) == before  # 20 refusals, not one batch
    again = httpx.post(url, json=body, headers=bearer(KEYS[1]), timeout=60.0)
    assert again.status_code == 200
    assert batches(keyed, again.headers["x-serve-app-replica"]) >= 1


def test_a_replica_with_an_empty_key_file_never_serves(cluster, tmp_path) -> None:
    """The KubeRay and `serve deploy` path: an empty Secret mounted as the key file stops the
    replica at start-up (config error naming the variable); the route never answers."""
    from ray import serve

    from serve_app.config.args import parse_args
    from serve_app.serving.replica import ModelServer

    empty = tmp_path / "api-keys.txt"
    empty.write_text("# rotated out, none yet\n")
    opts = {"num_cpus": 0.5, "runtime_env": {"env_vars": {"SERVE_APP_API_KEYS_FILE": str(empty)}}}
    # One start-up, not Serve's three (each a fresh worker of this runtime env, ~5 s here): the
    # same refusal each time.
    app = ModelServer.options(  # type: ignore[attr-defined]
        ray_actor_options=opts, max_constructor_retry_count=1
    ).bind(parse_args(ARGS).model_dump())
    try:
        with pytest.raises(RuntimeError, match="Deploying application emptykeys failed"):
            serve.run(app, name="emptykeys", route_prefix="/emptykeys")
        # Serve keeps the replica's own error in the deployment's status.
        deployment = serve.status().applications["emptykeys"].deployments["model"]
        assert "SERVE_APP_API_KEYS_FILE=" in deployment.message, deployment.message
        assert "holds no key" in deployment.message
        resp = httpx.post(
            f"{cluster.base_url}/emptykeys/v1/embeddings", json={"input": "x"}, timeout=10.0
        )
        assert resp.status_code != 200
    finally:
        serve.delete("emptykeys")


def test_verbose_readiness_needs_a_key(keyed: str) -> None:
    # The plain probe stays open; the deployments' counts are for key holders.
    assert httpx.get(f"{keyed}/readyz", timeout=30.0).json().keys() == {
        "ready",
        "reason",
        "degraded",
    }
    refused = httpx.get(f"{keyed}/readyz?verbose=1", timeout=30.0)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "missing_api_key"
    wrong = httpx.get(f"{keyed}/readyz?verbose=1", headers=bearer("nope"), timeout=30.0)
    assert wrong.status_code == 401
    ok = httpx.get(f"{keyed}/readyz?verbose=1", headers=bearer(KEYS[0]), timeout=30.0)
    assert ok.status_code == 200 and ok.json()["deployments"], ok.text
