"""What ``serve-app run`` says about who can reach it: the HTTP endpoint without an API key,
and Ray's listeners beyond loopback, with or without Ray's token (docs/security.md)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence

from serve_app import env
from serve_app.ops import listeners, ray_auth

__all__ = [
    "exposure_warning",
    "is_loopback",
    "ray_exposure_note",
    "ray_listeners_beyond_loopback",
]


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name or 0.0.0.0-like wildcard: assume it is reachable from outside


def exposure_warning(
    host: str,
    keys_configured: bool,
    *,
    ray_auth_enabled: bool = True,
    ray_listeners: Sequence[listeners.Listener] = (),
) -> str | None:
    """The warning `serve-app run` prints when it would serve beyond this machine with no API
    key, or when Ray listens beyond loopback (``ray_listeners``) with its token authentication
    off; None when neither (ray_exposure_note says what listens beyond loopback behind the
    token)."""
    parts = []
    if not (is_loopback(host) or keys_configured):
        parts.append(
            f"WARNING: http_options.host is {host!r}, reachable from other machines, and no API "
            f"key is configured: anyone who can reach it can run inference and read /v1/memory. "
            f"Set {env.API_KEYS_VAR} (comma-separated) or {env.API_KEYS_FILE_VAR} (one per line) "
            "before starting, or bind 127.0.0.1."
        )
    if ray_listeners and not ray_auth_enabled:
        where = ", ".join(item.describe() for item in ray_listeners)
        parts.append(
            f"WARNING: Ray listens beyond loopback on {where}, and its token authentication is "
            "OFF: anyone who can reach them can run code on this machine. Close them with the "
            f"host firewall rule in {ray_auth.SECURITY_DOC}."
        )
    return "\n".join(parts) or None


def ray_exposure_note(ray_listeners: Sequence[listeners.Listener]) -> str | None:
    """The note for Ray's listeners beyond loopback behind its token (Serve binds each replica's
    inter-deployment gRPC server to every interface, ray/serve/_private/replica.py)."""
    if not ray_listeners:
        return None
    where = ", ".join(item.describe() for item in ray_listeners)
    # Read once at start-up: a replica started later (a scale-up, a replacement) binds its own.
    return (
        f"Ray listens beyond loopback on {where}, where Ray itself binds it; each needs Ray's "
        "token. Replicas that start later (scale-ups, replacements) listen on ports of their "
        f"own, behind the same token. A host firewall closes them all: {ray_auth.SECURITY_DOC}."
    )


def ray_listeners_beyond_loopback(http_port: int) -> list[listeners.Listener]:
    """What the Ray this process started (and its HAProxy) listens on beyond loopback, but the
    HTTP port, which exposure_warning judges by itself."""
    found = listeners.beyond_loopback(listeners.listening_sockets(os.getpid()))
    return [item for item in found if item.port != http_port]
