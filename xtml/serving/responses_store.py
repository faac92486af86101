"""The responses the Responses API keeps for ``previous_response_id``
(:class:`ResponseStore`): bounded in entries, bytes and age, each kept as
its JSON text."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .engines.framing import dumps

__all__ = ["MAX_AGE", "MAX_BYTES", "MAX_ENTRIES", "ResponseStore", "Stored"]

MAX_ENTRIES = 1000
"""Responses a store keeps by default; the oldest goes first."""
MAX_AGE = 3600.0
"""Seconds a stored response is kept by default."""
MAX_BYTES = 256 << 20
"""Bytes (of the entries' JSON) a store keeps by default: a request body may
be 32 MiB, so a count of entries alone bounds no memory."""


@dataclass(slots=True)
class Stored:
    """A stored response: the object as answered, and the conversation a
    follow-up continues (chat messages, without the ``instructions``, which
    are not carried over, as OpenAI's are not). ``size`` is the bytes of
    their JSON, as the store keeps them."""

    response: dict[str, Any]
    history: list[dict[str, Any]]
    at: float = 0.0
    size: int = 0


def _text(value: Any) -> bytes:
    """``value`` as compact JSON, in bytes of exactly its length: orjson's
    bytes keep the buffer they were written in (five times the text, for
    a conversation of many short messages), which the store would hold."""
    return bytes(memoryview(dumps(value)))


class _Kept:
    """A response as the store holds it: its JSON text, which is what the
    store's bound counts (the objects it decodes to take several times
    as much memory: ten 30 MiB requests held 2 GB under a bound of 256 MiB)."""

    __slots__ = ("at", "history", "response")

    def __init__(self, response: bytes, history: bytes, at: float) -> None:
        self.response = response
        self.history = history
        self.at = at

    @property
    def size(self) -> int:
        return len(self.response) + len(self.history)


class ResponseStore:
    """Responses kept in this process for ``previous_response_id``: at most
    ``max_entries`` and ``max_bytes`` of their JSON (the oldest is dropped
    first; one larger than ``max_bytes`` is not kept), each for ``max_age``
    seconds. ``clock`` is the time source (monotonic seconds). What is kept
    is the JSON text itself, decoded by :meth:`get`: the bound in bytes is
    the memory held."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_age: float = MAX_AGE, *,
                 max_bytes: int = MAX_BYTES, clock: Callable[[], float] = time.monotonic) -> None:
        if type(max_entries) is not int or max_entries < 0:
            raise ValueError(f"max_entries must be a whole number, not {max_entries!r}")
        if not max_age > 0:
            raise ValueError(f"max_age must be a positive number of seconds, not {max_age!r}")
        if type(max_bytes) is not int or max_bytes < 0:
            raise ValueError(f"max_bytes must be a whole number of bytes, not {max_bytes!r}")
        self.max_entries = max_entries
        self.max_age = float(max_age)
        self.max_bytes = max_bytes
        self._bytes = 0
        self._clock = clock
        self._items: OrderedDict[str, _Kept] = OrderedDict()
        # Requests are rendered in worker threads when large.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._items)

    @property
    def held(self) -> int:
        """The bytes of JSON kept."""
        with self._lock:
            self._expire()
            return self._bytes

    def _expire(self) -> None:
        oldest = self._clock() - self.max_age
        items = self._items
        while items:
            key, first = next(iter(items.items()))
            if first.at > oldest:
                break
            del items[key]
            self._bytes -= first.size

    def put(self, id: str, entry: Stored) -> None:
        kept = _Kept(_text(entry.response), _text(entry.history), 0.0)
        entry.size = kept.size
        with self._lock:
            old = self._items.pop(id, None)
            if old is not None:
                self._bytes -= old.size
            if kept.size > self.max_bytes:
                return  # never kept: a later previous_response_id to it is a 404, as for any other
            kept.at = entry.at = self._clock()
            self._items[id] = kept
            self._bytes += kept.size
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= dropped.size
            self._expire()

    def _kept(self, id: str) -> _Kept | None:
        with self._lock:
            self._expire()
            return self._items.get(id)

    def get(self, id: str) -> Stored | None:
        """The response stored as ``id``, decoded (objects of its own)."""
        kept = self._kept(id)
        if kept is None:
            return None
        return Stored(json.loads(kept.response), json.loads(kept.history), kept.at, kept.size)

    def size(self, id: str) -> int | None:
        """The bytes of the response stored as ``id``, without decoding it."""
        kept = self._kept(id)
        return None if kept is None else kept.size

    def response_json(self, id: str) -> bytes | None:
        """The response object stored as ``id``, as the JSON it is kept as."""
        kept = self._kept(id)
        return None if kept is None else kept.response

    def delete(self, id: str) -> bool:
        with self._lock:
            entry = self._items.pop(id, None)
            if entry is None:
                return False
            self._bytes -= entry.size
            return True
