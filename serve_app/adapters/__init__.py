"""Model families: one file each, plus the contract in base.py."""

from serve_app.adapters.contract import Decoded, ModelAdapter, make_adapter

__all__ = ["Decoded", "ModelAdapter", "make_adapter"]
