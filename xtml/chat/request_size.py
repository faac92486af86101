"""The size of a request, and its depth: one walk, on every request, that
bounds what the request can cost before anything renders it.
"""

from __future__ import annotations

import marshal
from collections.abc import Mapping
from typing import Any

from ..errors import MAX_DEPTH, too_deep
from ..plugins import jsonfmt
from . import fields
from .json_values import COMPACT_MAX

__all__ = ["MAX_CHARS", "Known", "request_size", "size_and_tools"]

# The most a request may hold unless the caller says otherwise (the
# ``max_chars`` keyword): characters of every string in it, keys included,
# plus one per value. Rendering, tokenizing and parsing grow linearly with
# this; the limit bounds what one request can cost.
MAX_CHARS = 64 << 20


def request_size(request: Any, limit: int, *, levels: int = MAX_DEPTH, at: tuple[str | int, ...] = ()) -> int:
    """The size :data:`MAX_CHARS` counts, or a count past ``limit`` (the walk
    stops at the first level that crosses it). A value nested more than
    ``levels`` deep (a value that contains itself, too) is refused with
    :func:`~xtml.errors.too_deep`, ``at`` being the path to ``request`` in
    the request it is part of."""
    return size_and_tools(request, limit, levels, at)[0]


# A request's tool list and its marshal bytes, which the size check makes
# and the tool declaration's JSON is found by: made once per request.
Known = tuple[Any, bytes]


def size_and_tools(request: Any, limit: int, levels: int = MAX_DEPTH,
                   at: tuple[str | int, ...] = ()) -> tuple[int, Known | None]:
    # The known tool lists were walked at this depth: others are walked.
    tools = request.get("tools") if type(request) is dict and not at and levels == MAX_DEPTH else None
    if type(tools) is list and tools:
        # The same tool list (deep JSON schemas, most of a short request's
        # walk) comes with every request of a conversation: its size is kept
        # by its marshal bytes, as json_compact keeps its JSON.
        try:
            key = marshal.dumps(tools)
        except ValueError:
            key = b""
        size = _tool_sizes.get(key) if key else None
        if size is None:
            size = _walk_size(tools, limit, levels - 1, ("tools",))
            if key and size <= limit and len(key) <= COMPACT_MAX:
                if len(_tool_sizes) >= 64:
                    _tool_sizes.clear()
                _tool_sizes[key] = size
        known = (tools, key) if key else None
        if size > limit:
            return size, known
        rest = {k: v for k, v in request.items() if k != "tools"}
        return size + len("tools") + _walk_size(rest, limit - size, levels), known
    return _walk_size(request, limit, levels, at), None


_tool_sizes: dict[bytes, int] = {}


_SCALARS = frozenset({int, float, bool, type(None)})


def _walk_size(request: Any, limit: int, levels: int = MAX_DEPTH, at: tuple[str | int, ...] = ()) -> int:
    # Level by level, so that a container's children are queued in C
    # (``extend``): this runs on every request, and is where its depth is
    # measured (the level count).
    total = 0
    level = [request]
    for depth in range(levels + 1):
        total += len(level)
        nxt: list[Any] = []
        extend = nxt.extend
        for x in level:
            t = type(x)
            if t is str:
                total += len(x)
            elif t is dict or (t is not list and t is not tuple and isinstance(x, Mapping)):
                try:
                    total += sum(map(len, x))
                except TypeError:  # a key that is not a string
                    total += sum(len(k) for k in x if isinstance(k, str))
                extend(x.values())
            elif t is list or t is tuple or isinstance(x, list | tuple):
                extend(x)
            elif isinstance(x, str):
                total += len(x)
            elif t not in _SCALARS and callable(getattr(x, "model_dump", None)):
                # A request or message model counts as what it renders from,
                # a dict on the model's level (its depth is the dict's).
                dumped = fields.dump(x)
                if type(dumped) is dict:
                    total += 1 + sum(len(k) for k in dumped if isinstance(k, str))
                    extend(dumped.values())
                else:
                    extend((dumped,))
        if total > limit:
            break
        if depth == levels and (nxt or any(isinstance(x, Mapping | list | tuple) for x in level)):
            raise too_deep([*at, *(jsonfmt.deep_path(request, levels, _dumped) or ())])
        if not nxt:
            break
        level = nxt
    return total


def _dumped(x: Any) -> Any:
    return fields.dump(x) if callable(getattr(x, "model_dump", None)) else None
