"""The module name that earlier warm-worker preload lists (Ray's ``preload_python_modules``)
carry; the model deployment lives in serve_app.serving.replica."""

from serve_app.serving.replica import ModelServer

__all__ = ["ModelServer"]
