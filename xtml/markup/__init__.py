"""The markup layer: the XTML language itself, with no notion of chat.

Tree (:mod:`.nodes`) → segments (:mod:`.segments`) → ids happens in
:mod:`xtml.vocab`; ids or text → tree happens here (:mod:`.parse`,
:mod:`.grammar`).
"""

from .header import escape, unescape
from .markers import Markers
from .nodes import Diagnostic, Document, Element, Embed, EndOfMessage, Node, Text
from .parse import Lexemes, build, lex_ids, lex_text
from .segments import Segment, to_segments, to_text

__all__ = [
    "Diagnostic",
    "Document",
    "Element",
    "Embed",
    "EndOfMessage",
    "Lexemes",
    "Markers",
    "Node",
    "Segment",
    "Text",
    "build",
    "escape",
    "lex_ids",
    "lex_text",
    "to_segments",
    "to_text",
    "unescape",
]
