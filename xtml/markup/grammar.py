"""The reference grammar, ``grammar/xtml.lark``, run by Lark (LALR).

Used for the text form, where errors want line and column and the expected
terminals, and as the reference the fast driver in :mod:`xtml.markup.parse`
is tested against. Lark's exceptions never leave this module: they become
:class:`~xtml.errors.ParseError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.lexer import Lexer

from ..errors import ParseError
from .header import Header
from .markers import TEXT
from .nodes import Document, Element, Embed, EndOfMessage, Node, Text
from .parse import _LABEL, MAX_ATTRIBUTES, MAX_DEPTH, Lexemes

GRAMMAR_PACKAGE = "xtml.grammar"
GRAMMAR_FILE = "xtml.lark"


def grammar_text() -> str:
    """The grammar source, as shipped in the package."""
    return resources.files(GRAMMAR_PACKAGE).joinpath(GRAMMAR_FILE).read_text(encoding="utf-8")


class LexemeLexer(Lexer):
    """Feeds Lark lexemes made by :func:`~xtml.markup.parse.lex_ids` or
    :func:`~xtml.markup.parse.lex_text`; ``start_pos`` is the offset."""

    def __init__(self, lexer_conf: Any) -> None:
        pass

    def lex(self, lx: Lexemes) -> Iterator[Token]:  # type: ignore[override]
        for kind, text, off in zip(lx.kinds, lx.texts, lx.offsets):
            yield Token(kind, text, start_pos=off)


@cache
def document_parser(strict: bool = False) -> Lark:
    """The LALR parser of rule ``document`` over lexemes."""
    return Lark(grammar_text(), start="document", parser="lalr", lexer=LexemeLexer, strict=strict)


@cache
def header_parser(strict: bool = False) -> Lark:
    """The LALR parser of rule ``header`` over characters."""
    return Lark(grammar_text(), start="header", parser="lalr", lexer="contextual", strict=strict)


@v_args(inline=True)
class _HeaderTree(Transformer[Token, Header]):
    def header(self, name: Token, *attrs: tuple[str, str]) -> Header:
        return str(name), tuple(attrs)

    def attribute(self, name: Token, value: str) -> tuple[str, str]:
        return str(name), value

    def value(self, *parts: Token) -> str:
        return "".join({"&amp;": "&", "&quot;": '"'}.get(str(p), str(p)) for p in parts)


def parse_header_lark(text: str) -> Header:
    """Parse a tag header with the grammar; :class:`ParseError` if malformed."""
    try:
        tree = header_parser().parse(text)
    except UnexpectedInput as e:
        raise ParseError(f"malformed tag header {text!r}", offset=e.pos_in_stream or 0) from None
    return _HeaderTree().transform(tree)


class _DocTree(Transformer[Token, Any]):
    @v_args(inline=True)
    def open_tag(self, o: Token, text: Token, _s: Token) -> tuple[str, Header, int]:
        # An element is located at its open marker.
        return ("open", parse_header_lark(str(text)), o.start_pos or 0)

    @v_args(inline=True)
    def close_tag(self, _c: Token, text: Token, _s: Token) -> tuple[str, Header, int]:
        return ("close", parse_header_lark(str(text)), text.start_pos or 0)

    def element(self, items: list[Any]) -> Element:
        (_, (tag, attrs), at), *body, (_, (ctag, cattrs), off) = items
        if len(attrs) > MAX_ATTRIBUTES:
            raise ParseError(f"a tag with {len(attrs)} attributes (at most {MAX_ATTRIBUTES})", offset=off)
        if ctag != tag or cattrs:
            raise ParseError(f"close tag {ctag!r} does not match open element {tag!r}", offset=off)
        return Element(tag, attrs, tuple(_node(x) for x in body), offset=at)

    def embed(self, items: list[Token]) -> Embed:
        return Embed("".join(str(t) for t in items))

    def message(self, items: list[Any]) -> list[Node]:
        return [items[0], EndOfMessage()]

    def tail(self, items: list[Any]) -> Element:
        (_, (tag, attrs), at) = items[0]
        return Element(tag, attrs, tuple(items[1:]), closed=False, offset=at)

    def document(self, items: list[Any]) -> Document:
        nodes: list[Node] = []
        for it in items:
            if isinstance(it, list):
                nodes.extend(it)
            else:
                nodes.append(it)
        return Document(tuple(nodes))


def _node(x: Any) -> Node:
    if isinstance(x, Token):
        return Text(str(x))
    return x  # type: ignore[no-any-return]


def parse_lexemes(lx: Lexemes, *, source: str | None = None) -> Document:
    """Parse lexemes with the grammar. ``source`` (the text form) turns
    offsets into line and column in errors."""
    # Lark's LALR driver is iterative, but the transformer recurses on depth.
    depth = 0
    for k in lx.kinds:
        if k == "OPEN":
            depth += 1
            if depth > MAX_DEPTH:
                raise ParseError(f"elements nested deeper than {MAX_DEPTH}", offset=0)
        elif k == "CLOSE":
            depth = max(0, depth - 1)
    try:
        tree = document_parser().parse(lx)
        doc = _DocTree().transform(tree)
    except UnexpectedToken as e:
        tok = e.token
        off = tok.start_pos if tok.type != "$END" else lx.end
        got = "end of input" if tok.type == "$END" else (
            f"text {str(tok)[:40]!r}" if tok.type == TEXT else f"marker {str(tok)!r}")
        wanted = sorted({_LABEL.get(x, "end of input" if x == "$END" else x) for x in e.expected})
        expected = wanted[0] if len(wanted) == 1 else ", ".join(wanted[:-1]) + " or " + wanted[-1]
        raise _located(f"unexpected {got}; expected {expected}", off or 0, source) from None
    except UnexpectedCharacters as e:
        raise _located("unexpected input", e.pos_in_stream or 0, source) from None
    except ParseError as e:
        raise _located(e.msg, e.offset, source) from None
    except LarkError as e:
        # VisitError wraps errors raised inside the transformer.
        orig = getattr(e, "orig_exc", None)
        if isinstance(orig, ParseError):
            raise _located(orig.msg, orig.offset, source) from None
        raise ParseError(f"invalid XTML: {e}", offset=0) from None
    assert isinstance(doc, Document)
    return doc


def _located(msg: str, off: int, source: str | None) -> ParseError:
    if source is None:
        return ParseError(msg, offset=off)
    line = source.count("\n", 0, off) + 1
    col = off - (source.rfind("\n", 0, off) + 1) + 1
    return ParseError(msg, offset=off, line=line, column=col)
