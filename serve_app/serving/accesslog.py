"""Serve's access log, once a deployment turns it off, costs a request nothing.

Ray Serve 2.60's replica builds the access log's record for every request, caller lookup,
record factory and context filters included, and only then drops it in its handlers' filter
(``log_access_log_filter``) when ``logging_config.enable_access_log`` is false, at a cost to
the replica's event loop for every request (``python -m load_tests.benchmarks.access_log``;
docs/benchmarks.md, "Serve's access log when it is off").
``gate_access_log`` puts a gate in front of the replica module's logger: a record marked
``serve_access_log`` that every handler would drop is not built. Every other call passes to the
logger unchanged, and a deployment that turns the access log on (its ``logging_config``, at
start-up or on reconfigure) gets every line, since the gate reads the handlers at each call.
"""

from __future__ import annotations

import logging
from typing import Any

SERVE_LOGGER = "ray.serve"


def access_log_dropped(logger: logging.Logger) -> bool:
    """True when each of ``logger``'s handlers drops access-log records (Serve's own filter,
    the one ``enable_access_log: false`` adds) and nothing propagates past it."""
    handlers = logger.handlers
    if logger.propagate or not handlers:
        return False
    drop = _serve_filter()
    return all(drop in h.filters for h in handlers)


def _serve_filter() -> Any:
    global _SERVE_FILTER
    if _SERVE_FILTER is None:  # imported once: this runs for every request
        from ray.serve._private.logging_utils import log_access_log_filter

        _SERVE_FILTER = log_access_log_filter
    return _SERVE_FILTER


_SERVE_FILTER: Any = None


class AccessLogGate:
    """A logger's stand-in that skips the access log's records while they would be dropped."""

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger):
        self._logger = logger

    def info(self, msg: object, *args: Any, **kwargs: Any) -> None:
        extra = kwargs.get("extra")
        if extra and extra.get("serve_access_log") and access_log_dropped(self._logger):
            return
        # one frame more than a direct call: the line still names Serve's caller
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
        self._logger.info(msg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


def gate_access_log() -> bool:
    """In a replica: gate Serve's replica module's logger (idempotent). False, with a warning,
    when that module has no logger of Serve's, as a Ray other than the pinned one may not."""
    from ray.serve._private import replica as serve_replica

    current = getattr(serve_replica, "logger", None)
    if isinstance(current, AccessLogGate):
        return True
    if not isinstance(current, logging.Logger) or current.name != SERVE_LOGGER:
        logging.getLogger("serve_app").warning(
            "Serve's replica module has no %r logger to gate; the access log's records are "
            "built and dropped per request as Ray does (a Ray other than the pinned 2.60?)",
            SERVE_LOGGER,
        )
        return False
    serve_replica.logger = AccessLogGate(current)  # type: ignore[assignment]
    return True
