"""The JSON spellings the chat layer uses, with encoders built once.

``json.dumps`` with any non-default option builds a new encoder per call;
these are called per argument and per message, so they are built here once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# Argument values: default separators, non-ASCII kept (K3's spelling).
_VALUE = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
# Argument objects as parse returns them (NaN cannot occur: values were JSON).
_ARGS = json.JSONEncoder(ensure_ascii=False)
# Schemas and tool lists: compact, keys sorted recursively.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, sort_keys=True)


def value(v: Any) -> str:
    """An argument value as K3 writes it (raises ValueError/TypeError)."""
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if type(v) is int:
        return str(v)
    return _VALUE.encode(v)


def arguments(args: dict[str, Any]) -> str:
    """Typed arguments as one JSON object string."""
    return _ARGS.encode(args)


def compact(v: Any) -> str:
    """Compact, key-sorted JSON (raises ValueError/TypeError)."""
    return _COMPACT.encode(v)


def value_type(value: Any) -> str:
    """The XTML type of an argument value."""
    t = type(value)
    # Exact types first: JSON-decoded values are plain, and this runs per argument.
    if t is str:
        return "string"
    if t is bool:
        return "boolean"
    if t is int or t is float:
        return "number"
    if t is dict:
        return "object"
    if t is list:
        return "array"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    return "array"
