"""Tree → segments → text.

A segment is ``(text, special)``. Each segment is tokenized on its own and the
ids concatenated, so where segments are split decides the token ids. The rules
(spec.md, "Segmentation") are: each marker is one special segment; an embed is
one special segment; the tag name is one segment; each attribute is four
segments `` KEY``, ``="``, the escaped value, ``"``; every body text is one
segment; empty strings make no segment.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from ..errors import MarkupError
from .header import escape, is_name
from .markers import Markers
from .nodes import Document, Element, Embed, EndOfMessage, Node, Text
from .parse import MAX_ATTRIBUTES


class Segment(NamedTuple):
    """One piece of rendered output."""

    text: str
    """The characters."""
    special: bool
    """True for markers and embeds (encoded as special ids), False for
    ordinary text (encoded as plain text, whatever it contains)."""


def open_tag(el: Element, markers: Markers, path: str = "") -> list[Segment]:
    """The segments of ``el``'s open tag."""
    check_name(el.tag, path)
    if len(el.attrs) > MAX_ATTRIBUTES:
        raise MarkupError(f"a tag with {len(el.attrs)} attributes (at most {MAX_ATTRIBUTES})", path=path)
    out = [Segment(markers.open, True), Segment(el.tag, False)]
    for key, value in el.attrs:
        check_name(key, path)
        out.append(Segment(" " + key, False))
        out.append(Segment('="', False))
        if value:
            out.append(Segment(escape(value), False))
        out.append(Segment('"', False))
    out.append(Segment(markers.sep, True))
    return out


def close_tag(tag: str, markers: Markers) -> list[Segment]:
    """The segments of a close tag."""
    return [Segment(markers.close, True), Segment(tag, False), Segment(markers.sep, True)]


_good_names: set[str] = set()


def check_name(name: str, path: str) -> None:
    """Refuse tag names and keys the grammar would not read back."""
    if name in _good_names:
        return
    if not isinstance(name, str) or not is_name(name):
        raise MarkupError(f"{name!r} is not a valid tag or attribute name", path=path)
    if len(_good_names) < 65536:
        _good_names.add(name)


def iter_segments(nodes: Iterable[Node], markers: Markers, path: str = "") -> Iterator[Segment]:
    """Segments of a node sequence, in order."""
    for i, node in enumerate(nodes):
        if isinstance(node, Text):
            if node.text:
                yield Segment(node.text, False)
        elif isinstance(node, Element):
            here = f"{path}/{node.tag}[{i}]" if path else f"{node.tag}[{i}]"
            yield from open_tag(node, markers, here)
            yield from iter_segments(node.children, markers, here)
            if node.closed:
                yield from close_tag(node.tag, markers)
        elif isinstance(node, Embed):
            if node.raw:
                yield Segment(node.raw, True)
        elif isinstance(node, EndOfMessage):
            yield Segment(markers.end, True)
        else:
            raise MarkupError(f"not a markup node: {type(node).__name__}", path=path)


def to_segments(doc: Document | Iterable[Node], markers: Markers) -> list[Segment]:
    """A document (or nodes) as a list of segments."""
    nodes = doc.nodes if isinstance(doc, Document) else doc
    return list(iter_segments(nodes, markers))


def to_text(doc: Document | Iterable[Node], markers: Markers) -> str:
    """The canonical text form: segments concatenated."""
    return "".join(s.text for s in to_segments(doc, markers))
