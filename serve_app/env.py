"""The one module that reads environment variables."""

from __future__ import annotations

import os

HA_PROXY_VAR = "RAY_SERVE_ENABLE_HA_PROXY"
HAPROXY_CONFIG_DEFAULT = "/tmp/haproxy-serve/haproxy.cfg"  # Ray Serve 2.60's default
HAPROXY_SOCKET_DEFAULT = "/tmp/haproxy-serve/admin.sock"  # Ray Serve 2.60's default


def get(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def haproxy_config_path() -> str:
    """Where Serve's HAProxy writes its config (RAY_SERVE_HAPROXY_CONFIG_FILE_LOC)."""
    return os.environ.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", HAPROXY_CONFIG_DEFAULT)


def haproxy_socket_path() -> str:
    """Where Serve's HAProxy puts its admin socket (RAY_SERVE_HAPROXY_SOCKET_PATH); Serve adds a
    folder per node below it."""
    return os.environ.get("RAY_SERVE_HAPROXY_SOCKET_PATH", HAPROXY_SOCKET_DEFAULT)
