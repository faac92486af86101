"""A request's response format: plain text, any JSON object, or JSON of a
schema, read from the shape a request API gives it in.

Chat requests nest a schema's fields under ``json_schema``
(``{"type": "json_schema", "json_schema": {"name": …, "schema": …}}``, or
the type alone as a string); the Responses API writes them beside the type
(``text.format``: ``{"type": "json_schema", "name": …, "schema": …}``).
Either way the answer is the chat shape, or None for plain text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError, RequestError, shown

__all__ = ["CHAT", "FormatShape", "read_response_format"]


@dataclass(frozen=True, slots=True)
class FormatShape:
    """How one request API spells a response format, and names its parts in
    errors."""

    error: Callable[[str, str], RequestError]
    """The error for a message about a field of the format (``""``: the
    format itself)."""
    not_object: str
    """The message for a format that is not an object."""
    type_name: str
    """The format's type in a message."""
    schema: Callable[[Mapping[str, Any], FormatShape], dict[str, Any]]
    """The ``json_schema`` member of the chat shape, from a format of type
    json_schema."""
    shorthand: bool = False
    """Whether a string stands for the format of that type."""


def read_response_format(given: Any, shape: FormatShape) -> dict[str, Any] | None:
    """``given`` in the chat shape (``{"type": "json_object"}``,
    ``{"type": "json_schema", "json_schema": {...}}``), or None for plain
    text or none given."""
    if given is None:
        return None
    if shape.shorthand and isinstance(given, str):
        given = {"type": given}
    if not (type(given) is dict or isinstance(given, Mapping)):
        raise shape.error(shape.not_object, "")
    t = given.get("type")
    if t == "text":
        return None
    if t == "json_object":
        return {"type": "json_object"}
    if t == "json_schema":
        return {"type": "json_schema", "json_schema": shape.schema(given, shape)}
    raise shape.error(f"{shape.type_name} must be text, json_object or json_schema, not {shown(t)}", "type")


def _nested_schema(f: Mapping[str, Any], shape: FormatShape) -> dict[str, Any]:
    js = f.get("json_schema")
    if not (type(js) is dict or isinstance(js, Mapping)):
        raise shape.error("response_format json_schema needs a 'json_schema' object", "json_schema")
    # The schema itself given as json_schema, as some clients send it.
    return {"schema": js.get("schema", js.get("json_schema", js))}


CHAT = FormatShape(error=lambda msg, _field: OptionError(msg, option="response_format"),
                   not_object="response_format must be an object with a 'type'",
                   type_name="response_format type", schema=_nested_schema, shorthand=True)
"""A chat request's ``response_format``."""
