"""Where each element of a markup tree lies in its token ids.

:func:`encode_spans` gives the ids of a tree (equal to
:meth:`~xtml.vocab.Binding.encode`: the same cached constant pieces, the
same one batch for all body text) and, for every element, the id offsets of
its open tag, body and close tag. Loss masks and per-element token counts are
computed from these offsets, so they can never drift from the ids. This is
markup-level code: it knows elements, not messages or channels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from typing import NamedTuple

from ..markup.nodes import Document, Element, Node
from .binding import Binding, TreeMarks

__all__ = ["ElementSpan", "EncodedTree", "encode_spans"]


class ElementSpan(NamedTuple):
    """One element's place in the ids. Offsets are id indexes; ``end`` is
    exclusive. (A named tuple: one is made per element per render.)"""

    element: Element
    parent: int
    """Index of the enclosing element in :attr:`EncodedTree.elements`; -1
    at top level."""
    depth: int
    """0 at top level."""
    start: int
    """First id of the open tag."""
    body: int
    """First id after the open tag."""
    body_end: int
    """First id of the close tag (``end`` for an unclosed element)."""
    end: int
    """One past the last id of the close tag."""


@dataclass(frozen=True, slots=True)
class EncodedTree:
    """What :func:`encode_spans` returns."""

    ids: list[int]
    elements: list[ElementSpan]
    """Every element, in document order (a parent before its children)."""
    ends: list[int]
    """Offsets of the end-of-message markers, in order."""

    def top(self) -> list[int]:
        """Indexes (in :attr:`elements`) of the top-level elements."""
        return [i for i, s in enumerate(self.elements) if s.parent < 0]

    def subtree(self, index: int) -> range:
        """Indexes of ``elements[index]`` and everything inside it: document
        order keeps a subtree contiguous."""
        els = self.elements
        depth = els[index].depth
        k = index + 1
        while k < len(els) and els[k].depth > depth:
            k += 1
        return range(index, k)


def encode_spans(binding: Binding, doc: Document | Sequence[Node]) -> EncodedTree:
    """The ids of a tree and the span of each element: the binding's walk
    (:meth:`Binding.chunks`, the same pieces :meth:`Binding.encode` joins),
    with piece offsets summed once at the end."""
    marks = TreeMarks()
    chunks = binding.chunks(doc, marks)
    off = list(accumulate(map(len, chunks), initial=0))
    spans = [
        ElementSpan(el, parent, depth, off[first], off[first + 1], off[close], off[after])
        for el, (parent, depth, first, close, after) in zip(marks.elements, marks.records)
    ]
    return EncodedTree(list(chain.from_iterable(chunks)), spans, [off[c] for c in marks.end_chunks])
