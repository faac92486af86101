"""The fast driver (:func:`xtml.markup.parse.build`) against the Lark reference
grammar (:func:`xtml.markup.reference.parse_lexemes`), and the header regex
against the grammar's ``header`` rule, on random input.

Both must accept with equal documents or both raise ParseError.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.helpers.strategies import K3, MARKERS, PLACEHOLDER, documents, id_lists, vocab
from xtml.errors import ParseError
from xtml.markup import to_text
from xtml.markup.header import parse_header
from xtml.markup.nodes import Document, Element, Node, Text
from xtml.markup.parse import MAX_DEPTH, Lexemes, build, lex_text
from xtml.markup.reference import parse_header_lark, parse_lexemes

M = K3.markers
SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _run(fn: Any, lx: Lexemes) -> tuple[str, Any]:
    try:
        return "ok", fn(lx)
    except ParseError as e:
        return "error", e


def check_equivalent(lx: Lexemes, *, record: bool = True) -> tuple[str, Any]:
    """Both accept with equal documents, or both refuse."""
    kinds = list(lx.kinds)
    fast = _run(build, lx)
    assert lx.kinds == kinds, "build changed its input"
    ref = _run(parse_lexemes, lx)
    if record:
        event(f"outcome: {fast[0]}")
    assert fast[0] == ref[0], (f"build: {fast[1]!r}\nparse_lexemes: {ref[1]!r}\n"
                               f"lexemes: {list(zip(lx.kinds, lx.texts, strict=True))!r}")
    if fast[0] == "ok":
        assert fast[1] == ref[1]
    return fast


# -- random lexeme sequences ---------------------------------------------------------

SHORT_TEXTS = ("message", "a", "b", "think", 'b role="x"', 'a k="v"', 'a k="&amp;&quot;"', 'a k="&"', "a ", " a",
               'a k=v', "", "x y", "image 2x2", "\n", "1a", 'a k="v" ', 'a  k="v"', "a\n")


@st.composite
def soup_lexemes(draw: st.DrawFn) -> Lexemes:
    piece = st.one_of(st.sampled_from(MARKERS), st.sampled_from(SHORT_TEXTS), st.text(max_size=3))
    return lex_text("".join(draw(st.lists(piece, max_size=30))), M)


@SLOW
@given(soup_lexemes())
def test_random_lexemes_agree(lx: Lexemes) -> None:
    check_equivalent(lx)


# Structured input: well-formed documents, and ones with a single mutation.

def _normal(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    """Adjacent text merged and empty text dropped, as a parse returns it."""
    out: list[Node] = []
    for n in nodes:
        if isinstance(n, Text):
            if not n.text:
                continue
            if out and isinstance(out[-1], Text):
                out[-1] = Text(out[-1].text + n.text)
                continue
        elif isinstance(n, Element):
            n = Element(n.tag, n.attrs, _normal(n.children), n.closed)
        out.append(n)
    return tuple(out)


@SLOW
@given(documents())
def test_well_formed_documents_parse_back(nodes: list[Node]) -> None:
    text = to_text(nodes, M)
    outcome, doc = check_equivalent(lex_text(text, M))
    assert outcome == "ok"
    assert doc == Document(_normal(tuple(nodes)))


@SLOW
@given(documents(), st.data())
def test_mutated_documents_agree(nodes: list[Node], data: st.DataObject) -> None:
    pieces = list(lex_text(to_text(nodes, M), M).texts)
    op = data.draw(st.sampled_from(["delete", "insert", "swap", "replace"]), label="op")
    if op == "insert" or not pieces:
        at = data.draw(st.integers(0, len(pieces)), label="at")
        pieces.insert(at, data.draw(st.one_of(st.sampled_from(MARKERS), st.sampled_from(SHORT_TEXTS))))
    else:
        at = data.draw(st.integers(0, len(pieces) - 1), label="at")
        if op == "delete":
            del pieces[at]
        elif op == "swap":
            other = data.draw(st.integers(0, len(pieces) - 1), label="other")
            pieces[at], pieces[other] = pieces[other], pieces[at]
        else:
            pieces[at] = data.draw(st.sampled_from(MARKERS), label="marker")
    check_equivalent(lex_text("".join(pieces), M))


@SLOW
@given(id_lists(max_size=40))
def test_random_ids_agree(ids: list[int]) -> None:
    check_equivalent(K3.bind(vocab()).lex(ids))


@SLOW
@given(documents())
def test_ids_and_text_lex_alike(nodes: list[Node]) -> None:
    """Markup without marker literals in its text: the ids and the text form
    parse to the same document."""
    b = K3.bind(vocab())
    from_ids = build(b.lex(b.encode(nodes)))
    from_text = build(lex_text(to_text(nodes, M), M))
    assert from_ids == from_text


@settings(deadline=None, max_examples=30)
@given(st.integers(MAX_DEPTH - 3, MAX_DEPTH + 3), st.booleans(), st.booleans())
def test_depth_limit_agrees(depth: int, closed: bool, end: bool) -> None:
    text = (M.open + "a" + M.sep) * depth
    if closed:
        text += (M.close + "a" + M.sep) * depth + (M.end if end else "")
    outcome, _ = check_equivalent(lex_text(text, M))
    if depth > MAX_DEPTH:
        assert outcome == "error"


def test_embeds_agree() -> None:
    for text in (
        f"{M.open}a{M.sep}{PLACEHOLDER}{M.close}a{M.sep}{M.end}",
        f"{M.open}a{M.sep}<|media_begin|>x<|media_pad|>y<|media_end|>{M.close}a{M.sep}{M.end}",
        f"{M.open}a{M.sep}<|media_begin|>x{M.close}a{M.sep}{M.end}",
        f"{M.open}a{M.sep}<|media_content|>{M.close}a{M.sep}{M.end}",
        f"{M.open}a{M.sep}<|media_end|>{M.close}a{M.sep}{M.end}",
        f"{PLACEHOLDER}{M.open}a{M.sep}{M.close}a{M.sep}{M.end}",
        f"{M.open}a{M.sep}{M.open}b{M.sep}{PLACEHOLDER}",
    ):
        check_equivalent(lex_text(text, M), record=False)


# -- headers -------------------------------------------------------------------------

HEADER_ALPHABET = ("a", "b", "Z", "_", "1", ".", ":", "-", " ", "=", '"', "&", "amp;", "quot;", "\n", "é", "x y")


@st.composite
def header_strings(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 2)) == 0:
        return "".join(draw(st.lists(st.sampled_from(HEADER_ALPHABET), max_size=14)))
    # Mostly well-formed: a name and attributes, with one piece maybe spoiled.
    name = draw(st.sampled_from(["a", "message", "x.y", "_1", "1a", "", "a b"]))
    attrs = draw(st.lists(st.tuples(st.sampled_from(["k", "role", "a-b", "", "1", "k k"]),
                                    st.lists(st.sampled_from(["v", " ", "&amp;", "&quot;", "&", "amp;", "=", "\n",
                                                              "é", '"']), max_size=4).map("".join)),
                          max_size=3))
    s = name + "".join(f' {k}="{v}"' for k, v in attrs)
    if s and draw(st.integers(0, 2)) == 0:
        i = draw(st.integers(0, len(s) - 1))
        s = s[:i] + draw(st.sampled_from(["", " ", '"', "=", "&", "  "])) + s[i + 1:]
    return s


@SLOW
@given(header_strings())
def test_header_regex_agrees_with_grammar(s: str) -> None:
    fast = parse_header(s)
    try:
        ref = parse_header_lark(s)
    except ParseError:
        ref = None
    event(f"header ok: {fast is not None}")
    assert fast == ref
