"""Optional bearer-token auth for the inference and memory routes.

Keys come from the environment only (``SERVE_APP_API_KEYS``, comma-separated, and/or the file
named by ``SERVE_APP_API_KEYS_FILE``, one key per line), never from the deploy config, which
is often committed. With neither variable set, auth is off; a variable that is set but yields no
key stops the replica from starting (``env.api_keys``), so an empty Secret never serves open.
The check runs in the HTTP edge
(``http.Ingress``) before any handler, so a request without a valid key costs no decoding and
no model work.

Each presented token is compared with every configured key, in constant time: both sides are
hashed to SHA-256 first (so neither a key's length nor its prefix shows in the timing) and
``hmac.compare_digest`` runs against all keys without stopping at a match.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable, Mapping

from serve_app import env
from serve_app.errors import Unauthorized

logger = logging.getLogger("serve_app")

# Routes beside the inference routes that need a key when keys are configured. /healthz and
# /readyz stay open for probes; /openapi.json and /docs stay open so that clients can discover
# the scheme (they name no secret: the same routes and schemas every serve_app serves).
PROTECTED_COMMON_PATHS = frozenset({"/v1/memory", "/v1/models"})


def protected_paths(inference_routes: Iterable[str]) -> frozenset[str]:
    """The routes that need a key when keys are configured: every inference route (a family's
    route this application does not serve too, so that it answers 401 before its 404) and
    PROTECTED_COMMON_PATHS."""
    return PROTECTED_COMMON_PATHS | frozenset(inference_routes)


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def bearer_token(authorization: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme in any case), or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    token = token.strip()
    return token or None


class ApiKeys:
    """The configured keys, kept as SHA-256 digests."""

    def __init__(self, keys: Iterable[str]):
        self._digests = [_digest(k.encode("utf-8")) for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def valid(self, token: bytes | None) -> bool:
        """Whether ``token`` is one of the keys; compares against every key, in constant time."""
        if token is None or not self._digests:
            return False
        presented = _digest(token)
        found = False
        for key in self._digests:
            found |= hmac.compare_digest(presented, key)
        return found

    def check(self, headers: Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]]) -> None:
        """Raise Unauthorized unless the request's headers carry a valid bearer key."""
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        authorization = next((v for k, v in pairs if k.lower() == b"authorization"), None)
        token = bearer_token(authorization)
        if token is None:
            raise Unauthorized(
                "this route needs an API key: send 'Authorization: Bearer <key>'",
                code="missing_api_key",
            )
        if not self.valid(token):
            raise Unauthorized("the API key is not valid", code="invalid_api_key")


def load_api_keys() -> ApiKeys:
    """The keys of this process's environment, for a replica: raises ConfigError (naming the
    variable) when a key variable is set but yields no key, and logs a warning when the key
    file is readable by other users."""
    keys = ApiKeys(env.api_keys())
    warning = env.api_keys_file_warning()
    if warning:
        logger.warning(warning)
    return keys
