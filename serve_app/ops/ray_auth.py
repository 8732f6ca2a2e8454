"""Ray's token authentication for every Ray node serve_app starts (``serve-app run``,
``serve-app node``): an exposed Ray dashboard or job API is remote code execution (ShadowRay,
CVE-2023-48022), so Ray runs with ``RAY_AUTH_MODE=token`` unless the user says otherwise with
an explicit, loudly logged flag.

Ray 2.60 reads the token from ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH``
names, else ``~/.ray/auth_token`` (its C++ AuthenticationTokenLoader; the Python side:
ray/_private/authentication/authentication_token_setup.py). When none exists, ``ray.init``
writes one with the process's umask (often world-readable); serve_app writes it first, 0600.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from serve_app.errors import StartupError

__all__ = [
    "AUTH_MODE_VAR",
    "INSECURE_FLAG",
    "TOKEN_PATH_VAR",
    "TOKEN_VAR",
    "RayAuth",
    "default_token_path",
    "setup_token_auth",
    "write_token",
]

logger = logging.getLogger("serve_app")

AUTH_MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"
INSECURE_FLAG = "--insecure-no-ray-auth"
SECURITY_DOC = 'docs/security.md, section "Ray\'s control plane"'


@dataclass(frozen=True)
class RayAuth:
    """How Ray's control plane is protected: ``enabled`` (token auth), where the token comes
    from (``source``), the note serve-app prints, and warnings to print loudly."""

    enabled: bool
    source: str
    note: str
    warnings: list[str] = field(default_factory=list)


def default_token_path() -> Path:
    """Ray's default token file, ``~/.ray/auth_token``."""
    return Path.home() / ".ray" / "auth_token"


def write_token(path: Path) -> None:
    """A new random token (256 bits, as Ray's own generator) in ``path``, created 0600 in a
    directory created 0700; never overwrites a file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))


def _readable_by_others(path: Path) -> bool:
    return bool(path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def _token_file(path: Path, named_by: str) -> tuple[str, list[str]]:
    """The source line and warnings for a token file that must exist and hold a token."""
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise StartupError(
            f"{named_by} names {str(path)!r}, which cannot be read ({exc.strerror}): point it "
            "at the cluster's token file, or unset it"
        ) from None
    if not text:
        raise StartupError(
            f"{named_by} names {str(path)!r}, which is empty: Ray would run without a token. "
            f"Put the cluster's token in it (`ray get-auth-token` on the head prints it)"
        )
    warnings = []
    if _readable_by_others(path):
        warnings.append(
            f"WARNING: Ray's token file {path} can be read by other users, who can then run "
            f"code on this Ray cluster: `chmod 600 {path}`"
        )
    return f"the file {path} ({named_by})", warnings


def _insecure() -> RayAuth:
    warning = (
        f"WARNING: Ray's token authentication is OFF ({INSECURE_FLAG}, "
        f"{AUTH_MODE_VAR}=disabled). Anyone who can reach Ray's ports, every user of this "
        "machine at least, can submit jobs and run code as this user (ShadowRay, "
        f"CVE-2023-48022). Use it only on a machine you alone use; see {SECURITY_DOC}."
    )
    logger.warning(warning)
    note = f"Ray: token authentication OFF ({INSECURE_FLAG})."
    return RayAuth(enabled=False, source="", note=note, warnings=[warning])


def setup_token_auth(
    environ: MutableMapping[str, str], *, insecure: bool = False, create: bool = True
) -> RayAuth:
    """Set ``RAY_AUTH_MODE=token`` in ``environ`` and make sure Ray finds a token, as Ray
    reads it: ``RAY_AUTH_TOKEN``, else ``RAY_AUTH_TOKEN_PATH``'s file, else
    ``~/.ray/auth_token``, written now (0600) when ``create`` and none exists. ``insecure``
    turns auth off instead (``RAY_AUTH_MODE=disabled``), with a warning logged now.

    Raises:
        StartupError: ``RAY_AUTH_MODE=disabled`` (or another value) without ``insecure``; a
            token file that is named but unreadable or empty; no token and not ``create``
            (joining a cluster needs the head's token).
    """
    mode = environ.get(AUTH_MODE_VAR, "").strip().lower()
    if insecure:
        environ[AUTH_MODE_VAR] = "disabled"
        return _insecure()
    if mode == "disabled":
        raise StartupError(
            f"{AUTH_MODE_VAR}=disabled turns off Ray's token authentication, and then anyone "
            "who can reach Ray's ports can run code on this machine (ShadowRay, "
            f"CVE-2023-48022). Unset it (serve-app then uses a token), or, on a machine only "
            f"you use, pass {INSECURE_FLAG}; see {SECURITY_DOC}"
        )
    if mode not in ("", "token"):
        raise StartupError(
            f"{AUTH_MODE_VAR}={environ[AUTH_MODE_VAR]!r} is not a mode serve-app knows: unset "
            "it or set it to token"
        )
    environ[AUTH_MODE_VAR] = "token"
    warnings: list[str] = []
    if environ.get(TOKEN_VAR, "").strip():
        source = f"the {TOKEN_VAR} variable"
    elif environ.get(TOKEN_PATH_VAR):
        source, warnings = _token_file(Path(environ[TOKEN_PATH_VAR]), TOKEN_PATH_VAR)
    else:
        path = default_token_path()
        if path.exists():
            source, warnings = _token_file(path, "Ray's default token file")
        elif create:
            write_token(path)
            source = f"the file {path}, written now (0600)"
        else:
            raise StartupError(
                f"no Ray token: joining a cluster needs its head's token (`ray get-auth-token` "
                f"on the head prints it), in {path} (0600), or in a file named by "
                f"{TOKEN_PATH_VAR}, or in {TOKEN_VAR}"
            )
    for warning in warnings:
        logger.warning(warning)
    note = (
        f"Ray: token authentication on ({AUTH_MODE_VAR}=token); the token is read from "
        f"{source}. Ray's CLI, `ray.init` and the dashboard need the same token."
    )
    return RayAuth(enabled=True, source=source, note=note, warnings=warnings)
