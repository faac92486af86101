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

from ..markup.nodes import Document, Element, Embed, EndOfMessage, Node, Text
from ..markup.segments import Segment
from .binding import Binding

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


# An element as the walk records it: parent, depth, and the chunk indexes of
# its open tag, its close tag and the chunk after it.
_Record = list[int]


def encode_spans(binding: Binding, doc: Document | Sequence[Node]) -> EncodedTree:
    """The ids of a tree and the span of each element.

    The walk mirrors :meth:`Binding.encode` piece for piece (the ids are
    equal; the tests hold it to that) and notes, per element, which chunk of
    ids its tags are; chunk offsets are summed once at the end, after the
    batch encode has filled in the body text."""
    chunks: list[list[int]] = []
    texts: list[str] = []
    slots: list[int] = []
    elements: list[Element] = []
    records: list[_Record] = []
    end_chunks: list[int] = []
    nodes = doc.nodes if isinstance(doc, Document) else doc
    _walk(binding, nodes, -1, 0, chunks, texts, slots, elements, records, end_chunks)
    if texts:
        for slot, ids in zip(slots, binding.vocab.ids_of(texts)):
            chunks[slot] = ids
    off = list(accumulate(map(len, chunks), initial=0))
    spans = [
        ElementSpan(el, parent, depth, off[first], off[first + 1], off[close], off[after])
        for el, (parent, depth, first, close, after) in zip(elements, records)
    ]
    return EncodedTree(list(chain.from_iterable(chunks)), spans, [off[c] for c in end_chunks])


def _walk(b: Binding, nodes: Sequence[Node], parent: int, depth: int, chunks: list[list[int]], texts: list[str],
          slots: list[int], elements: list[Element], records: list[_Record], end_chunks: list[int]) -> None:
    for node in nodes:
        if type(node) is Text:
            if not node.text:
                continue
            if node.stable:
                chunks.append(b._stable_ids(node.text))
            else:
                slots.append(len(chunks))
                chunks.append([])
                texts.append(node.text)
        elif type(node) is Element:
            rec: _Record = [parent, depth, len(chunks), 0, 0]
            me = len(records)
            elements.append(node)
            records.append(rec)
            chunks.append(b._open_ids(node.tag, node.attrs))
            if node.children:
                _walk(b, node.children, me, depth + 1, chunks, texts, slots, elements, records, end_chunks)
            rec[3] = len(chunks)
            if node.closed:
                chunks.append(b._close_ids(node.tag))
            rec[4] = len(chunks)
        elif type(node) is EndOfMessage:
            end_chunks.append(len(chunks))
            chunks.append([b.marker_ids[b.markers.end]])
        elif type(node) is Embed:
            chunks.append(b._segment_ids(Segment(node.raw, True)))
        else:
            raise TypeError(f"not a markup node: {type(node).__name__}")
