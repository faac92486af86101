"""What counts as a token id of a vocabulary, and what a lenient reader does
with one that does not: skips it, with a ``bad-id`` diagnostic."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from ..errors import shown
from ..markup.nodes import Diagnostic

__all__ = ["as_id", "bad_id", "skip_bad_ids"]


def as_id(t: Any, size: int) -> int | None:
    """``t`` as an int id below ``size`` (integers of other types are ids
    too, as numpy's are), or None."""
    try:
        i = operator.index(t)
    except TypeError:
        return None
    return i if 0 <= i < size else None


def bad_id(t: Any, offset: int) -> Diagnostic:
    """The diagnostic of a value at ``offset`` that is no id of the vocabulary."""
    return Diagnostic("bad-id", offset, f"{shown(t)} is not a token id of this tokenizer")


def skip_bad_ids(ids: Sequence[Any], size: int) -> tuple[Sequence[int], list[int] | None, list[Diagnostic]]:
    """What a lenient reader reads of ``ids``: the ids of the vocabulary (as
    ints), where each stood (None: all of them, in place), and a ``bad-id``
    diagnostic for each of the rest."""
    try:
        # In C: the common case costs no loop in Python.
        if not ids or (min(ids) >= 0 and max(ids) < size and set(map(type, ids)) == {int}):
            return ids, None, []
    except TypeError:
        pass
    out: list[int] = []
    kept: list[int] = []
    skipped: list[Diagnostic] = []
    for k, t in enumerate(ids):
        i = as_id(t, size)
        if i is not None:
            out.append(i)
            kept.append(k)
        else:
            skipped.append(bad_id(t, k))
    return out, kept, skipped
