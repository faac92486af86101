"""The markup layer: grammar, segments, escaping, the driver's strict and lenient modes."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

import xtml
from xtml.markup import Document, Element, Embed, EndOfMessage, Markers, Text, build, lex_text, to_segments
from xtml.markup.header import escape, parse_header, unescape
from xtml.markup.reference import document_parser, header_parser, parse_header_lark, parse_lexemes

M = Markers("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", ("<|media_begin|>",),
            ("<|media_content|>", "<|media_pad|>"), ("<|media_end|>",), ("<|ph|>",))


def test_grammar_builds_strict() -> None:
    # strict=True turns any LALR conflict or terminal collision into an error.
    document_parser(strict=True)
    header_parser(strict=True)


def test_grammar_text_is_the_grammar_file() -> None:
    from xtml.markup.reference import grammar_text

    assert grammar_text() == (Path(__file__).parent.parent / "grammar" / "xtml.lark").read_text(encoding="utf-8")


@pytest.mark.parametrize("value", ["", "plain", 'a"b', "a&b", "&amp;", "&quot;", '"&"&&""', "x y=\"z\""])
def test_escape_roundtrip(value: str) -> None:
    assert unescape(escape(value)) == value
    assert parse_header(f'tag k="{escape(value)}"') == ("tag", (("k", value),))
    assert parse_header_lark(f'tag k="{escape(value)}"') == ("tag", (("k", value),))


def test_segments_split_attributes_in_four() -> None:
    el = Element("call", (("tool", 'a&"b'), ("index", "1"), ("e", "")), (Text("x"),))
    segs = [(s.text, s.special) for s in to_segments([el], M)]
    assert segs == [
        ("<|open|>", True), ("call", False),
        (" tool", False), ('="', False), ("a&amp;&quot;b", False), ('"', False),
        (" index", False), ('="', False), ("1", False), ('"', False),
        (" e", False), ('="', False), ('"', False),
        ("<|sep|>", True), ("x", False), ("<|close|>", True), ("call", False), ("<|sep|>", True),
    ]


def test_bad_names_refused() -> None:
    with pytest.raises(xtml.MarkupError, match="not a valid tag"):
        to_segments([Element("bad name")], M)
    with pytest.raises(xtml.MarkupError):
        to_segments([Element("ok", (("k=", "v"),))], M)


def test_driver_and_grammar_agree_on_a_document() -> None:
    text = ('<|open|>message role="user"<|sep|>hi<|ph|><|media_begin|>image 1x1<|media_content|>'
            '<|media_pad|><|media_end|><|close|>message<|sep|><|end_of_msg|>'
            '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>')
    lx = lex_text(text, M)
    fast, ref = build(lx), parse_lexemes(lx, source=text)
    assert fast == ref
    assert fast.nodes[1] == EndOfMessage()
    el = fast.nodes[0]
    assert isinstance(el, Element) and el.children[1] == Embed("<|ph|>")
    tail = fast.nodes[2]
    assert isinstance(tail, Element) and not tail.closed
    assert tail.children == (Element("think", closed=False),)


CASES = tomllib.loads((Path(__file__).parent / "data" / "cases" / "markup.toml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", CASES["strict"], ids=[c["says"] for c in CASES["strict"]])
def test_strict_errors_have_offsets(case: dict[str, str]) -> None:
    text = case["text"]
    with pytest.raises(xtml.ParseError, match=case["says"]) as e:
        build(lex_text(text, M), source=text)
    assert e.value.line == 1 and e.value.column is not None
    with pytest.raises(xtml.ParseError):
        parse_lexemes(lex_text(text, M), source=text)


@pytest.mark.parametrize("case", CASES["lenient"], ids=["-".join(c["repairs"]) for c in CASES["lenient"]])
def test_lenient_recovers_and_reports(case: dict[str, Any]) -> None:
    doc = build(lex_text(case["text"], M), lenient=True)
    assert [d.kind for d in doc.diagnostics] == case["repairs"]
    # What was repaired is what a strict parse refuses.
    with pytest.raises(xtml.ParseError):
        build(lex_text(case["text"], M))


def test_lenient_repair_keeps_what_it_can() -> None:
    text = "<|open|>a<|sep|>x<|open|>b<|sep|>y<|close|>a<|sep|><|end_of_msg|><|open|>c<|sep|>cut"
    doc = build(lex_text(text, M), lenient=True)
    a, _end, c = doc.nodes
    assert isinstance(a, Element) and a.children[1] == Element("b", (), (Text("y"),), closed=False)
    assert isinstance(c, Element) and c.children == (Text("cut"),) and not c.closed


def test_depth_limit() -> None:
    deep = "<|open|>a<|sep|>" * 100
    with pytest.raises(xtml.ParseError, match="nested deeper"):
        build(lex_text(deep, M), lenient=True)
    with pytest.raises(xtml.ParseError, match="nested deeper"):
        parse_lexemes(lex_text(deep, M))


def test_markers_checked() -> None:
    with pytest.raises(xtml.TemplateError, match="contained in"):
        Markers("<|a|>", "<|a|>x", "<|s|>", "<|e|>")
    with pytest.raises(xtml.TemplateError, match="two roles"):
        Markers("<|a|>", "<|a|>", "<|s|>", "<|e|>")
    with pytest.raises(xtml.TemplateError, match="empty"):
        Markers("", "<|c|>", "<|s|>", "<|e|>")


def test_document_roundtrip_text() -> None:
    doc = Document((Element("m", (("k", 'v"&'),), (Text("body"), Element("c", (), ()))), EndOfMessage()))
    text = xtml.markup.to_text(doc, M)
    assert build(lex_text(text, M)) == doc
