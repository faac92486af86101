"""What the vocabularies share: the byte-level BPE alphabet, the cores this
process may run on, and threads of their own."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import cache

__all__ = ["OneThread", "byte_to_char", "unbyte", "usable_cores"]


class OneThread:
    """A process's one thread for a kind of work, started on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def __call__(self) -> ThreadPoolExecutor:
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix=self._name)
                pool = self._pool
        return pool

    def _forget(self) -> None:
        # A forked child has no copy of the parent's threads: it starts its
        # own (and its own lock, which a parent's thread may have held at
        # the fork).
        self._pool = None
        self._lock = threading.Lock()
        usable_cores.cache_clear()


@cache
def usable_cores() -> int:
    """The cores this process may run on (asked once: every encode asks)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


def byte_to_char() -> dict[int, str]:
    """The byte-level BPE alphabet: each byte as the character that stands
    for it in token strings (printable Latin-1 as itself, the rest shifted
    past U+0100)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


@cache
def unbyte() -> dict[int, int]:
    """``str.translate`` table from the byte-level alphabet to Latin-1 (each
    character to the byte it stands for); other Latin-1 characters go to
    U+FFFF, which Latin-1 cannot encode, so a token outside the alphabet
    fails the encode."""
    out = dict.fromkeys(range(256), 0xFFFF)
    out.update({ord(c): b for b, c in byte_to_char().items()})
    return out
