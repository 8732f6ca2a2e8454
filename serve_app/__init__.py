"""serve_app: a GPU-memory-partitioned inference server on Ray Serve.

Nothing happens at import but one clock reading (``IMPORTED_AT_S``: when this process began
importing serve_app, which for a replica is when Ray gave its worker the actor); the public
surface is small.
"""

import time

IMPORTED_AT_S = time.time()

from serve_app.config.args import AppArgs, parse_args  # noqa: E402 - after the clock reading
from serve_app.errors import ConfigError, ServeAppError  # noqa: E402

__all__ = ["AppArgs", "ConfigError", "ServeAppError", "parse_args"]
__version__ = "0.1.0"
