"""The JSON values a request carries: written as K3 writes them (compact,
keys sorted), refused where JSON would change them silently (keys that are
not strings), and searched for lone surrogates, which are not text.
"""

from __future__ import annotations

import json
import marshal
from collections.abc import Mapping
from typing import Any

from ..errors import RequestError, shown
from ..plugins import jsonfmt

__all__ = ["check_json_keys", "deep_sort", "is_map", "json_compact", "surrogate_in", "surrogate_message"]


def is_map(x: object) -> bool:
    # Plain dicts are what users pass; the ABC check is slow on a hot path.
    return type(x) is dict or isinstance(x, Mapping)


def deep_sort(obj: Any, where: str = "tools") -> Any:
    """Dicts with keys sorted, recursively (how K3 serialises schemas)."""
    if is_map(obj):
        try:
            items = sorted(obj.items())
        except TypeError:
            raise RequestError("JSON object keys must be strings", location=where) from None
        return {k: deep_sort(v, where) for k, v in items}
    if isinstance(obj, list | tuple):
        return [deep_sort(v, where) for v in obj]
    return obj


def check_json_keys(obj: Any, where: str) -> None:
    """Refuse objects whose keys are not strings: JSON would turn them into
    strings silently, and parse could not give them back."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if is_map(x):
            for k, v in x.items():
                if not isinstance(k, str):
                    raise RequestError(f"JSON object keys must be strings, not {shown(k)}", location=where)
                stack.append(v)
        elif isinstance(x, list | tuple):
            stack.extend(x)


def json_compact(value: Any, where: str, key: bytes | None = None) -> str:
    """Compact JSON with every object's keys sorted, as K3 writes schemas
    (``sort_keys`` sorts recursively, like :func:`deep_sort`, but in C).

    Refuses what JSON would change silently (non-string keys): the text is
    read back and compared, in C; only on a difference does the slow walk
    look for the cause (tuples, say, differ harmlessly). ``key``: the
    value's marshal bytes, when the caller has them already."""
    # The same tool list arrives with every request of a conversation, as a
    # new object. marshal writes plain built-in values only (anything else
    # raises) and its bytes give the value back exactly, types and key order
    # included, so equal bytes mean the same JSON: a key five times cheaper
    # to make than the JSON itself.
    if key is None:
        try:
            key = marshal.dumps(value)
        except ValueError:
            key = None
    if key is not None:
        text = _compact.get(key)
        if text is not None:
            return text
    try:
        text = jsonfmt.compact(value)
    except (TypeError, ValueError) as e:
        raise RequestError(f"not JSON-serialisable: {e}", location=where) from None
    if jsonfmt.lone_surrogate(text) >= 0:
        bad = surrogate_in(value, where)
        if bad is not None:
            raise RequestError(bad[1], location=bad[0])
    if json.loads(text) != value:
        check_json_keys(value, where)
    if key is not None and len(key) <= COMPACT_MAX:
        if len(_compact) >= 64:
            _compact.clear()
        _compact[key] = text
    return text


# The JSON of recent tool lists and schemas by their marshal bytes: at most
# 64 of at most 256 kB each, so a server holds a few tens of MB at worst.
_compact: dict[bytes, str] = {}
COMPACT_MAX = 256 << 10


# -- lone surrogates -----------------------------------------------------------------
# A str may hold a lone surrogate (JSON's "\udc00" decodes to one), which is
# not text: UTF-8 cannot write it, the tokenizers library refuses it with a
# TypeError and tiktoken replaces it with U+FFFD, silently. Every string the
# render writes is checked where the request is read, so the error names it.


def surrogate_message(text: str, at: int) -> str:
    return (f"U+{ord(text[at]):04X} at character {at:,} is a lone surrogate, not text: no tokenizer encodes it "
            f"and UTF-8 cannot write it")


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key)}]"


def surrogate_in(value: Any, path: str = "") -> tuple[str, str] | None:
    """(path, message) of the first string, key or value, of a JSON-like
    value that holds a lone surrogate, or None."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        x, where = stack.pop()
        if isinstance(x, str):
            at = jsonfmt.lone_surrogate(x)
            if at >= 0:
                return where, surrogate_message(x, at)
        elif is_map(x):
            items = list(x.items())
            for k, v in reversed(items):
                if isinstance(k, str):
                    at = jsonfmt.lone_surrogate(k)
                    if at >= 0:
                        return where, f"a key: {surrogate_message(k, at)}"
                    stack.append((v, _key_path(where, k)))
                else:
                    stack.append((v, f"{where}[{type(k).__name__}]"))
        elif isinstance(x, list | tuple):
            stack.extend((v, f"{where}[{n}]") for n, v in reversed(list(enumerate(x))))
    return None
