"""The markup tree: what XTML means, independent of tokens and of chat.

Nodes are slotted dataclasses, compared by value. Treat them as immutable:
they are not frozen only because frozen dataclasses cost several times more
to create, and parsing creates one per element and text run.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Text:
    """Body text. Never escaped: in token ids it is ordinary text."""

    text: str
    """The characters, exactly as rendered."""
    stable: bool = field(default=False, compare=False)
    """A hint that this text recurs across requests (template prose, tool
    declarations), so an encoder may cache its ids. Not part of the meaning."""


@dataclass(slots=True)
class Embed:
    """An opaque span made by a processor, rendered as one special segment.

    Image prompts are embeds: ``<|media_begin|>image 2x2<|media_content|>...``.
    The markup layer only keeps the span; what it means is the dialect's call.
    """

    raw: str
    """The span in text form: marker strings and the text between them."""


@dataclass(slots=True)
class Element:
    """An element: ``OPEN tag attrs SEP children CLOSE tag SEP``."""

    tag: str
    """The tag name, ordinary text."""
    attrs: tuple[tuple[str, str], ...] = ()
    """Attributes in order, values unescaped."""
    children: tuple[Node, ...] = ()
    """Elements, text and embeds, in order."""
    closed: bool = True
    """False for a trailing open tag (the generation prompt) or, in lenient
    parses, an element the input never closed."""
    offset: int = field(default=-1, compare=False)
    """Where the open tag starts in the parsed input (token or character
    offset); -1 for trees that were not parsed. Not part of the meaning."""

    def attr(self, key: str, default: str | None = None) -> str | None:
        """The value of the first attribute named ``key``."""
        for k, v in self.attrs:
            if k == key:
                return v
        return default


@dataclass(slots=True)
class EndOfMessage:
    """The end-of-message marker that follows every top-level element."""


Node = Element | Text | Embed | EndOfMessage


@dataclass(frozen=True, slots=True)
class Document:
    """A parsed or rendered XTML document: top-level nodes in order."""

    nodes: tuple[Node, ...] = ()
    """Top-level elements, each followed by :class:`EndOfMessage`, then
    optionally a chain of unclosed elements (the generation prompt)."""
    diagnostics: tuple[Diagnostic, ...] = field(default=())
    """What a lenient parse repaired, in input order."""


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """A problem found in input that a lenient parse recovered from."""

    kind: str
    """A stable, short name: ``unclosed``, ``stray-close``, ``mismatched-close``,
    ``stray-text``, ``truncated`` ..."""
    offset: int
    """Token offset (ids) or character offset (text) where it was found."""
    message: str
    """A human-readable description."""

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "offset": self.offset, "message": self.message}
