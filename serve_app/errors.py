"""A small exception hierarchy; the HTTP edge turns it into JSON errors without tracebacks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ServeAppError(Exception):
    """Base class for errors serve_app raises on purpose."""

    status_code: int = 500
    error_type: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.error_type

    def headers(self) -> dict[str, str]:
        """HTTP headers this error's response must carry (Retry-After, WWW-Authenticate)."""
        return {}

    def to_json(self) -> dict[str, Any]:
        """The OpenAI-style error body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class ConfigError(ServeAppError):
    """A configuration value is wrong; the message names the field and the fix."""

    error_type = "config_error"


class StartupError(ServeAppError):
    """A replica cannot start (for example, not enough free GPU memory for its budget)."""

    error_type = "startup_error"


class BadRequest(ServeAppError):
    status_code = 400
    error_type = "invalid_request_error"


class NotFound(ServeAppError):
    status_code = 404
    error_type = "not_found_error"


class MethodNotAllowed(ServeAppError):
    status_code = 405
    error_type = "invalid_request_error"


class PayloadTooLarge(ServeAppError):
    status_code = 413
    error_type = "payload_too_large"


class UnsupportedMediaType(ServeAppError):
    status_code = 415
    error_type = "unsupported_media_type"


class UnsupportedContentEncoding(UnsupportedMediaType):
    """A compressed request body: 415 with ``Accept-Encoding`` (RFC 9110, 15.5.16)."""

    def headers(self) -> dict[str, str]:
        return {"accept-encoding": "identity"}


class InsufficientMemory(ServeAppError):
    """An item cannot fit in the replica's GPU memory budget even alone (HTTP 507)."""

    status_code = 507
    error_type = "insufficient_gpu_memory"


class InferenceError(ServeAppError):
    """The model failed on a request; the traceback goes to the log under ``error_id``."""

    status_code = 500
    error_type = "inference_error"


class Unauthorized(ServeAppError):
    """No valid API key (HTTP 401, with the challenge RFC 6750 asks for)."""

    status_code = 401
    error_type = "authentication_error"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="serve_app"'}


class Overloaded(ServeAppError):
    """The replica's queue is full, or an item waited in it past its deadline (HTTP 503):
    try again after ``retry_after_s`` (whole seconds, at least 1)."""

    status_code = 503
    error_type = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int = 1, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after_s = max(1, int(retry_after_s))

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class RequestTimeout(ServeAppError):
    """A request took longer than ``args.request_timeout_s`` (HTTP 504); its work is dropped."""

    status_code = 504
    error_type = "timeout"


@dataclass(frozen=True)
class ItemError:
    """A batch output that stands for an item the batch could not process (an image that
    could not be decoded on the GPU path, say): ``error`` is what its request answers (a 4xx
    naming ``input[index]``), while the batch's other requests get their answers."""

    index: int
    error: ServeAppError
