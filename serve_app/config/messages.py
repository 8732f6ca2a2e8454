"""Pydantic's validation errors as serve_app's config errors: one line each, with the field's
path, what is wrong, the bad value and the fix."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

__all__ = ["validation_messages"]


def _format_loc(prefix: str, loc: tuple[Any, ...]) -> str:
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _fix_for(err: dict[str, Any]) -> str:
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "remove it or check its spelling (see README: config fields)"
    if kind == "literal_error":
        return f"use one of {ctx.get('expected', 'the allowed values')}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return "use a value in the allowed range"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return "use a value of the right type"
    return "fix the value"


def validation_messages(exc: ValidationError, prefix: str = "args") -> list[str]:
    """One line per error: field path, what is wrong, the bad value and the fix."""
    lines = []
    for err in exc.errors():
        where = _format_loc(prefix, tuple(err["loc"]))
        value = err.get("input")
        shown = repr(value) if not isinstance(value, dict) else "{...}"
        lines.append(f"{where}: {err['msg']} (got {shown}); {_fix_for(dict(err))}")
    return lines
