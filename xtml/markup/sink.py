"""Markup as a stream of events, in document order.

A dialect renders by calling a sink: :class:`TreeSink` turns the events
into a tree, and a tokenizer binding can turn the same events straight into
ids. One rendering function thus feeds both, and the two cannot disagree.
"""

from __future__ import annotations

from typing import Protocol

from .nodes import Element, Embed, EndOfMessage, Node, Text

Attrs = tuple[tuple[str, str], ...]


class MarkupSink(Protocol):
    """What a renderer may emit."""

    def open(self, tag: str, attrs: Attrs = ()) -> None:
        """An open tag; its element lasts until the matching :meth:`close`."""

    def close(self) -> None:
        """The close tag of the innermost open element."""

    def text(self, text: str, stable: bool = False) -> None:
        """Body text (``stable``: recurs across requests, may be cached)."""

    def element(self, tag: str, attrs: Attrs, text: str, stable: bool = False) -> None:
        """An element holding only ``text``: open, text, close."""

    def embed(self, raw: str) -> None:
        """An embed span."""

    def end(self) -> None:
        """The end-of-message marker."""


class TreeSink:
    """A sink that builds the tree. Elements still open at the end (the
    generation prompt) come out with ``closed=False``."""

    __slots__ = ("_stack", "top")

    def __init__(self) -> None:
        self.top: list[Node] = []
        self._stack: list[tuple[str, Attrs, list[Node]]] = []

    def _add(self, node: Node) -> None:
        (self._stack[-1][2] if self._stack else self.top).append(node)

    def open(self, tag: str, attrs: Attrs = ()) -> None:
        self._stack.append((tag, attrs, []))

    def close(self) -> None:
        tag, attrs, children = self._stack.pop()
        self._add(Element(tag, attrs, tuple(children)))

    def text(self, text: str, stable: bool = False) -> None:
        if text:
            self._add(Text(text, stable))

    def element(self, tag: str, attrs: Attrs, text: str, stable: bool = False) -> None:
        self._add(Element(tag, attrs, (Text(text, stable),) if text else ()))

    def embed(self, raw: str) -> None:
        self._add(Embed(raw))

    def end(self) -> None:
        self._add(EndOfMessage())

    def finish(self) -> list[Node]:
        """The top-level nodes; closes what is still open as unclosed."""
        node: Element | None = None
        while self._stack:
            tag, attrs, children = self._stack.pop()
            node = Element(tag, attrs, (*children, node) if node is not None else tuple(children), closed=False)
        if node is not None:
            self.top.append(node)
        return self.top
