"""Request fields the text families' wire specs read alike: integers and booleans checked as
their OpenAPI schemas say (JSON Schema 2020-12, where 2.0 is an integer and true is not), and
the ``model`` field's schema."""

from __future__ import annotations

from typing import Any

from serve_app.errors import BadRequest


def integer(doc: dict[str, Any], name: str, low: int, high: int) -> int | None:
    """``doc[name]`` as an integer from ``low`` to ``high``, or None when absent or null."""
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer, got {value!r}", param=name)
    if not low <= value <= high:
        raise BadRequest(
            f"'{name}' must be between {low} and {high}, got {value}",
            param=name,
            code="out_of_range",
        )
    return value


def boolean(doc: dict[str, Any], name: str) -> bool:
    """``doc[name]`` as a boolean (false when absent)."""
    value = doc.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false, got {value!r}", param=name)
    return value


def no_truncation(doc: dict[str, Any]) -> None:
    """TEI's ``truncate``: only false. Inputs are never cut: one too long gets a 400."""
    if doc.get("truncate", False) is not False:
        raise BadRequest(
            "'truncate' must be false: serve_app never truncates; an input longer than the "
            "model's limit gets a 400 naming it",
            param="truncate",
        )


def model_schema(model_name: str) -> dict[str, Any]:
    """The ``model`` field's schema: this application's model, or null."""
    return {"anyOf": [{"type": "string", "enum": [model_name]}, {"type": "null"}], "default": None}
