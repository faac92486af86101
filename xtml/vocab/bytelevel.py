"""Facts the vocabularies share: the byte-level BPE alphabet, and the cores
this process may run on."""

from __future__ import annotations

import os
from functools import cache

__all__ = ["byte_to_char", "usable_cores"]


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
