"""Rows the throughput tests share."""

from __future__ import annotations


def common_row(**kw: object) -> dict[str, object]:
    """A serve_app MiniLM row's common fields, 16 inputs a request at 4 replicas, then ``kw``."""
    base = {"setup": "serve_app", "model": "minilm", "payload": "minilm-x16-float"}
    return {**base, "inputs_per_request": 16, "replicas": 4, "mps": False, **kw}
