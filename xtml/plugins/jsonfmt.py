"""The JSON spellings the chat layer uses, with encoders built once.

``json.dumps`` with any non-default option builds a new encoder per call;
these are called per argument and per message, so they are built here once.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from typing import Any

from ..errors import shown

# Argument values: default separators, non-ASCII kept (K3's spelling).
_VALUE = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
# Argument objects as parse returns them. Their values come from
# :func:`loads`, so they are standard JSON; allow_nan=False makes sure.
_ARGS = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
# Schemas and tool lists: compact, keys sorted recursively.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, sort_keys=True)


class NotStandard(ValueError):
    """Text Python's ``json`` reads that standard JSON (RFC 8259, with
    strings of Unicode text) does not have."""


def _constant(name: str) -> Any:
    raise NotStandard(f"{name} is not a JSON value")


def _float(text: str) -> float:
    v = float(text)
    if math.isinf(v):
        raise NotStandard(f"the number {shown(text)} is too large for a float")
    return v


# parse_constant sees NaN, Infinity and -Infinity, which Python's decoder
# accepts; parse_float sees only numbers with a fraction or an exponent, so
# integers keep the decoder's fast path.
_DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_float)
# A JSON escape that stands for a surrogate: only text holding one can decode
# to a lone surrogate, so only that text is walked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def loads(text: str) -> Any:
    """Standard JSON only: ``json.JSONDecodeError`` for text that is not
    JSON, :class:`NotStandard` for what Python's decoder reads but standard
    JSON does not have (``NaN``, ``Infinity``, ``-Infinity``, a number too
    large for a float, an integer with more digits than Python converts,
    a string holding a lone surrogate), ``RecursionError`` for nesting
    deeper than Python's recursion limit. Whatever it returns,
    :func:`value` and :func:`arguments` write back."""
    if lone_surrogate(text) >= 0:
        raise NotStandard("the text holds a lone surrogate, which is not Unicode text")
    try:
        v = _DECODER.decode(text)
    except json.JSONDecodeError:
        raise
    except NotStandard:
        # The hooks fire before the decoder sees the rest: "NaNx" is not
        # JSON at all, to Python either, and must be told apart from "NaN".
        try:
            json.loads(text)
        except json.JSONDecodeError:
            raise
        except (ValueError, RecursionError):
            pass  # JSON to Python's grammar, whatever else stops its decoder
        raise
    except ValueError:
        # The decoder converts integers with int(), which refuses more
        # digits than sys.get_int_max_str_digits().
        raise NotStandard("an integer has more digits than Python converts") from None
    if "\\u" in text and _SURROGATE_ESCAPE.search(text) and _holds_surrogate(v):
        raise NotStandard("a string escapes a lone surrogate, which is not Unicode text")
    return v


def lone_surrogate(text: str) -> int:
    """Where ``text`` holds a lone surrogate (which no UTF encodes), or -1."""
    if text.isascii():
        return -1
    try:
        # In C, and about a nanosecond a character: "utf-32" is one of the
        # encodings Python looks up without the codec registry.
        text.encode("utf-32")
    except UnicodeEncodeError as e:
        return e.start
    return -1


def _holds_surrogate(v: Any) -> bool:
    stack = [v]
    while stack:
        x = stack.pop()
        if type(x) is str:
            if lone_surrogate(x) >= 0:
                return True
        elif type(x) is dict:
            for k, item in x.items():
                if lone_surrogate(k) >= 0:
                    return True
                stack.append(item)
        elif type(x) is list:
            stack.extend(x)
    return False


def value(v: Any) -> str:
    """An argument value as K3 writes it (raises ValueError/TypeError)."""
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if type(v) is int:
        try:
            return str(v)
        except ValueError:
            raise NotStandard(f"an integer of {v.bit_length():,} bits has more digits than Python converts "
                              "to text") from None
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


class _Twice(Exception):
    def __init__(self, key: str, n: int) -> None:
        self.key = key
        self.n = n


class _Marked(dict[str, Any]):
    pass


def _path_of_object(text: str | bytes, n: int) -> str:
    """The path (``messages[0]``) of the ``n``-th object that JSON text
    closes, read again; empty for the top level."""
    count = 0

    def mark(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal count
        count += 1
        return _Marked(pairs) if count == n else dict(pairs)

    stack: list[tuple[Any, str]] = [(json.loads(text, object_pairs_hook=mark), "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, _Marked):
            return path
        if isinstance(v, dict):
            stack += [(x, f"{path}.{k}" if path else str(k)) for k, x in v.items()]
        elif isinstance(v, list):
            stack += [(x, f"{path}[{i}]") for i, x in enumerate(v)]
    return ""


class BadInput(ValueError):
    """JSON input (a file, a dataset row) that cannot be read, with a one-line
    reason."""


def input_json(text: str | bytes) -> Any:
    """``json.loads`` of input, every failure but an undecodable byte (a
    ``UnicodeDecodeError``, left to the caller, who knows what the bytes
    are) a :class:`BadInput` with a one-line reason: invalid JSON with its
    line and column, nesting past Python's recursion limit, an integer with
    more digits than Python converts (a bare ``ValueError`` from ``int()``
    otherwise)."""
    objects = 0

    def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # A key twice in one object: json.loads would keep the last value
        # and drop the other without a word.
        nonlocal objects
        objects += 1
        d = dict(pairs)
        if len(d) != len(pairs):
            seen: set[str] = set()
            raise _Twice(next(k for k, _ in pairs if k in seen or seen.add(k)), objects)  # type: ignore[func-returns-value]
        return d

    try:
        return json.loads(text, object_pairs_hook=once)
    except _Twice as e:
        where = _path_of_object(text, e.n)
        raise BadInput(f"invalid JSON: key {e.key!r} twice in one object{' (at ' + where + ')' if where else ''}; "
                       "JSON would keep only the last") from None
    except UnicodeDecodeError:
        raise
    except json.JSONDecodeError as e:
        raise BadInput(f"invalid JSON: {e.msg} (at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise BadInput("invalid JSON: nested too deeply") from None
    except ValueError:
        raise BadInput(f"invalid JSON: an integer has more than {sys.get_int_max_str_digits():,} digits, more "
                       "than Python reads") from None
