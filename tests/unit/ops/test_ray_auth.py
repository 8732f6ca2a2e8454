"""ops.ray_auth: token auth is always on unless the insecure flag says otherwise, and the token
is found where Ray looks for it, or written 0600 where Ray looks last."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from serve_app.errors import StartupError
from serve_app.ops import ray_auth


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_disabled_is_refused_naming_the_flag(home: Path) -> None:
    environ = {"RAY_AUTH_MODE": "disabled"}
    with pytest.raises(StartupError) as err:
        ray_auth.setup_token_auth(environ)
    assert "RAY_AUTH_MODE=disabled" in err.value.message
    assert "--insecure-no-ray-auth" in err.value.message
    assert environ["RAY_AUTH_MODE"] == "disabled" and not (home / ".ray").exists()


def test_an_unknown_mode_is_refused(home: Path) -> None:
    with pytest.raises(StartupError, match="'k8s' is not a mode"):
        ray_auth.setup_token_auth({"RAY_AUTH_MODE": "k8s"})


def test_the_insecure_flag_turns_auth_off_and_warns(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    environ: dict[str, str] = {}
    with caplog.at_level("WARNING", logger="serve_app"):
        auth = ray_auth.setup_token_auth(environ, insecure=True)
    assert environ["RAY_AUTH_MODE"] == "disabled" and not auth.enabled
    assert "OFF" in auth.note and auth.warnings and "CVE-2023-48022" in auth.warnings[0]
    assert "CVE-2023-48022" in caplog.text  # logged now, not only printed at the end


def test_a_token_in_the_environment_is_used_as_it_is(home: Path) -> None:
    environ = {"RAY_AUTH_TOKEN": "abc"}
    auth = ray_auth.setup_token_auth(environ)
    assert environ == {"RAY_AUTH_TOKEN": "abc", "RAY_AUTH_MODE": "token"}
    assert auth.enabled and "the RAY_AUTH_TOKEN variable" in auth.note
    assert not (home / ".ray").exists()


def test_with_no_token_one_is_written_0600_in_rays_default_place(home: Path) -> None:
    environ: dict[str, str] = {}
    auth = ray_auth.setup_token_auth(environ)
    path = home / ".ray" / "auth_token"
    assert len(path.read_text()) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert str(path) in auth.note and "written now (0600)" in auth.note
    token = path.read_text()
    again = ray_auth.setup_token_auth({})  # the next run reads it, and writes nothing
    assert path.read_text() == token and "written now" not in again.note and not again.warnings


def test_a_worker_with_no_token_is_told_to_bring_the_heads(home: Path) -> None:
    with pytest.raises(StartupError, match="ray get-auth-token"):
        ray_auth.setup_token_auth({}, create=False)
    assert not (home / ".ray" / "auth_token").exists()


def test_a_named_token_file_must_hold_a_token(home: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(StartupError, match="cannot be read"):
        ray_auth.setup_token_auth({"RAY_AUTH_TOKEN_PATH": str(missing)})
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(StartupError, match="is empty"):
        ray_auth.setup_token_auth({"RAY_AUTH_TOKEN_PATH": str(empty)})


def test_a_token_file_others_can_read_is_warned_about(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc")
    path.chmod(0o644)
    auth = ray_auth.setup_token_auth({"RAY_AUTH_TOKEN_PATH": str(path)})
    assert auth.enabled and len(auth.warnings) == 1 and f"chmod 600 {path}" in auth.warnings[0]
    path.chmod(0o600)
    assert ray_auth.setup_token_auth({"RAY_AUTH_TOKEN_PATH": str(path)}).warnings == []


def test_write_token_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_text("mine")
    with pytest.raises(FileExistsError):
        ray_auth.write_token(path)
    assert path.read_text() == "mine"
