"""The one module that reads environment variables."""

from __future__ import annotations

import os
from pathlib import Path

from serve_app.errors import ConfigError

HA_PROXY_VAR = "RAY_SERVE_ENABLE_HA_PROXY"
HAPROXY_CONFIG_DEFAULT = "/tmp/haproxy-serve/haproxy.cfg"  # Ray Serve 2.60's default
HAPROXY_SOCKET_DEFAULT = "/tmp/haproxy-serve/admin.sock"  # Ray Serve 2.60's default
API_KEYS_VAR = "SERVE_APP_API_KEYS"
API_KEYS_FILE_VAR = "SERVE_APP_API_KEYS_FILE"


def get(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def haproxy_config_path() -> str:
    """Where Serve's HAProxy writes its config (RAY_SERVE_HAPROXY_CONFIG_FILE_LOC)."""
    return os.environ.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", HAPROXY_CONFIG_DEFAULT)


def haproxy_socket_path() -> str:
    """Where Serve's HAProxy puts its admin socket (RAY_SERVE_HAPROXY_SOCKET_PATH); Serve adds a
    folder per node below it."""
    return os.environ.get("RAY_SERVE_HAPROXY_SOCKET_PATH", HAPROXY_SOCKET_DEFAULT)


def api_keys() -> list[str]:
    """API keys from SERVE_APP_API_KEYS (comma-separated) and the file SERVE_APP_API_KEYS_FILE
    names (one per line; blank lines and lines starting with # are skipped). Empty: auth off.
    A file that cannot be read is a ConfigError naming the variable."""
    keys = [k.strip() for k in os.environ.get(API_KEYS_VAR, "").split(",") if k.strip()]
    path = os.environ.get(API_KEYS_FILE_VAR)
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"{API_KEYS_FILE_VAR}={path!r} cannot be read ({exc}); point it at a "
                "readable UTF-8 file with one API key per line, or unset it"
            ) from None
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    return keys
