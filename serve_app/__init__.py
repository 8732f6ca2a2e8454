"""serve_app: a GPU-memory-partitioned inference server on Ray Serve.

Nothing happens at import; the public surface is small.
"""

from serve_app.config import AppArgs, parse_args
from serve_app.errors import ConfigError, ServeAppError

__all__ = ["AppArgs", "ConfigError", "ServeAppError", "parse_args"]
__version__ = "0.1.0"
