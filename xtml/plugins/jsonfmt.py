"""The JSON spellings the chat layer uses, with encoders built once.

``json.dumps`` with any non-default option builds a new encoder per call;
these are called per argument and per message, so they are built here once.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
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


class TooDeep(json.JSONDecodeError):
    """JSON text nested deeper than Python's reader goes (its recursion
    limit): text that cannot be read, as any other."""


def read(text: str | bytes, decode: Callable[[str], Any] = json.loads, **options: Any) -> Any:
    """``decode(text)`` (Python's JSON reader), with nesting past Python's
    recursion limit a :class:`TooDeep`: every text it cannot read is then a
    ``ValueError``, which is what callers catch. ``options`` go to
    ``json.loads`` (with bytes, which it reads in whatever UTF they are)."""
    try:
        if options or type(text) is not str:
            return json.loads(text, **options)
        return decode(text)
    except RecursionError:
        doc = text if type(text) is str else ""
        raise TooDeep("arrays and objects nested deeper than Python's JSON reader goes", doc, 0) from None


def loads(text: str) -> Any:
    """Standard JSON only: ``json.JSONDecodeError`` for text that is not
    JSON (:class:`TooDeep` for nesting deeper than Python's recursion
    limit), :class:`NotStandard` for what Python's decoder reads but
    standard JSON does not have (``NaN``, ``Infinity``, ``-Infinity``, a
    number too large for a float, an integer with more digits than Python
    converts, a string holding a lone surrogate). Whatever it returns,
    :func:`value` and :func:`arguments` write back."""
    if lone_surrogate(text) >= 0:
        raise NotStandard("the text holds a lone surrogate, which is not Unicode text")
    try:
        v = read(text, _DECODER.decode)
    except json.JSONDecodeError:
        raise
    except NotStandard:
        # The hooks fire before the decoder sees the rest: "NaNx" is not
        # JSON at all, to Python either, and must be told apart from "NaN".
        try:
            read(text)
        except json.JSONDecodeError:
            raise
        except ValueError:
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
        return read(text, object_pairs_hook=once)
    except _Twice as e:
        where = _path_of_object(text, e.n)
        raise BadInput(f"invalid JSON: key {e.key!r} twice in one object{' (at ' + where + ')' if where else ''}; "
                       "JSON would keep only the last") from None
    except UnicodeDecodeError:
        raise
    except TooDeep:
        raise BadInput("invalid JSON: nested too deeply") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"invalid JSON: {e.msg} (at line {e.lineno}, column {e.colno})") from None
    except ValueError:
        raise BadInput(f"invalid JSON: an integer has more than {sys.get_int_max_str_digits():,} digits, more "
                       "than Python reads") from None


# -- depth ---------------------------------------------------------------------------

_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def deep_path(value: Any, levels: int, dump: Callable[[Any], Any] | None = None) -> list[str | int] | None:
    """The path (keys and indices) to the first array or object of ``value``
    nested more than ``levels`` deep, or None. Python values: mappings,
    lists and tuples nest; ``dump`` turns any other value into what it
    stands for (a request model into its dict), or None when it stands for
    itself. A value that contains itself is nested past any depth."""
    stack: list[tuple[Any, int, list[str | int]]] = [(value, 0, [])]
    while stack:
        x, depth, path = stack.pop()
        if dump is not None and type(x) not in _PLAIN:
            dumped = dump(x)
            if dumped is not None:
                x = dumped
        if isinstance(x, Mapping):
            items: Sequence[tuple[str | int, Any]] = [(k if isinstance(k, str) else str(k), v) for k, v in x.items()]
        elif isinstance(x, list | tuple):
            items = list(enumerate(x))
        else:
            continue
        if depth == levels:
            return path
        stack += [(v, depth + 1, [*path, k]) for k, v in reversed(items)]
    return None


_PLAIN = frozenset({str, int, float, bool, type(None), dict, list, tuple})


class _Pairs(list[tuple[str, Any]]):
    """A JSON object's pairs, in order."""


def deep_path_in_text(text: str, levels: int) -> list[str | int] | None:
    """:func:`deep_path` of JSON text, found without reading all of it (text
    too deep for Python's reader): the text up to where it opens an array or
    object more than ``levels`` deep is read with that value as a 0 and
    what is open closed, and the path goes to that 0. None when no value is
    that deep, or the text before it is not JSON."""
    open_: list[str] = []
    for m in _TOKENS.finditer(text):
        c = m.group()
        if c == "[" or c == "{":
            if len(open_) == levels:
                head = text[:m.start()] + "0" + "".join("]" if o == "[" else "}" for o in reversed(open_))
                try:
                    # Objects as their pairs: a key given twice is still
                    # the last one.
                    x = read(head, object_pairs_hook=_Pairs)
                except ValueError:
                    return None
                path: list[str | int] = []
                while isinstance(x, list) and x:
                    if isinstance(x, _Pairs):
                        key, x = x[-1]
                        path.append(key)
                    else:
                        path.append(len(x) - 1)
                        x = x[-1]
                return path
            open_.append(c)
        elif c == "]" or c == "}":
            if open_:
                open_.pop()
    return None
