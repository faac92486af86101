"""The reference grammar, ``grammar/xtml.lark``, run by Lark (LALR).

Used for the text form, where errors want line and column and the expected
terminals, and as the reference the fast driver in :mod:`xtml.markup.parse`
is tested against. Lark's exceptions never leave this module: they become
:class:`~xtml.errors.ParseError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..errors import ParseError
from .header import NAME_RE, Header, parse_header
from .markers import TEXT
from .nodes import Document, Element, Embed, EndOfMessage, Node, Text
from .parse import LEXEME_LABEL, MAX_ATTRIBUTES, MAX_DEPTH, Lexemes, excerpt

if TYPE_CHECKING:
    from lark import Lark, Token

GRAMMAR_FILE = "xtml.lark"
GRAMMAR_DATA = "grammar"
"""Where the wheel puts ``grammar/xtml.lark``: inside the package, as data
(``setup.py`` copies it there at build time)."""
GRAMMAR_CHECKOUT = Path(__file__).resolve().parents[2] / "grammar" / GRAMMAR_FILE
"""The file itself, beside the package: what an editable install or a
plain checkout on ``PYTHONPATH`` reads, since neither has a built copy."""


def grammar_text() -> str:
    """The grammar source: the wheel's copy, else the checkout's file."""
    shipped = resources.files("xtml").joinpath(GRAMMAR_DATA).joinpath(GRAMMAR_FILE)
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8")
    try:
        return GRAMMAR_CHECKOUT.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"the XTML grammar is missing: neither xtml/grammar/{GRAMMAR_FILE} in the "
                                f"installed package nor {GRAMMAR_CHECKOUT}; reinstall xtml") from None


@cache
def _lark() -> SimpleNamespace:
    """Lark and the classes built on it, imported on first use: most runs
    (rendering, parsing ids) never need the grammar, and importing Lark
    costs tens of milliseconds at every start of the command line."""
    from lark import Lark, Token, Transformer, v_args
    from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken
    from lark.lexer import Lexer

    class LexemeLexer(Lexer):
        """Feeds Lark lexemes made by :func:`~xtml.markup.parse.lex_ids` or
        :func:`~xtml.markup.parse.lex_text`; ``start_pos`` is the offset."""

        def __init__(self, lexer_conf: Any) -> None:
            pass

        def lex(self, lx: Lexemes) -> Iterator[Token]:  # type: ignore[override]
            for kind, text, off in zip(lx.kinds, lx.texts, lx.offsets):
                yield Token(kind, text, start_pos=off)

    @v_args(inline=True)
    class HeaderTree(Transformer[Token, Header]):
        def header(self, name: Token, *attrs: tuple[str, str]) -> Header:
            return str(name), tuple(attrs)

        def attribute(self, name: Token, value: str) -> tuple[str, str]:
            return str(name), value

        def value(self, *parts: Token) -> str:
            return "".join({"&amp;": "&", "&quot;": '"'}.get(str(p), str(p)) for p in parts)

    class DocTree(Transformer[Token, Any]):
        @v_args(inline=True)
        def open_tag(self, o: Token, text: Token, _s: Token) -> tuple[str, Header, int]:
            # An element is located at its open marker.
            return ("open", _header(text), o.start_pos or 0)

        @v_args(inline=True)
        def close_tag(self, _c: Token, text: Token, _s: Token) -> tuple[str, Header, int]:
            return ("close", _header(text), text.start_pos or 0)

        def element(self, items: list[Any]) -> Element:
            (_, (tag, attrs), at), *body, (_, (ctag, cattrs), off) = items
            if len(attrs) > MAX_ATTRIBUTES:
                raise ParseError(f"a tag with {len(attrs)} attributes (at most {MAX_ATTRIBUTES})", offset=off)
            if ctag != tag or cattrs:
                raise ParseError(f"close tag {excerpt(ctag)} does not match open element {excerpt(tag)}",
                                 offset=off)
            return Element(tag, attrs, tuple(_node(x, Token) for x in body), offset=at)

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

    return SimpleNamespace(Lark=Lark, LexemeLexer=LexemeLexer, HeaderTree=HeaderTree, DocTree=DocTree,
                           LarkError=LarkError, UnexpectedCharacters=UnexpectedCharacters,
                           UnexpectedInput=UnexpectedInput, UnexpectedToken=UnexpectedToken)


@cache
def document_parser(strict: bool = False) -> Lark:
    """The LALR parser of rule ``document`` over lexemes."""
    lk = _lark()
    return lk.Lark(grammar_text(), start="document", parser="lalr", lexer=lk.LexemeLexer,  # type: ignore[no-any-return]
                   strict=strict)


@cache
def _building_parser() -> Lark:
    # The same grammar, building nodes as it reduces: no parse tree is made
    # and walked again afterwards (which cost more than the parse itself).
    lk = _lark()
    return lk.Lark(grammar_text(), start="document", parser="lalr", lexer=lk.LexemeLexer,  # type: ignore[no-any-return]
                   transformer=lk.DocTree())


@cache
def header_parser(strict: bool = False) -> Lark:
    """The LALR parser of rule ``header`` over characters."""
    return _lark().Lark(grammar_text(), start="header", parser="lalr", lexer="contextual",  # type: ignore[no-any-return]
                        strict=strict)


def parse_header_lark(text: str) -> Header:
    """Parse a tag header with the grammar; :class:`ParseError` if malformed
    (``offset`` is the position in ``text``)."""
    lk = _lark()
    try:
        tree = header_parser().parse(text)
    except lk.UnexpectedInput as e:
        raise ParseError(f"malformed tag header {excerpt(text)}", offset=e.pos_in_stream or 0) from None
    return lk.HeaderTree().transform(tree)  # type: ignore[no-any-return]


class _HeaderError(ParseError):
    """A malformed header: ``at`` is the offset of its lexeme, ``offset`` the
    position inside it."""

    def __init__(self, e: ParseError, at: int) -> None:
        super().__init__(e.msg, offset=e.offset)
        self.at = at


def _header(tok: Token) -> Header:
    # The header regex is the grammar's ``header`` rule (tests check they
    # agree on random input), cached, and fast: the Lark header parser costs
    # microseconds per character, which a multi-megabyte header would pay.
    text = str(tok)
    hdr = parse_header(text)
    if hdr is not None:
        return hdr
    raise _HeaderError(ParseError(f"malformed tag header {excerpt(text)}", offset=_header_stop(text)),
                       tok.start_pos or 0)


_NAME_AT = re.compile(NAME_RE)
# Possessive repeats: a value is read one way only, and ``re`` then keeps no
# backtracking state per character (tens of bytes each, for a value of
# megabytes).
_ATTR_AT = re.compile(rf' {NAME_RE}="(?:[^"&]|&amp;|&quot;)*+"')
# The longest start of an attribute: where it stops is the first character
# no header could continue with.
_PARTIAL_ATTR_AT = re.compile(rf'(?: (?:{NAME_RE}(?:="(?:[^"&]|&amp;|&quot;)*+)?)?)?')


def _header_stop(text: str) -> int:
    """Where a malformed header goes wrong: the first character that no
    well-formed header could have there (its length if it is cut short)."""
    m = _NAME_AT.match(text)
    if m is None:
        return 0
    pos = m.end()
    while (a := _ATTR_AT.match(text, pos)) is not None:
        pos = a.end()
    p = _PARTIAL_ATTR_AT.match(text, pos)
    return p.end() if p is not None else pos


def _node(x: Any, token: type) -> Node:
    if isinstance(x, token):
        return Text(str(x))
    return x  # type: ignore[no-any-return]


def parse_lexemes(lx: Lexemes, *, source: str | None = None) -> Document:
    """Parse lexemes with the grammar. ``source`` (the text form) turns
    offsets into line and column in errors."""
    # The depth limit is the driver's (the two must agree); it also keeps
    # every later walk of the tree far from Python's recursion limit.
    depth = 0
    for k in lx.kinds:
        if k == "OPEN":
            depth += 1
            if depth > MAX_DEPTH:
                raise ParseError(f"elements nested deeper than {MAX_DEPTH}", offset=0)
        elif k == "CLOSE":
            depth = max(0, depth - 1)
    lk = _lark()
    try:
        doc = _building_parser().parse(lx)
    except lk.UnexpectedToken as e:
        tok = e.token
        off = tok.start_pos if tok.type != "$END" else lx.end
        got = "end of input" if tok.type == "$END" else (
            f"text {excerpt(str(tok), 40)}" if tok.type == TEXT else f"marker {excerpt(str(tok))}")
        wanted = sorted({LEXEME_LABEL.get(x, "end of input" if x == "$END" else x) for x in e.expected})
        expected = wanted[0] if len(wanted) == 1 else ", ".join(wanted[:-1]) + " or " + wanted[-1]
        raise _located(f"unexpected {got}; expected {expected}", off or 0, source) from None
    except lk.UnexpectedCharacters as e:
        raise _located("unexpected input", e.pos_in_stream or 0, source) from None
    except _HeaderError as e:
        # In text the header's characters are offsets too; in ids the
        # header is one run of tokens, located at its start.
        raise _located(e.msg, e.at + (e.offset if source is not None else 0), source) from None
    except ParseError as e:
        raise _located(e.msg, e.offset, source) from None
    except lk.LarkError as e:
        raise ParseError(f"invalid XTML: {excerpt(str(e))}", offset=0) from None
    assert isinstance(doc, Document)
    return doc


def _located(msg: str, off: int, source: str | None) -> ParseError:
    return ParseError(msg, offset=off, source=source)
