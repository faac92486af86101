"""The bound on the process-wide caches of loaded things.

What is made from an object (a vocabulary's binding to a template's markers,
a binding's tables) is kept on that object and goes with it. What is kept by
a name instead (templates by path, tokenizers by path) has no owner to go
with, so it is kept in an :class:`Lru` of :data:`SIZE` entries: a
long-running process holds the few it uses most recently, whatever it loaded
before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["SIZE", "Lru"]

SIZE = 8
"""Entries of every :class:`Lru`: a tokenizer of a large model is hundreds of
megabytes, and a process rarely switches between more than a few."""

K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    """A mapping that keeps the ``size`` entries used last."""

    def __init__(self, size: int = SIZE) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        # Threads share the process's caches (a server renders on several),
        # and reordering is two steps.
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` under ``key`` (dropping the entry used longest ago
        when full) and return it."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value

    def __getitem__(self, key: K) -> V:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
