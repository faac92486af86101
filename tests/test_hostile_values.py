"""Hostile values (SECURITY.md, promises 10 to 12).

1. Numbers and text Python refuses: integers past Python's digit limit,
   digits that are not ASCII, sizes past a float's range, lone surrogates.
2. Non-standard JSON from a model: NaN, Infinity, 1e999 where JSON is read.
3. Media: image headers that claim huge sizes, files that are not files.

Each class has named regression tests for the cases found by reading the
code, and hypothesis properties aimed at the class.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import struct
import sys
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import xtml
import xtml.plugins
import xtml.testing as xt
from tests.helpers.cli import run
from tests.helpers.media import user, wav
from tests.helpers.tokenizers import deepseek_path, k3_vocab
from xtml.chat.template_file import builtin_files
from xtml.markup.header import escape, int_value, number_value
from xtml.markup.segments import Segment
from xtml.markup.sink import MarkupSink
from xtml.plugins import ContentExtension, Context, media
from xtml.plugins.jsonfmt import NotStandard, loads
from xtml.vocab.vocabulary import Vocabulary

K3 = xtml.load("kimi-k3")
BASE = xtml.load("xtml-base")
BASE_TEXT = builtin_files()["xtml-base"].read_text(encoding="utf-8")
K3_TEXT = builtin_files()["kimi-k3"].read_text(encoding="utf-8")

LIMIT = sys.get_int_max_str_digits()
HUGE = "9" * (LIMIT + 700)  # an integer Python's int() refuses to read
HUGE_INT = 10 ** (LIMIT + 10)  # one it refuses to print
CONV = [{"role": "user", "content": "hi"}]
SUSPICIOUS = (TypeError, UnicodeEncodeError, OverflowError, ZeroDivisionError, KeyError, IndexError,
              AttributeError, AssertionError)

pytestmark = pytest.mark.skipif(LIMIT == 0, reason="Python's integer digit limit is switched off")


def vocab() -> xtml.Vocabulary:
    return k3_vocab()


@pytest.fixture(scope="module")
def base_vocab() -> xtml.Vocabulary:
    return xtml.load_tokenizer(deepseek_path(), add_special_tokens=BASE.markers.all())


def strict_json(text: str) -> Any:
    """json.loads as a strict reader (and other languages') reads JSON."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    def finite(s: str) -> float:
        v = float(s)
        if v in (float("inf"), float("-inf")):
            raise ValueError(f"{s} overflows")
        return v

    return json.loads(text, parse_constant=refuse, parse_float=finite)


def has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def completion(body: str, *, index: str = "1", tool: str = "f") -> str:
    """A K3 completion (non-thinking prompt) whose one call holds ``body``."""
    return (f'<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="{tool}" index="{index}"<|sep|>{body}'
            "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>")


def argument(key: str, typ: str, value: str) -> str:
    return f'<|open|>argument key="{key}" type="{typ}"<|sep|>{value}<|close|>argument<|sep|>'


def json_block(text: str) -> str:
    return f'<|open|>json type="object"<|sep|>{text}<|close|>json<|sep|>'


def parse_completion(text: str, *, lenient: bool) -> dict[str, Any]:
    ids = K3.completion_ids(text, vocab())
    return K3.parse(ids, vocab(), completion=True, thinking=False, lenient=lenient)


def renders_back(msg: dict[str, Any], *, thinking: bool = False) -> dict[str, Any]:
    """A parsed message, rendered again after a user turn: its normal form,
    checked against a parse of its ids."""
    msg = {k: v for k, v in msg.items() if k != "diagnostics"}
    req = [*CONV, msg]
    want = K3.normalize(req, thinking=thinking, add_generation_prompt=False)
    assert K3.parse(K3.encode(req, vocab(), thinking=thinking, add_generation_prompt=False), vocab()) == want
    return want


def the_open_marker_at(text: str, offset: int) -> str:
    """The header after the open marker at token ``offset`` of a completion."""
    ids = K3.completion_ids(text, vocab())
    b = K3.bind(vocab())
    assert ids[offset] == b.marker_ids[K3.markers.open], "the offset is not an element's open marker"
    rest = vocab().decode(ids[offset + 1 : offset + 40])
    return rest.split(K3.markers.sep)[0]


# Integers past Python's digit limit, as JSON text.
huge_digits = st.builds(lambda n, first, fill, neg: ("-" if neg else "") + first + fill * (n - 1),
                        st.integers(LIMIT + 1, LIMIT + 3000), st.sampled_from("123456789"),
                        st.sampled_from("0123456789"), st.booleans())
# Digits int() reads and the format does not: other scripts' decimal digits
# (category Nd), superscripts and fractions (No), roman numerals (Nl).
unicode_digits = st.text(st.characters(categories=["Nd", "No", "Nl"]), min_size=1, max_size=6).filter(
    lambda s: not s.isascii())


# =====================================================================================
# 1. Numbers and text Python refuses
# =====================================================================================

# -- integers past the digit limit -----------------------------------------------------

def test_arguments_string_with_an_integer_past_the_digit_limit_is_a_located_error() -> None:
    """json.loads raises a bare ValueError on such text: it used to escape
    render. K3's reference encoder fails on it too (its json.loads raises),
    so it is a MessageError at the arguments, not a json block."""
    raw = '{"n": ' + HUGE + "}"
    req = [*CONV, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": raw}}]}]
    with pytest.raises(xtml.MessageError, match="more digits") as e:
        K3.render(req, thinking=False, add_generation_prompt=False)
    assert (e.value.index, e.value.path) == (1, "tool_calls[0].function.arguments")


@pytest.mark.parametrize("args", [{"n": HUGE_INT}, {"n": [1, {"m": HUGE_INT}]}])
def test_argument_values_past_the_digit_limit_are_located(args: dict[str, Any]) -> None:
    req = [*CONV, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": args}}]}]
    for call in (K3.render, K3.normalize):
        with pytest.raises(xtml.MessageError) as e:
            call(req)
        assert e.value.index == 1 and e.value.path == "tool_calls[0].function.arguments"


def test_index_attributes_are_ascii_decimal_only() -> None:
    """A call's and a tool result's index are compared as text: digits
    int() reads (Arabic-Indic, superscripts), signs, zeros and padding are
    not an index, and a 5,000-digit index is reported with a short message."""
    for bad in ["١", "²", "¹", "+1", "01", " 1", "1_", "1" + "0" * (LIMIT + 10)]:
        text = completion(argument("q", "string", "x"), index=bad)
        with pytest.raises(xtml.ParseError, match="call index") as e:
            parse_completion(text, lenient=False)
        assert the_open_marker_at(text, e.value.offset).startswith("call ")
        assert len(str(e.value)) < 300
        msg = parse_completion(text, lenient=True)
        assert [d["kind"] for d in msg["diagnostics"]] == ["bad-index"]
        renders_back(msg)
    rendered = K3.render([*CONV, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "ok"}], thinking=False, add_generation_prompt=False).text
    for bad in ["١", "²", "9" * (LIMIT + 10)]:
        text = rendered.replace('tool="f" index="1"<|sep|>ok', f'tool="f" index="{bad}"<|sep|>ok')
        assert text != rendered
        with pytest.raises(xtml.ParseError, match="tool result index"):
            K3.parse(text)
        out = K3.parse(text, lenient=True)
        assert [d["kind"] for d in out["diagnostics"]] == ["bad-index"]


@settings(max_examples=30)
@given(st.one_of(unicode_digits, huge_digits, st.from_regex(r"[+ 0]?[0-9]{1,3}[ _]?", fullmatch=True)))
def test_an_index_is_exactly_what_render_writes(index: str) -> None:
    assume(index != "1")
    text = completion(argument("q", "string", "x"), index=index)
    with pytest.raises(xtml.ParseError):
        parse_completion(text, lenient=False)
    msg = parse_completion(text, lenient=True)
    assert "bad-index" in [d["kind"] for d in msg["diagnostics"]]
    renders_back(msg)


class _Pin(ContentExtension):
    """A third-party element with typed attributes."""

    name = "hostile-pin"
    part_types = ("pin",)
    elements = ("pin",)

    def __init__(self) -> None:
        self.attributes = {"pin": {"lat": float, "zoom": int}}

    def render(self, value: Any, out: MarkupSink, ctx: Context) -> None:
        out.element("pin", tuple((k, str(v)) for k, v in value.items() if k != "type"), "")

    def read_element(self, el: Any, ctx: Context) -> dict[str, Any] | None:
        return {"type": "pin", **{k: float(v) if k == "lat" else int(v) for k, v in el.attrs}}


class _PinPlugin:
    name = "hostile-pin"

    def configure(self, settings: Mapping[str, Any], where: str) -> ContentExtension:
        return _Pin()


@pytest.fixture(scope="module")
def pinned(tmp_path_factory: pytest.TempPathFactory) -> xtml.Template:
    if "hostile-pin" not in xtml.plugins.installed():
        xtml.plugins.use(_PinPlugin())
    path = tmp_path_factory.mktemp("pin") / "pin.toml"
    path.write_text(K3_TEXT + "\n[plugins.hostile-pin]\n", encoding="utf-8")
    return xtml.load(path)


def _pin_doc(attrs: str) -> str:
    return (f'<|open|>message role="user"<|sep|><|open|>pin {attrs}<|sep|><|close|>pin<|sep|>'
            "<|close|>message<|sep|><|end_of_msg|>")


@pytest.mark.parametrize("attrs", ['zoom="١٢"', 'zoom="²"', 'zoom="+5"', 'zoom=" 5"', 'zoom="1_000"',
                                   f'zoom="{HUGE}"', 'lat="1e999"', 'lat="-1E400"', 'lat="٣.٥"', 'lat="NaN"',
                                   'lat="Infinity"', 'lat=".5"'])
def test_numeric_attributes_of_plugins_are_json_numbers_in_ascii(pinned: xtml.Template, attrs: str) -> None:
    """int() and float() read Unicode digits, signs, underscores and 1e999
    (an infinity); the format does not, in either direction."""
    with pytest.raises(xtml.ParseError, match="must be"):
        pinned.parse(_pin_doc(attrs))
    out = pinned.parse(_pin_doc(attrs), lenient=True)
    assert [d["kind"] for d in out["diagnostics"]] == ["bad-element"]
    pinned.normalize({k: v for k, v in out.items() if k != "diagnostics"})


def test_numeric_attributes_of_plugins_still_read_json_numbers(pinned: xtml.Template) -> None:
    got = pinned.parse(_pin_doc('lat="-1.5e3" zoom="-12"'))["messages"][0]["content"]
    assert got == [{"type": "pin", "lat": -1500.0, "zoom": -12}]
    with pytest.raises(xtml.TemplateError, match="must be an integer"):
        pinned.render([{"role": "user", "content": [{"type": "pin", "zoom": "١٢"}]}])


@settings(max_examples=100)
@given(st.one_of(st.text(max_size=8), unicode_digits, st.from_regex(r"-?[0-9]{1,5}(\.[0-9]+)?([eE][+-]?[0-9]+)?",
                                                                    fullmatch=True)))
def test_attribute_numbers_follow_the_json_grammar(text: str) -> None:
    ascii_int = re.fullmatch(r"-?(0|[1-9][0-9]*)", text, re.ASCII) is not None
    assert (int_value(text) is not None) == ascii_int
    if ascii_int:
        assert int_value(text) == int(text)
    number = number_value(text)
    if number is not None:
        assert re.fullmatch(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?", text, re.ASCII)
        assert number == float(text) and number not in (float("inf"), float("-inf"))


@given(st.integers(-(10**40), 10**40))
def test_attribute_integers_read_back_what_str_writes(n: int) -> None:
    assert int_value(str(n)) == n and number_value(str(n)) == float(n)


def test_attribute_integers_past_the_digit_limit_are_none() -> None:
    assert int_value(HUGE) is None and int_value("-" + HUGE) is None
    assert number_value(HUGE) is None  # a float's range ends long before


def test_cli_input_with_an_integer_past_the_digit_limit(tmp_path: Path) -> None:
    """json.loads raised a bare ValueError, and the CLI printed a traceback."""
    src = tmp_path / "big.json"
    src.write_text('[{"role": "user", "content": "x"}], ' + HUGE, encoding="utf-8")
    src.write_text('{"messages": [{"role": "user", "content": "x"}], "seed": ' + HUGE + "}", encoding="utf-8")
    code, out, err = run(["render", str(src)])
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(src) in err and f"more than {LIMIT:,} digits" in err
    ids = tmp_path / "ids.json"
    ids.write_text("[1, " + HUGE + "]", encoding="utf-8")
    code, out, err = run(["parse", str(ids), "--tokenizer", deepseek_path()])
    assert code == 1 and err.count("\n") == 1 and "digits" in err


def test_a_template_with_an_integer_past_the_digit_limit_is_located(tmp_path: Path) -> None:
    """tomllib converts integers with int(): a bare ValueError escaped
    xtml.load, and `xtml validate` printed a traceback."""
    tpl = tmp_path / "big.toml"
    tpl.write_text('name = "big"\n[markers]\nopen = ' + HUGE + "\n", encoding="utf-8")
    with pytest.raises(xtml.TemplateError, match="more than 4,300 digits") as e:
        xtml.load(tpl)
    assert str(e.value).endswith(f"(at {tpl}:3:8)")
    code, out, err = run(["validate", str(tpl)])
    assert code == 1 and f"{tpl}:3:8: invalid TOML: an integer has more than" in out + err
    assert "Traceback" not in out + err


def test_dataset_rows_with_an_integer_past_the_digit_limit_are_row_errors() -> None:
    from xtml.training import dataset
    from xtml.training.rows import RowError, row_request

    with pytest.raises(RowError, match="more than 4,300 digits"):
        dataset._request(('{"messages": [], "seed": ' + HUGE + "}").encode())
    for column in ("messages", "tools"):
        with pytest.raises(RowError, match=f"column .{column}.: invalid JSON: an integer has more than 4,300 digits"):
            row_request({"messages": "[]", column: "[" + HUGE + "]"})


def test_export_grammar_input_with_an_integer_past_the_digit_limit(tmp_path: Path) -> None:
    src = tmp_path / "req.json"
    src.write_text('{"messages": [{"role": "user", "content": "x"}], "seed": ' + HUGE + "}", encoding="utf-8")
    code, out, err = run(["export", "grammar", str(src), "--tokenizer", deepseek_path()])
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "more than 4,300 digits" in err and "Traceback" not in err


@settings(max_examples=20)
@given(huge_digits, st.sampled_from(["arguments", "tools", "schema", "option", "content"]))
def test_huge_integers_anywhere_in_json_input_are_one_line_errors(digits: str, where: str) -> None:
    body = {"arguments": '{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": '
                         '{"name": "f", "arguments": {"a": %s}}}]}]}',
            "tools": '{"messages": [], "tools": [{"type": "function", "function": {"name": "f", "x": %s}}]}',
            "schema": '{"messages": [], "response_format": {"type": "json_schema", "json_schema": '
                      '{"schema": {"maximum": %s}}}}',
            "option": '{"messages": [], "thinking_effort": %s}',
            "content": '{"messages": [{"role": "user", "content": %s}]}'}[where] % digits
    code, out, err = run(["render", "-"], stdin=body)
    assert code == 1 and out == "" and err.count("\n") == 1 and "digits" in err


# -- lone surrogates -----------------------------------------------------------------

S = "ok\udc00"

SURROGATE_FIELDS: list[tuple[str, Any, type[xtml.XtmlError], int | None, str]] = [
    ("content", [{"role": "user", "content": S}], xtml.MessageError, 0, "content"),
    ("text part", [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": S}]}],
     xtml.MessageError, 0, "content[1].text"),
    ("bare string part", [{"role": "user", "content": ["a", S]}], xtml.MessageError, 0, "content[1]"),
    ("name", [{"role": "user", "name": S, "content": "x"}], xtml.MessageError, 0, "name"),
    ("reasoning", [*CONV, {"role": "assistant", "reasoning": S, "content": "x"}], xtml.MessageError, 1,
     "reasoning"),
    ("call name", [*CONV, {"role": "assistant", "tool_calls": [{"function": {"name": S}}]}], xtml.MessageError, 1,
     "tool_calls[0].function.name"),
    ("arguments text", [*CONV, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments":
                                                                                  '{"a": "' + S + '"}'}}]}],
     xtml.MessageError, 1, "tool_calls[0].function.arguments"),
    ("argument value", [*CONV, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments":
                                                                                  {"a": {"b": [1, S]}}}}]}],
     xtml.MessageError, 1, "tool_calls[0].function.arguments.a.b[1]"),
    ("argument key", [*CONV, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments":
                                                                                {S: 1}}}]}],
     xtml.MessageError, 1, "tool_calls[0].function.arguments"),
    ("tool name", [*CONV, {"role": "tool", "tool": S, "content": "x"}], xtml.MessageError, 1, "tool"),
    ("tool result", [*CONV, {"role": "tool", "name": "f", "content": S}], xtml.MessageError, 1, "content"),
    ("declared tools", [{"role": "system", "tools": [{"type": "function", "function": {"name": "f",
                                                                                        "description": S}}]}],
     xtml.RequestError, None, "messages[0].tools[0].function.description"),
    ("tools", {"messages": CONV, "tools": [{"type": "function", "function": {"name": S}}]}, xtml.RequestError,
     None, "tools[0].function.name"),
    ("schema", {"messages": CONV, "response_format": {"type": "json_schema", "json_schema": {"schema": {
        "enum": ["a", S]}}}}, xtml.RequestError, None, "response_format.enum[1]"),
]


@pytest.mark.parametrize("field, request_, error, index, path", SURROGATE_FIELDS,
                         ids=[f[0] for f in SURROGATE_FIELDS])
def test_lone_surrogates_are_refused_where_they_are(field: str, request_: Any, error: type[xtml.XtmlError],
                                                    index: int | None, path: str) -> None:
    """A lone surrogate made a TypeError in the tokenizers library, and
    became U+FFFD without a word in tiktoken; the text form could not be
    written. Now the request check names it."""
    for call in (lambda: K3.render(request_), lambda: K3.normalize(request_),
                 lambda: K3.encode(request_, vocab()), lambda: K3.encode_training(request_, vocab())):
        with pytest.raises(error, match="lone surrogate") as e:
            call()
        assert "U+DC00" in str(e.value)
        if index is not None:
            assert isinstance(e.value, xtml.MessageError)
            assert (e.value.index, e.value.path) == (index, path)
        else:
            assert e.value.location == path


def test_an_escaped_lone_surrogate_in_an_arguments_string_is_a_located_error() -> None:
    """``"\\ud800"`` in JSON text decodes to a lone surrogate, which no
    tokenizer can encode faithfully: refused where it stands."""
    raw = '{"a": "\\ud800"}'
    req = [*CONV, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": raw}}]}]
    with pytest.raises(xtml.MessageError, match="surrogate") as e:
        K3.render(req, thinking=False, add_generation_prompt=False)
    assert (e.value.index, e.value.path) == (1, "tool_calls[0].function.arguments")


@pytest.fixture(scope="module")
def tiktoken_vocab(tmp_path_factory: pytest.TempPathFactory) -> xtml.Vocabulary:
    path = tmp_path_factory.mktemp("tt") / "bytes.tiktoken"
    path.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    return xtml.load_tokenizer(path, add_special_tokens=K3.markers.all())


@pytest.mark.parametrize("kind", ["tokenizer.json", "tiktoken"])
def test_vocabularies_refuse_lone_surrogates(kind: str, tiktoken_vocab: xtml.Vocabulary) -> None:
    """Below the request check (a caller of encode_texts, a plugin): never a
    bare TypeError, and never tiktoken's silent U+FFFD."""
    v: Vocabulary = vocab() if kind == "tokenizer.json" else tiktoken_vocab
    for texts in (["a\udc00"], ["fine", "中\ud800文"], ["x" * 40 + "\udfff"]):
        with pytest.raises(xtml.TokenizerError, match="lone surrogate"):
            v.encode_texts(texts)
    assert v.decode(v.encode_texts(["中文 \U0001f600"])[0]) == "中文 \U0001f600"
    with pytest.raises(xtml.MessageError, match="lone surrogate"):
        K3.encode([{"role": "user", "content": "a\udc00"}], v)


def _leaves(x: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    if isinstance(x, str):
        yield path, x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(x, list | tuple):
        for k, v in enumerate(x):
            yield from _leaves(v, (*path, k))


def _replace(x: Any, path: tuple[Any, ...], value: str) -> Any:
    if not path:
        return value
    if isinstance(x, dict):
        return {**x, path[0]: _replace(x[path[0]], path[1:], value)}
    out = list(x)
    out[path[0]] = _replace(x[path[0]], path[1:], value)
    return out


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(xt.requests(K3, images=False), st.data())
def test_a_lone_surrogate_anywhere_is_refused_or_never_rendered(request_: dict[str, Any], data: st.DataObject) -> None:
    """Put a lone surrogate into any string of a valid request. Encoding
    then either refuses it with an XtmlError that names the message (or the
    top-level key) it sits in, or renders a request that does not hold it:
    it never reaches the tokenizer, and message text always counts."""
    leaves = list(_leaves(request_))
    assume(leaves)
    path, text = data.draw(st.sampled_from(leaves))
    at = data.draw(st.integers(0, len(text)))
    bad = text[:at] + data.draw(st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])) + text[at:]
    req = _replace(request_, path, bad)
    try:
        ids = K3.encode(req, vocab())
    except xtml.XtmlError as e:
        if "lone surrogate" in str(e):
            if isinstance(e, xtml.MessageError):
                # The message, and the field of it, the surrogate is in.
                assert path[:2] == ("messages", e.index)
                assert e.path.split(".")[0].split("[")[0] == path[2]
            else:
                assert e.location is not None and re.split(r"[.\[]", e.location)[0] in path
        if path[0] == "messages" and len(path) == 3 and path[2] == "content":
            assert "lone surrogate" in str(e)  # content is always rendered
        return
    assert not has_surrogate(K3.render(req).text)
    normal = K3.normalize(req)
    assert not any(has_surrogate(x) for _, x in _leaves(normal))
    assert K3.parse(ids, vocab()) == normal


# =====================================================================================
# 2. Non-standard JSON from a model
# =====================================================================================

NON_STANDARD = ["NaN", "Infinity", "-Infinity", "1e999", "-1E+400", "1" + "0" * 400 + ".5", HUGE, "-" + HUGE]


@pytest.mark.parametrize("token", NON_STANDARD, ids=lambda t: t[:12])
def test_non_standard_numbers_from_a_model(token: str) -> None:
    """json.loads reads NaN, Infinity, 1e999 (as an infinity): the parse put
    them in ``arguments`` as non-standard JSON, which the next turn's render
    refused (and json.loads of a 5,000-digit integer raised a bare
    ValueError). Strict parses refuse them where they are; lenient ones keep
    the text as a string, so ``arguments`` is standard JSON and renders."""
    text = completion(argument("q", "string", "x") + argument("n", "number", token))
    with pytest.raises(xtml.ParseError, match="not standard JSON") as e:
        parse_completion(text, lenient=False)
    assert the_open_marker_at(text, e.value.offset).startswith('argument key="n"')
    assert e.value.path.endswith("argument") and len(str(e.value)) < 400
    msg = parse_completion(text, lenient=True)
    assert [(d["kind"], d["offset"]) for d in msg["diagnostics"]] == [("bad-argument", e.value.offset)]
    arguments = msg["tool_calls"][0]["function"]["arguments"]
    assert strict_json(arguments) == {"q": "x", "n": token}
    renders_back(msg)


@pytest.mark.parametrize(("typ", "value"), [
    ("object", '{"a": NaN}'), ("object", '{"a": {"b": [1, -Infinity]}}'), ("array", "[1e999]"),
    ("array", "[" + HUGE + "]"), ("object", '{"a": "\\udc00"}'), ("array", '["\\ud83d"]'),
])
def test_non_standard_json_inside_object_and_array_arguments(typ: str, value: str) -> None:
    text = completion(argument("v", typ, value))
    with pytest.raises(xtml.ParseError, match="not standard JSON"):
        parse_completion(text, lenient=False)
    msg = parse_completion(text, lenient=True)
    assert strict_json(msg["tool_calls"][0]["function"]["arguments"]) == {"v": value}
    renders_back(msg)


def test_a_pair_of_escaped_surrogates_is_standard_json() -> None:
    msg = parse_completion(completion(argument("v", "array", '["\\ud83d\\ude00"]')), lenient=False)
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"v": ["\U0001f600"]}


NOT_JSON = ["{not json", "[1, 2", "{'a': 1}", "", "NaNx"]
NOT_A_BLOCK = ['{"x": NaN}', '{"x": 1e999}', '{"x": ' + HUGE + "}", "[1, 2]", '"text"', "3", "null",
               '{"a": "\\ud800"}', "NaN"]


@pytest.mark.parametrize("raw", [t for t in NOT_JSON if t], ids=lambda t: t[:16])
def test_the_json_block_carries_text_that_is_not_json_both_ways(raw: str) -> None:
    """The rule (spec.md §8.2): an arguments string that is not JSON is kept
    whole in the json block, and a json block reads back as its text."""
    msg = parse_completion(completion(json_block(raw)), lenient=False)
    assert msg["tool_calls"][0]["function"]["arguments"] == raw
    normal = renders_back(msg)
    assert normal["messages"][1]["tool_calls"][0]["function"]["arguments"] == raw
    req = [*CONV, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": raw}}]}]
    assert json_block(raw) in K3.render(req, thinking=False, add_generation_prompt=False).text


@pytest.mark.parametrize("raw", NOT_A_BLOCK, ids=lambda t: t[:16])
def test_a_json_block_holding_json_that_render_refuses_is_reported(raw: str) -> None:
    """K3's reference encoder refuses an arguments string that is JSON but
    not an object, and xtml refuses what only Python's decoder reads. A
    model's json block holding such text could not be rendered again: a
    strict parse says so at the block, a lenient one keeps the text, with a
    diagnostic."""
    text = completion(json_block(raw))
    with pytest.raises(xtml.ParseError, match="does not render back"):
        parse_completion(text, lenient=False)
    msg = parse_completion(text, lenient=True)
    assert msg["tool_calls"][0]["function"]["arguments"] == raw
    assert [d["kind"] for d in msg["diagnostics"]] == ["bad-argument"]
    req = [*CONV, {"role": "assistant", "content": "", "tool_calls": msg["tool_calls"]}]
    with pytest.raises(xtml.MessageError):
        K3.render(req, thinking=False, add_generation_prompt=False)


def test_a_standard_json_object_in_a_json_block_becomes_typed_arguments_when_rendered() -> None:
    msg = parse_completion(completion(json_block('{"b":2,"a":[1]}')), lenient=False)
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"b":2,"a":[1]}'
    normal = renders_back(msg)
    assert normal["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"b": 2, "a": [1]}'


@pytest.mark.parametrize("token", ["NaN", "1e999", HUGE, '"\\ud800"'], ids=lambda t: t[:8])
def test_non_standard_json_in_a_tool_declaration(token: str) -> None:
    text = K3.render({"messages": CONV, "tools": [{"type": "function", "function": {"name": "f", "x": 1}}]}).text
    bad = text.replace('"x":1', f'"x":{token}')
    assert bad != text
    with pytest.raises(xtml.ParseError, match="not standard JSON"):
        K3.parse(bad)
    out = K3.parse(bad, lenient=True)
    assert [d["kind"] for d in out["diagnostics"]] == ["bad-json"] and out["tools"] is None
    K3.normalize({k: v for k, v in out.items() if k != "diagnostics"})


def test_loads_is_the_one_reader() -> None:
    assert loads(' {"a": [1, 2.5, -0, "\\u00e9", true, null]} ') == {"a": [1, 2.5, 0, "é", True, None]}
    for text in ["NaN", "[Infinity]", '{"a": -Infinity}', "1e400", HUGE, '"\\udfff"', '{"\\ud800": 1}', "x\udc00"]:
        with pytest.raises(NotStandard):
            loads(text)
    with pytest.raises(json.JSONDecodeError):
        loads("{nope")


# Hostile values for the JSON of a typed argument, by declared type.
def _hostile(typ: str) -> st.SearchStrategy[str]:
    token = st.one_of(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-2E+308", "1.5e309"]), huge_digits)
    if typ == "number":
        return token
    if typ == "array":
        return st.builds(lambda t, n: "[" + ", ".join(["1"] * n + [t]) + "]", token, st.integers(0, 2))
    return st.builds(lambda t, k: "{" + json.dumps(k) + ": " + t + "}", token, st.text(max_size=5))


@st.composite
def _calls_with_typed_arguments(draw: st.DrawFn) -> tuple[dict[str, Any], str, str]:
    """An assistant message whose calls have typed arguments, and the key
    and declared type of one argument to spoil."""
    keys = st.text(st.characters(codec="utf-8", exclude_characters='"&'), min_size=1, max_size=6)
    values = st.one_of(st.integers(-(10**20), 10**20), st.floats(allow_nan=False, allow_infinity=False),
                       st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.booleans(),
                                                                            max_size=2))
    args = draw(st.dictionaries(keys, values, min_size=1, max_size=4))
    key = draw(st.sampled_from(sorted(args)))
    msg = {"role": "assistant", "content": draw(xt.texts(K3, max_pieces=2, huge=False)),
           "tool_calls": [{"function": {"name": "f", "arguments": args}}]}
    typ = {int: "number", float: "number", list: "array", dict: "object"}[type(args[key])]
    return msg, key, typ


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(_calls_with_typed_arguments(), st.data())
def test_model_output_with_non_standard_json_in_an_argument(case: tuple[dict[str, Any], str, str],
                                                            data: st.DataObject) -> None:
    msg, key, typ = case
    token = data.draw(_hostile(typ))
    b = K3.bind(vocab())
    segs = list(K3.render([*CONV, msg], thinking=False, add_generation_prompt=False).segments)
    prompt = b.encode_segments(K3.render(CONV, thinking=False).segments)
    header = f'argument key="{escape(key)}" type="{typ}"'
    for k, seg in enumerate(segs):
        if seg.special and seg.text == K3.markers.sep:
            start = max(j for j in range(k) if segs[j].special and segs[j].text == K3.markers.open)
            if "".join(x.text for x in segs[start + 1 : k]) == header:
                break
    else:
        raise AssertionError(f"no argument {key!r} in the render")
    assert not segs[k + 1].special and segs[k + 2].special
    segs[k + 1] = Segment(token, False)
    ids = b.encode_segments(segs)
    assert ids[: len(prompt) - 2] == prompt[:-2]
    # The completion: what follows the generation prompt (which opened the
    # assistant message and its response channel).
    comp = ids[len(prompt):]
    with pytest.raises(xtml.ParseError, match="not standard JSON") as e:
        K3.parse(comp, vocab(), completion=True, thinking=False)
    assert 0 <= e.value.offset < len(comp)
    got = K3.parse(comp, vocab(), completion=True, thinking=False, lenient=True)
    assert [d["kind"] for d in got["diagnostics"]] == ["bad-argument"]
    arguments = strict_json(got["tool_calls"][0]["function"]["arguments"])
    assert arguments[key] == token
    renders_back(got)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(xt.token_ids(K3, k3_vocab()), st.booleans())
def test_whatever_a_lenient_parse_returns_renders_again(ids: list[int], thinking: bool) -> None:
    """Model output of any ids: every ``arguments`` string of the parse is
    standard JSON unless it is a json block's text, and the message renders
    again after the prompt it answered, unless a json block holds JSON that
    render refuses, which the parse reports."""
    msg = K3.parse(ids, vocab(), completion=True, thinking=thinking, lenient=True)
    for call in msg.get("tool_calls", ()):
        arguments = call["function"]["arguments"]
        if json_block("")[:25] not in vocab().decode(ids):
            strict_json(arguments)
    if any("does not render back" in d["message"] for d in msg.get("diagnostics", ())):
        with pytest.raises(xtml.MessageError):
            renders_back(msg, thinking=thinking)
    else:
        renders_back(msg, thinking=thinking)


# =====================================================================================
# 3. Media
# =====================================================================================

def png_claiming(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header says ``width`` x ``height`` (the CRC fixed)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def gif_claiming(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00" + b",\x00\x00\x00\x00\x01\x00\x01\x00\x00" \
        + b"\x02\x02D\x01\x00;"


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def located(call: Any, match: str, path: str = "content[1]") -> xtml.MessageError:
    with pytest.raises(xtml.MessageError, match=match) as e:
        call()
    assert (e.value.index, e.value.path) == (0, path)
    return e.value


@pytest.mark.parametrize("data", [png_claiming(100_000, 100_000), png_claiming(2**31 - 1, 2**31 - 1),
                                  gif_claiming(65535, 65535), png_claiming(8193, 8193)],
                         ids=["png-1e10", "png-2^62", "gif-65535^2", "png-just-over"])
def test_an_image_header_claiming_a_huge_size_is_refused(data: bytes) -> None:
    """Pillow's DecompressionBombError escaped render for a tiny data URL
    whose header claims 100000x100000 pixels. The header is read, the
    pixels never are, and sizes past media.MAX_PIXELS are refused."""
    located(lambda: BASE.render(user({"type": "image_url", "image_url": {"url": data_url(data)}})), "larger than")


def test_the_cap_holds_without_pillows_own_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    located(lambda: BASE.render(user({"type": "image", "image": data_url(png_claiming(100_000, 100_000))})),
            "larger than xtml reads")


def test_the_pixel_cap_is_exact() -> None:
    w = 8192
    assert media.MAX_PIXELS == w * w
    ok = BASE.normalize(user({"type": "image", "image": data_url(png_claiming(w, w))}))
    assert ok["messages"][0]["content"][1] == {"type": "image", "width": w, "height": w}
    assert BASE.normalize(user({"type": "image", "width": media.MAX_PIXELS, "height": 1}))
    located(lambda: BASE.render(user({"type": "image", "width": media.MAX_PIXELS + 1, "height": 1})), "larger")
    located(lambda: BASE.render(user({"type": "image", "image": data_url(png_claiming(w + 1, w))})), "larger")


@pytest.mark.parametrize(("part", "message"), [
    ({"type": "image", "width": 10**400, "height": 1}, "larger than xtml reads"),
    ({"type": "image", "width": HUGE_INT, "height": HUGE_INT}, "larger than xtml reads"),
    ({"type": "video", "width": 10**400, "height": 2, "frames": 1}, "larger than xtml reads"),
    ({"type": "video", "width": 64, "height": 64, "duration": 10**400}, "a float can hold"),
    ({"type": "video", "width": 64, "height": 64, "frames": HUGE_INT}, "max_frames"),
    ({"type": "audio", "duration": 10**400}, "a float can hold"),
    ({"type": "audio", "duration": HUGE_INT}, "a float can hold"),
    ({"type": "audio", "duration": 1e308}, "max_seconds"),
])
def test_sizes_past_a_floats_range_are_located_errors(part: dict[str, Any], message: str) -> None:
    """Float division of such sizes raised OverflowError (and printing one
    past the digit limit, ValueError) out of render."""
    for call in (BASE.render, BASE.normalize):
        located(lambda call=call: call(user(part)), message)


def _media_doc(embed: str) -> str:
    return (f'<|x_open|>msg role="user"<|x_sep|>{embed}<|x_close|>msg<|x_sep|><|x_eom|>')


@pytest.mark.parametrize("embed", [
    "<|x_media|>audio " + HUGE + "s<|x_pad|><|x_media_end|>",
    "<|x_media|>audio 1" + "0" * 400 + ".5s<|x_pad|><|x_media_end|>",
    "<|x_media|>audio 0.00s<|x_pad|><|x_media_end|>",
    "<|x_media|>video 1x" + HUGE + "x28<|x_pad|><|x_media_end|>",
    "<|x_media|>video 1x" + "9" * 400 + "x28<|x_pad|><|x_media_end|>",
    "<|x_media|>video " + "9" * 30 + "x28x28<|x_pad|><|x_media_end|>",
    "<|x_media|>video 1x0x28<|x_pad|><|x_media_end|>",
], ids=lambda e: e[11:30])
def test_media_numbers_from_a_model_past_what_render_writes(embed: str) -> None:
    """Read back: a length, size or frame count render would refuse is a
    bad embed (strict: ParseError; lenient: a diagnostic, the embed left
    out), never an OverflowError and never a part that cannot render."""
    doc = _media_doc(embed)
    with pytest.raises(xtml.ParseError, match="embed"):
        BASE.parse(doc)
    out = BASE.parse(doc, lenient=True)
    assert [d["kind"] for d in out["diagnostics"]] == ["bad-embed"]
    BASE.normalize({k: v for k, v in out.items() if k != "diagnostics"})


def test_an_image_prompt_with_a_huge_size_reads_as_a_prompt() -> None:
    """Not a size this template writes (past the cap), but a prompt its
    pattern accepts: kept as an image prompt, which renders again."""
    doc = _media_doc("<|x_media|>image " + HUGE + "x5<|x_pad|><|x_media_end|>")
    out = BASE.parse(doc)
    assert out["messages"][0]["content"] == [{"type": "image"}] and out["image_prompts"][0].count(HUGE) == 1
    assert BASE.parse(BASE.render(out).text) == BASE.normalize(out)


@settings(max_examples=60)
@given(st.sampled_from(["audio {}s", "video {}x28x28", "video 1x{}x28", "video 2x28x{}", "image {}x28",
                        "image 28x{}"]),
       st.one_of(huge_digits.map(lambda s: s.lstrip("-")), st.integers(0, 10**30).map(str),
                 st.from_regex(r"0[0-9]{1,5}", fullmatch=True)),
       st.integers(0, 4))
def test_media_prompts_with_any_numbers_parse_and_render_again(form: str, number: str, pads: int) -> None:
    doc = _media_doc("<|x_media|>" + form.format(number) + "<|x_pad|>" * pads + "<|x_media_end|>")
    try:
        BASE.parse(doc)
    except xtml.ParseError:
        pass
    out = BASE.parse(doc, lenient=True)
    BASE.normalize({k: v for k, v in out.items() if k != "diagnostics"})


MAGIC = [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", b"GIF89a", b"GIF87a", b"\xff\xd8\xff\xe0", b"BM", b"II*\x00",
         b"MM\x00*", b"RIFF\x00\x00\x00\x00WEBPVP8 ", b"\x00\x00\x01\x00", b"P6\n", b"8BPS", b"\x00\x00\x00\x0cjP  "]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[xtml.Template, Path]:
    """xtml-base with reading local media files switched on, and a folder."""
    folder = tmp_path_factory.mktemp("files")
    path = folder / "files.toml"
    path.write_text(BASE_TEXT.replace("[plugins.image]\n", "[plugins.image]\nread_files = true\n")
                    .replace("[plugins.audio]\n", "[plugins.audio]\nread_files = true\n"), encoding="utf-8")
    return xtml.load(path), folder


@pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow's own notes on corrupt EXIF
@settings(max_examples=150)
@given(st.sampled_from(MAGIC), st.binary(max_size=64), st.sampled_from(["data", "file"]))
def test_any_bytes_after_an_image_signature_are_a_size_or_a_located_error(
        files: tuple[xtml.Template, Path], magic: bytes, rest: bytes, how: str) -> None:
    """Pillow's format readers parse hostile headers; whatever they raise
    (OSError, ValueError, struct.error, ...) ends as a MessageError."""
    if how == "data":
        ref = data_url(magic + rest)
        t = BASE
    else:
        ref = str(files[1] / "x.img")
        Path(ref).write_bytes(magic + rest)
        t = files[0]
    try:
        t.render(user({"type": "image", "image": ref}))
    except xtml.MessageError as e:
        assert (e.index, e.path) == (0, "content[1]")


@settings(max_examples=100)
@given(st.binary(max_size=80), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_any_bytes_as_wav_are_a_length_or_a_located_error(rest: bytes, size: int, rate: int) -> None:
    data = b"RIFF" + struct.pack("<I", size) + b"WAVEfmt " + struct.pack("<IHHII", 16, 1, 1, rate, rate // 2) + rest
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}
    try:
        BASE.render(user(part))
    except xtml.MessageError as e:
        assert (e.index, e.path) == (0, "content[1]")


# -- local files -----------------------------------------------------------------------



def test_file_urls_naming_another_host_are_refused(tmp_path: Path, files: tuple[xtml.Template, Path]) -> None:
    """file://HOST/path named /path on this machine: the host was dropped."""
    f = tmp_path / "a.wav"
    f.write_bytes(wav(1.0))
    t = files[0]
    for url in (f"file://evil.example{f}", f"FILE://server{f}", f"file://127.0.0.1{f}"):
        located(lambda url=url: t.render(user({"type": "audio", "audio": url})), "names a host")
        located(lambda url=url: t.render(user({"type": "image", "image": url.replace(".wav", ".png")})),
                "names a host")
    for url in (f"file://{f}", f"file://localhost{f}", str(f)):
        got = t.normalize(user({"type": "audio", "audio": url}))
        assert got["messages"][0]["content"][1] == {"type": "audio", "duration": 1.0}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and /dev/zero")
def test_devices_pipes_and_folders_are_refused_before_reading(tmp_path: Path,
                                                             files: tuple[xtml.Template, Path]) -> None:
    """A .wav link to /dev/zero was read until memory ran out; a FIFO made
    the open wait for a writer forever."""
    os.symlink("/dev/zero", tmp_path / "zero.wav")
    os.symlink("/dev/zero", tmp_path / "zero.png")
    os.mkfifo(tmp_path / "pipe.wav")
    (tmp_path / "folder.wav").mkdir()
    t = files[0]
    messages = set()
    for name in ("zero.wav", "pipe.wav", "folder.wav", "missing.wav"):
        e = located(lambda name=name: t.render(user({"type": "audio", "audio": str(tmp_path / name)})),
                    "not found or not readable")
        messages.add(str(e).replace(name, "NAME"))
    # One message whatever the reason: a request learns nothing more about
    # the server's files than that it cannot have this one.
    assert len(messages) == 1
    for ref in (str(tmp_path / "zero.png"), "/dev/zero", str(tmp_path / "pipe.wav"), str(tmp_path)):
        located(lambda ref=ref: t.render(user({"type": "image", "image": ref})), "image file not found or not readable")


def test_files_past_the_size_cap_are_refused_after_reading_one_byte_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: tuple[xtml.Template, Path]) -> None:
    data = wav(1.0)
    monkeypatch.setattr(media, "MAX_FILE_BYTES", len(data))
    t = files[0]
    (tmp_path / "fits.wav").write_bytes(data)
    assert t.normalize(user({"type": "audio", "audio": str(tmp_path / "fits.wav")}))
    (tmp_path / "big.wav").write_bytes(data + b"\0" * (1 << 20))
    read: list[int] = []
    real = os.fdopen

    def counting(fd: int, *args: Any, **kwargs: Any) -> Any:
        f = real(fd, *args, **kwargs)
        original = f.read

        def read_(n: int = -1) -> bytes:
            got = original(n)
            read.append(len(got))
            return bytes(got)

        f.read = read_
        return f

    monkeypatch.setattr(os, "fdopen", counting)
    located(lambda: t.render(user({"type": "audio", "audio": str(tmp_path / "big.wav")})), "larger than xtml reads")
    assert sum(read) == len(data) + 1
    png = png_claiming(1, 1)
    monkeypatch.setattr(media, "MAX_FILE_BYTES", len(png) - 1)
    (tmp_path / "a.png").write_bytes(png)
    located(lambda: t.render(user({"type": "image", "image": str(tmp_path / "a.png")})), "larger than xtml reads")


@pytest.mark.parametrize(("plugin", "setting"), [
    ("audio", "frame_rate = 1e400"), ("audio", "frame_rate = " + "9" * 400), ("audio", "max_seconds = 1e308"),
    ("audio", "decimals = 100000000"), ("video", "sample_fps = 1e308"), ("video", "max_frames = " + "9" * 30),
    ("video", "patch_size = " + "9" * 30), ("image", "max_pixels = " + "9" * 30), ("image", "min_pixels = 1e10"),
])
def test_absurd_media_settings_are_template_errors(tmp_path: Path, plugin: str, setting: str) -> None:
    """Templates are data: a number that would overflow the plugins'
    arithmetic is a TemplateError naming its key, not an OverflowError at
    the first request."""
    key = setting.split(" = ")[0]
    head = f"[plugins.{plugin}]\n"
    before, _, section = BASE_TEXT.partition(head)
    body, nxt, after = section.partition("\n[")
    body = re.sub(rf"^{key} = .*\n", "", body, flags=re.M)
    path = tmp_path / "t.toml"
    path.write_text(before + head + setting + "\n" + body + nxt + after, encoding="utf-8")
    with pytest.raises(xtml.TemplateError, match=key):
        xtml.load(path)
