"""serving.auth: keys from the environment, constant-time checks, 401 before any handler."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from serve_app import env
from serve_app.adapters.embeddings import build
from serve_app.config.args import parse_args
from serve_app.errors import ConfigError
from serve_app.serving import auth
from serve_app.serving.auth import ApiKeys, bearer_token, protected_paths
from serve_app.serving.http import Ingress, json_response
from serve_app.serving.openapi import BEARER, build_openapi


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(env.API_KEYS_VAR, raising=False)
    monkeypatch.delenv(env.API_KEYS_FILE_VAR, raising=False)
    return monkeypatch


def test_keys_from_the_variable_and_the_file(no_keys, tmp_path: Path) -> None:
    assert env.api_keys() == []
    no_keys.setenv(env.API_KEYS_VAR, " alpha , ,beta,")
    assert env.api_keys() == ["alpha", "beta"]
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("# rotated 2026-11\ngamma\n\n  delta  \n")
    no_keys.setenv(env.API_KEYS_FILE_VAR, str(keys_file))
    assert env.api_keys() == ["alpha", "beta", "gamma", "delta"]


def test_an_unreadable_key_file_fails_naming_the_variable(no_keys, tmp_path: Path) -> None:
    no_keys.setenv(env.API_KEYS_FILE_VAR, str(tmp_path / "missing.txt"))
    with pytest.raises(ConfigError, match="SERVE_APP_API_KEYS_FILE=.*cannot be read"):
        env.api_keys()


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        (b"", None),
        (b"Bearer abc", b"abc"),
        (b"bearer   abc  ", b"abc"),
        (b"BEARER abc", b"abc"),
        (b"Basic YWJjOmRlZg==", None),
        (b"Bearer", None),
        (b"Bearer ", None),
        (b"abc", None),
    ],
)
def test_bearer_token(header: bytes | None, token: bytes | None) -> None:
    assert bearer_token(header) == token


def test_every_key_is_compared_whatever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = auth.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    keys = ApiKeys(["k1", "k2", "k3"])
    assert keys.valid(b"k1") and keys.valid(b"k3") and not keys.valid(b"k4")
    assert len(calls) == 9  # three keys, three checks: no early exit on a match
    assert not keys.valid(b"k1x") and not keys.valid(b"") and not keys.valid(None)
    assert ApiKeys(["\u00e9t\u00e9"]).valid("\u00e9t\u00e9".encode())  # any UTF-8 key
    assert not ApiKeys([]).enabled and not ApiKeys([]).valid(b"anything")


class Counting:
    """A handler that counts its calls: a refused request must never reach it."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, request: Request) -> Response:
        self.calls += 1
        return json_response({"ok": True})


def _client(app: Ingress) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.mark.anyio
async def test_a_missing_or_wrong_key_is_a_401_before_the_handler_runs() -> None:
    model = Counting()
    open_route = Counting()
    app = Ingress(
        {"/v1/embeddings": {"POST": model}, "/healthz": {"GET": open_route}},
        ApiKeys(["right-key", "second-key"]),
        protected_paths(["/v1/embeddings"]),
    )
    async with _client(app) as client:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "right-key"}):
            resp = await client.post("/v1/embeddings", json={"input": "x"}, headers=headers)
            assert resp.status_code == 401, headers
            assert resp.headers["www-authenticate"] == 'Bearer realm="serve_app"'
            assert resp.json()["error"]["type"] == "authentication_error"
        # Auth comes before the method check too: no route information without a key.
        assert (await client.get("/v1/embeddings")).status_code == 401
        assert model.calls == 0
        for key in ("right-key", "second-key"):
            ok = await client.post(
                "/v1/embeddings", json={}, headers={"Authorization": f"Bearer {key}"}
            )
            assert ok.status_code == 200
        assert model.calls == 2
        assert (await client.get("/healthz")).status_code == 200  # probes stay open
        assert (await client.get("/nothing")).status_code == 404


@pytest.mark.anyio
async def test_no_keys_means_auth_off() -> None:
    model = Counting()
    app = Ingress({"/v1/embeddings": {"POST": model}}, ApiKeys([]))
    async with _client(app) as client:
        assert (await client.post("/v1/embeddings", json={})).status_code == 200
    assert model.calls == 1


def test_protected_paths_are_every_inference_route_and_the_reports() -> None:
    assert protected_paths(["/v1/a", "/v1/b"]) == {"/v1/a", "/v1/b", "/v1/memory", "/v1/models"}


def test_openapi_names_the_bearer_scheme_only_when_keys_are_on() -> None:
    operation = build(parse_args({})).spec.openapi(1024)
    off = build_openapi("/v1/embeddings", operation, "m")
    assert "securitySchemes" not in off["components"]
    assert "security" not in off["paths"]["/v1/embeddings"]["post"]
    on = build_openapi(
        "/v1/embeddings", operation, "m", protected=protected_paths(["/v1/embeddings"])
    )
    assert on["components"]["securitySchemes"][BEARER] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key from SERVE_APP_API_KEYS or SERVE_APP_API_KEYS_FILE",
    }
    for path in ("/v1/embeddings", "/v1/models", "/v1/memory"):
        for op in on["paths"][path].values():
            assert op["security"] == [{BEARER: []}] and "401" in op["responses"], path
    for path in ("/healthz", "/readyz"):
        assert "security" not in on["paths"][path]["get"], path


@pytest.mark.parametrize("value", ["", "   ", " , ,", ","])
def test_a_set_key_variable_with_no_key_fails_closed(no_keys, value: str) -> None:
    no_keys.setenv(env.API_KEYS_VAR, value)
    with pytest.raises(ConfigError, match="^SERVE_APP_API_KEYS is set but holds no key"):
        env.api_keys()


@pytest.mark.parametrize("text", ["", "\n\n", "   \n\t\n", "# keys rotated\n  # none yet\n"])
def test_a_key_file_with_no_key_fails_closed(no_keys, tmp_path: Path, text: str) -> None:
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(text)
    no_keys.setenv(env.API_KEYS_FILE_VAR, str(keys_file))
    with pytest.raises(ConfigError, match="^SERVE_APP_API_KEYS_FILE=.* holds no key"):
        env.api_keys()
    # Keys in the other variable do not excuse an empty file: each set variable must yield one.
    no_keys.setenv(env.API_KEYS_VAR, "alpha")
    with pytest.raises(ConfigError, match="SERVE_APP_API_KEYS_FILE"):
        env.api_keys()
    # Nor does a file with keys excuse an empty variable.
    keys_file.write_text("gamma\n")
    no_keys.setenv(env.API_KEYS_VAR, "")
    with pytest.raises(ConfigError, match="^SERVE_APP_API_KEYS is set"):
        env.api_keys()


def test_an_empty_key_file_variable_fails_closed(no_keys) -> None:
    no_keys.setenv(env.API_KEYS_FILE_VAR, "")
    with pytest.raises(ConfigError, match="SERVE_APP_API_KEYS_FILE=''"):
        env.api_keys()


@pytest.mark.parametrize(
    ("mode", "words"), [(0o600, None), (0o400, None), (0o640, "its group"), (0o644, "other users")]
)
def test_a_key_file_others_can_read_gets_a_warning(
    no_keys, tmp_path: Path, mode: int, words: str | None
) -> None:
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("alpha\n")
    keys_file.chmod(mode)
    assert env.api_keys_file_warning() is None  # no file named
    no_keys.setenv(env.API_KEYS_FILE_VAR, str(keys_file))
    warning = env.api_keys_file_warning()
    if words is None:
        assert warning is None
    else:
        assert warning is not None and words in warning
        assert f"{mode:o}" in warning and f"chmod 600 {keys_file}" in warning


def test_the_replica_loads_keys_and_logs_the_warning(
    no_keys, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("alpha\n")
    keys_file.chmod(0o644)
    no_keys.setenv(env.API_KEYS_FILE_VAR, str(keys_file))
    with caplog.at_level("WARNING", logger="serve_app"):
        keys = auth.load_api_keys()
    assert keys.enabled and keys.valid(b"alpha")
    assert "readable by other users" in caplog.text
    keys_file.write_text("# no keys left\n")
    with pytest.raises(ConfigError, match="SERVE_APP_API_KEYS_FILE"):
        auth.load_api_keys()
