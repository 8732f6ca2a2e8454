"""The one module that reads environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from serve_app.errors import ConfigError

HA_PROXY_VAR = "RAY_SERVE_ENABLE_HA_PROXY"
HAPROXY_CONFIG_DEFAULT = "/tmp/haproxy-serve/haproxy.cfg"  # Ray Serve 2.60's default
HAPROXY_SOCKET_DEFAULT = "/tmp/haproxy-serve/admin.sock"  # Ray Serve 2.60's default
API_KEYS_VAR = "SERVE_APP_API_KEYS"
API_KEYS_FILE_VAR = "SERVE_APP_API_KEYS_FILE"
FAKE_NVML_VAR = "SERVE_APP_FAKE_NVML"
"""Test doubles: path of a JSON script that stands in for NVML (serve_app.testing.nvml)."""
FAULT_HOOKS_VAR = "SERVE_APP_FAULT_HOOKS"
"""Test doubles: ``1`` mounts a replica's fault hooks (serve_app.testing.faults)."""
TEST_DOUBLE_VARS = (FAKE_NVML_VAR, FAULT_HOOKS_VAR)
ALLOW_TEST_DOUBLES_VAR = "SERVE_APP_ALLOW_TEST_DOUBLES"
"""``1`` where a deploy file is checked lets its runtime_env set a TEST_DOUBLE_VARS variable."""
HF_HUB_OFFLINE_VAR = "HF_HUB_OFFLINE"


def get(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


@dataclass(frozen=True)
class Doubles:
    """Which test doubles this process runs with: the one switch production code asks before it
    imports anything from serve_app.testing. Both are off unless a test sets them.

    Attributes:
        nvml_script: the NVML script that replaces the driver's readings (SERVE_APP_FAKE_NVML),
            or None.
        fault_hooks: whether replicas serve ``POST /v1/_faults`` (SERVE_APP_FAULT_HOOKS=1).
    """

    nvml_script: str | None
    fault_hooks: bool


def doubles() -> Doubles:
    """The test doubles switched on in this process's environment."""
    return Doubles(
        nvml_script=os.environ.get(FAKE_NVML_VAR) or None,
        fault_hooks=os.environ.get(FAULT_HOOKS_VAR) == "1",
    )


def doubles_allowed() -> bool:
    """Whether this process may accept deploy files that switch test doubles on
    (SERVE_APP_ALLOW_TEST_DOUBLES=1): test suites set it, production never does."""
    return os.environ.get(ALLOW_TEST_DOUBLES_VAR) == "1"


def models_offline() -> None:
    """Keep transformers and huggingface_hub off the network: serve_app loads models from local
    directories only, and a hub call that times out costs a replica's start seconds.
    ``HF_HUB_OFFLINE=0`` in the environment wins."""
    os.environ.setdefault(HF_HUB_OFFLINE_VAR, "1")


def haproxy_config_path() -> str:
    """Where Serve's HAProxy writes its config (RAY_SERVE_HAPROXY_CONFIG_FILE_LOC)."""
    return os.environ.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", HAPROXY_CONFIG_DEFAULT)


def haproxy_socket_path() -> str:
    """Where Serve's HAProxy puts its admin socket (RAY_SERVE_HAPROXY_SOCKET_PATH); Serve adds a
    folder per node below it."""
    return os.environ.get("RAY_SERVE_HAPROXY_SOCKET_PATH", HAPROXY_SOCKET_DEFAULT)


def api_keys() -> list[str]:
    """API keys from SERVE_APP_API_KEYS (comma-separated) and the file SERVE_APP_API_KEYS_FILE
    names (one per line; blank lines and lines starting with # are skipped). Neither set: no
    keys, auth off. A variable that is set but yields no key (empty, blanks, comments only) is a
    ConfigError naming it, as is a file that cannot be read: a key source that was meant to
    close the endpoint must never leave it open."""
    keys: list[str] = []
    if API_KEYS_VAR in os.environ:
        from_var = [k.strip() for k in os.environ[API_KEYS_VAR].split(",") if k.strip()]
        if not from_var:
            raise ConfigError(
                f"{API_KEYS_VAR} is set but holds no key ({os.environ[API_KEYS_VAR]!r}); set "
                "it to comma-separated keys, or unset it to serve without keys"
            )
        keys.extend(from_var)
    path = os.environ.get(API_KEYS_FILE_VAR)
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"{API_KEYS_FILE_VAR}={path!r} cannot be read ({exc}); point it at a "
                "readable UTF-8 file with one API key per line, or unset it"
            ) from None
        from_file = [
            line.strip()
            for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")
        ]
        if not from_file:
            raise ConfigError(
                f"{API_KEYS_FILE_VAR}={path!r} holds no key (empty, or only blank and # lines); "
                "put one API key per line in it, or unset it to serve without keys"
            )
        keys.extend(from_file)
    return keys


def api_keys_file_warning() -> str | None:
    """A warning when the file SERVE_APP_API_KEYS_FILE names can be read by its group or by
    other users (mode bits 0o044); None when it cannot, or no file is named."""
    path = os.environ.get(API_KEYS_FILE_VAR)
    if not path:
        return None
    try:
        mode = Path(path).stat().st_mode
    except OSError:
        return None  # api_keys() names the problem
    if not mode & 0o044:
        return None
    return (
        f"WARNING: the API key file {API_KEYS_FILE_VAR}={path!r} is readable by "
        f"{'other users' if mode & 0o004 else 'its group'} (mode {mode & 0o777:o}); "
        f"anyone who reads it holds a key: chmod 600 {path}"
    )
