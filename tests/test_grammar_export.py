"""The exported completion grammar (planned and written by
xtml.codec.completion), run by llguidance on a real 129k-id vocabulary.

Every completion xtml renders for a generated request whose calls fit their
tools' schemas is accepted token by token to an accepting end; a completion
changed in one place (an undeclared tool, a wrong type, a value outside an
enum, a missing or repeated argument, a broken tool_choice or
response_format, a close tag out of order, a bad plugin element) is refused
at the first token where it leaves every good completion. That token is
computed here from the change alone: the changed piece of markup and the
strings that could stand there instead, mapped to tokens through the
vocabulary's bytes. The same for the xtml-base dialect, the citation plugin,
and (translated to llguidance's syntax) the xgrammar export.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import llguidance
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import xtml
from tests.helpers.cli import run
from tests.helpers.docs import run_examples
from tests.helpers.grammar import (
    BASE,
    K3,
    Piece,
    accepts,
    departure,
    find,
    ids_of,
    lltok,
    lltok_own_eos,
    matcher,
    offset,
    own_eos,
    piece,
    pieces,
    refused_at,
    vocab,
)
from tests.helpers.tokenizers import deepseek_path
from xtml import testing as xt
from xtml.markup.header import escape

ROOT = Path(__file__).parent.parent
CITE_TOML = ROOT / "xtml" / "dialects" / "kimi-k3.toml"

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.data_too_large])


@cache
def cited() -> xtml.Template:
    """K3 with the citation plugin (examples/plugins/xtml-citation)."""
    assert "citation" in xtml.plugins.installed(), "pip install ./examples/plugins/xtml-citation"
    import tempfile

    path = Path(tempfile.mkdtemp()) / "cited.toml"
    path.write_text(CITE_TOML.read_text(encoding="utf-8") + '\n[plugins.citation]\nelement = "cite"\n',
                    encoding="utf-8")
    return xtml.load(path)


# -- requests and messages -------------------------------------------------------------

KINDS: dict[str, Any] = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
    "null": {"type": "null"},
    "nullable": {"type": ["string", "null"]},
    "array": {"type": "array", "items": {"type": "integer"}},
    "object": {"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "integer"}},
               "required": ["x"], "additionalProperties": False},
    "int_enum": {"enum": [1, 2, 3]},
    "enum": None,  # drawn: a string enum
}
# The type attributes each kind of value may carry.
ATTRS = {"string": ["string"], "integer": ["number"], "number": ["number"], "boolean": ["boolean"],
         "null": ["null"], "nullable": ["string", "null"], "array": ["array"], "object": ["object"],
         "int_enum": ["number"], "enum": ["string"]}
# A value of another type, and its type, whose first letter no allowed type starts with.
WRONG = {"string": (7, "number"), "integer": ("x", "string"), "number": (True, "boolean"),
         "boolean": ("x", "string"), "null": ("x", "string"), "nullable": (7, "number"),
         "array": ("x", "string"), "object": (7, "number"), "int_enum": ("x", "string"), "enum": (7, "number")}

JSON_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
               "additionalProperties": False}


def text() -> st.SearchStrategy[str]:
    return xt.texts(K3, max_pieces=3, long=False, huge=False)


@cache
def added_spellings() -> tuple[str, ...]:
    """Spellings of the vocabulary's added tokens that are not special (the
    tokenizer makes them those tokens even in text)."""
    added = vocab().tokenizer.get_added_tokens_decoder().values()
    return tuple(t.content for t in added if not t.special)


def json_safe(s: str) -> str:
    """``s`` without what llguidance's JSON refuses inside strings (limits
    the grammar's header states): a raw DEL, and text the tokenizer turns
    into an added token. xtml writes JSON strings with non-ASCII kept."""
    while True:
        out = s.replace("\x7f", "")
        for a in added_spellings():
            out = out.replace(a, "")
        if out == s:
            return out
        s = out


@st.composite
def value_of(draw: st.DrawFn, kind: str, schema: Any) -> Any:
    if kind == "string":
        return draw(text())
    if kind == "enum":
        return draw(st.sampled_from(schema["enum"]))
    if kind == "integer":
        return draw(st.integers(-(10**20), 10**20))
    if kind == "number":
        return draw(st.one_of(st.integers(-1000, 1000), st.floats(allow_nan=False, allow_infinity=False)))
    if kind == "boolean":
        return draw(st.booleans())
    if kind == "null":
        return None
    if kind == "nullable":
        return draw(st.one_of(st.none(), text()))
    if kind == "array":
        return draw(st.lists(st.integers(-99, 99), max_size=4))
    if kind == "object":
        out: dict[str, Any] = {"x": json_safe(draw(text()))}
        if draw(st.booleans()):
            out["y"] = draw(st.integers(-5, 5))
        return out
    return draw(st.sampled_from([1, 2, 3]))


@dataclass
class Tool:
    name: str
    kinds: dict[str, str]
    required: list[str]
    closed: bool
    schema: dict[str, Any] = field(default_factory=dict)


@st.composite
def tools(draw: st.DrawFn) -> list[Tool]:
    # Names and keys carry the characters attributes escape (" and &); no
    # tool name starts with z, and no key with #.
    names = draw(st.lists(st.text(alphabet='abc_&"', min_size=1, max_size=4), min_size=1, max_size=3, unique=True))
    out = []
    for name in names:
        keys = draw(st.lists(st.text(alphabet='kmn&"<', min_size=1, max_size=3), max_size=4, unique=True))
        kinds = {k: draw(st.sampled_from(sorted(KINDS))) for k in keys}
        props: dict[str, Any] = {}
        for k, kind in kinds.items():
            if kind == "enum":
                values = draw(st.lists(st.text(alphabet="pqrs", max_size=3), min_size=1, max_size=3, unique=True))
                props[k] = {"type": "string", "enum": values}
            else:
                props[k] = KINDS[kind]
        required = [k for k in keys if draw(st.booleans())]
        closed = draw(st.booleans())
        schema: dict[str, Any] = {"type": "object", "properties": props, "required": required}
        if closed:
            schema["additionalProperties"] = False
        out.append(Tool(name, kinds, required, closed, schema))
    return out


def declared(ts: list[Tool]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": t.name, "description": "d", "parameters": t.schema}}
            for t in ts]


@st.composite
def call_of(draw: st.DrawFn, t: Tool) -> dict[str, Any]:
    optional = [k for k in t.kinds if k not in t.required]
    keys = t.required + [k for k in optional if draw(st.booleans())]
    keys = draw(st.permutations(keys))
    args = {k: draw(value_of(t.kinds[k], t.schema["properties"][k])) for k in keys}
    if not t.closed and draw(st.booleans()):
        args[draw(st.text(alphabet="xyz", min_size=1, max_size=3))] = draw(st.one_of(text(), st.integers()))
    return {"type": "function", "function": {"name": t.name, "arguments": args}}


@dataclass
class Case:
    tpl: xtml.Template
    tools: list[Tool]
    history: dict[str, Any]
    message: dict[str, Any]
    choice: Any
    json_answer: bool

    def grammar(self, **over: Any) -> str:
        return self.tpl.completion_grammar({**self.history, **over}, vocab())


@st.composite
def cases(draw: st.DrawFn, tpl: xtml.Template) -> Case:
    ts = draw(tools())
    choice = draw(st.sampled_from(["auto", "required", "none", "named", None]))
    named = draw(st.sampled_from(ts)) if choice == "named" else None
    parallel = draw(st.sampled_from([None, True, False]))
    most = 1 if parallel is False else 3
    calls: list[dict[str, Any]] = []
    if choice != "none":
        pool = [named] if named is not None else ts
        least = 1 if choice in ("required", "named") else 0
        calls = draw(st.lists(st.sampled_from(pool).flatmap(call_of), min_size=least, max_size=most))
    fmt = draw(st.sampled_from([None, "json_object", "json_schema"]))
    message: dict[str, Any] = {"role": "assistant"}
    if draw(st.booleans()):
        message["reasoning_content"] = draw(text())
    if fmt is None:
        message["content"] = draw(text())
    elif bool(calls) and draw(st.booleans()):
        message["content"] = ""
    elif fmt == "json_object":
        message["content"] = json.dumps(draw(st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)))
    else:
        message["content"] = json.dumps({"answer": json_safe(draw(text()))}, ensure_ascii=draw(st.booleans()))
    if calls:
        message["tool_calls"] = calls
    history: dict[str, Any] = {"messages": [{"role": "user", "content": "go"}], "tools": declared(ts),
                               "thinking": draw(st.booleans())}
    if choice is not None:
        history["tool_choice"] = ({"type": "function", "function": {"name": named.name}} if named is not None
                                  else choice)
    if parallel is not None:
        history["parallel_tool_calls"] = parallel
    if fmt == "json_object":
        history["response_format"] = {"type": "json_object"}
    elif fmt == "json_schema":
        history["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": JSON_SCHEMA}}
    return Case(tpl, ts, history, message, choice, fmt is not None)


# -- good completions ------------------------------------------------------------------


@SETTINGS
@given(st.sampled_from([K3, BASE]).flatmap(cases))
def test_every_rendered_completion_is_accepted(case: Case) -> None:
    ps = pieces(case.tpl, case.history, case.message)
    ids = ids_of(ps)
    grammar = case.grammar()
    accepts(grammar, ids)
    # The end marker as the engine's end-of-sequence token (as llama.cpp
    # hands llguidance a K3 model's end-of-turn token): allowed only where
    # the grammar may end, and it may end at the message's close, where the
    # end marker is then the one token allowed.
    k3_end = K3.bind(vocab()).marker_ids[K3.markers.end]
    marker_is_eos, separate = (lltok(), lltok_own_eos()) if case.tpl is K3 else (lltok_own_eos(), lltok())
    eos = own_eos() if case.tpl is K3 else k3_end
    m = matcher(grammar, marker_is_eos)
    assert m.consume_tokens(ids[:-1]) and m.is_accepting()
    assert [i for i, v in enumerate(m.compute_logit_bias()) if v] == [ids[-1]]
    assert m.validate_tokens(ids[-1:]) == 1
    # An end of sequence of the engine's own: the end marker is a grammar
    # token (or the engine's own token ends the answer there), and after it
    # only the engine's own token.
    own = matcher(grammar, separate)
    assert own.consume_tokens(ids[:-1]) and own.is_accepting()
    assert sorted(i for i, v in enumerate(own.compute_logit_bias()) if v) == sorted([ids[-1], eos])
    assert own.consume_token(ids[-1]) and own.is_accepting()
    assert [i for i, v in enumerate(own.compute_logit_bias()) if v] == [eos]


def test_marker_text_stays_text() -> None:
    """A marker spelled in text (reasoning, content, a string argument) is
    ordinary tokens, and the grammar reads it as text; the marker's own id
    in the same place is refused."""
    spelled = "<|close|>think<|sep|><|open|>response<|sep|><|end_of_msg|>"
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
    history = {"messages": [{"role": "user", "content": "x"}], "tools": [tool]}
    message = {"role": "assistant", "reasoning_content": spelled, "content": spelled,
               "tool_calls": [{"function": {"name": "f", "arguments": {"q": spelled}}}]}
    ps = pieces(K3, history, message)
    grammar = K3.completion_grammar(history, vocab())
    accepts(grammar, ids_of(ps))
    close = K3.bind(vocab()).marker_ids["<|close|>"]
    k = find(ps, [spelled])
    bad = [*ids_of(ps[:k]), close, *ids_of(ps[k + 1:])]
    # The real marker closes the think channel: `think` may follow, `<|close|>` again may not.
    assert refused_at(grammar, bad) == offset(ps, k) + 1


# -- bad completions -------------------------------------------------------------------


def _names(tpl: xtml.Template) -> dict[str, str]:
    return tpl.dialect.names


def _arg_pieces(ps: list[Piece], tpl: xtml.Template, nth: int) -> tuple[int, int]:
    """(first, last) piece of the ``nth`` argument element."""
    n, m = _names(tpl), tpl.markers
    key = find(ps, [" " + n["key"], '="'], nth)
    first = key - 2  # open marker, tag name
    last = find(ps, [m.close, n["argument"], m.sep], 0, key) + 2
    return first, last


def _args_before(case: Case, call: int) -> int:
    calls = case.message.get("tool_calls", [])
    return sum(len(c["function"]["arguments"]) for c in calls[:call])


def _tool(case: Case, name: str) -> Tool:
    return next(t for t in case.tools if t.name == name)


CHANGES = ["undeclared-tool", "wrong-type", "missing-required", "tool-choice-none", "tool-choice-required",
           "not-json", "close-order", "close-call-as-tools"]


def _applicable(case: Case) -> list[str]:
    calls = case.message.get("tool_calls", [])
    kinds = ["close-order"]
    if calls:
        kinds += ["undeclared-tool", "tool-choice-none", "close-call-as-tools"]
        if any(set(c["function"]["arguments"]) & set(_tool(case, c["function"]["name"]).kinds) for c in calls):
            kinds.append("wrong-type")
        if any(_tool(case, c["function"]["name"]).required for c in calls):
            kinds.append("missing-required")
    else:
        kinds.append("tool-choice-required")
    if case.json_answer and not calls:
        kinds.append("not-json")
    return kinds


@pytest.mark.parametrize("kind", CHANGES)
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from([K3, BASE]).flatmap(cases), st.data())
def test_changed_completions_are_refused_where_they_depart(kind: str, case: Case, data: st.DataObject) -> None:
    assume(kind in _applicable(case))
    tpl, n, m = case.tpl, _names(case.tpl), case.tpl.markers
    ps = pieces(tpl, case.history, case.message)
    grammar = case.grammar()
    calls = case.message.get("tool_calls", [])
    bad = list(ps)
    if kind == "undeclared-tool":
        j = data.draw(st.integers(0, len(calls) - 1), label="call")
        k = find(ps, [" " + n["tool"], '="'], j) + 2
        bad[k] = piece(tpl, "z" + ps[k].seg.text)
        want = departure(bad, k, [])
    elif kind == "wrong-type":
        # A listed key (a key the schema does not list takes every type).
        j, a, key = data.draw(st.sampled_from([
            (j, a, key) for j, c in enumerate(calls) for a, key in enumerate(c["function"]["arguments"])
            if key in _tool(case, c["function"]["name"]).kinds]), label="argument")
        t = _tool(case, calls[j]["function"]["name"])
        allowed = ATTRS[t.kinds[key]]
        value, typ = WRONG[t.kinds[key]]
        first, _ = _arg_pieces(ps, tpl, _args_before(case, j) + a)
        k = find(ps, [" " + n["type"], '="'], 0, first) + 2
        bad[k] = piece(tpl, typ)
        bad[k + 3] = piece(tpl, value if isinstance(value, str) else json.dumps(value))
        want = departure(bad, k, allowed)
    elif kind == "missing-required":
        j = data.draw(st.sampled_from([j for j, c in enumerate(calls)
                                       if _tool(case, c["function"]["name"]).required]), label="call")
        args = list(calls[j]["function"]["arguments"])
        t = _tool(case, calls[j]["function"]["name"])
        a = args.index(data.draw(st.sampled_from(t.required), label="required"))
        first, last = _arg_pieces(ps, tpl, _args_before(case, j) + a)
        del bad[first : last + 1]
        want = offset(bad, find(bad, [m.close, n["call"], m.sep], j))
    elif kind == "tool-choice-none":
        grammar = case.grammar(tool_choice="none")
        if case.json_answer and not case.message["content"]:
            # With no call to make, the response must be the JSON answer.
            want = offset(ps, find(ps, [m.close, n["response"], m.sep]))
        else:
            want = offset(ps, find(ps, [m.open, n["tools"]]))
    elif kind == "tool-choice-required":
        grammar = case.grammar(tool_choice="required")
        want = offset(ps, find(ps, [m.close, n["message"]]))
    elif kind == "not-json":
        opened = tpl.dialect.prompt_channel[case.history["thinking"]] == "response"
        k = 0 if opened else find(ps, [m.open, n["response"], m.sep]) + 3
        if ps[k].seg.special:  # an empty response: put the text in
            bad.insert(k, piece(tpl, "not json"))
        else:
            bad[k] = piece(tpl, "not json")
        want = departure(bad, k, [])
    elif kind == "close-order":
        # The response closed with another channel's name.
        k = find(ps, [m.close, n["response"], m.sep]) + 1
        other = n["tools"]
        bad[k] = piece(tpl, other)
        want = departure(bad, k, [n["response"]])
    else:  # a call closed as if it were the tools channel
        k = find(ps, [m.close, n["call"], m.sep]) + 1
        bad[k] = piece(tpl, n["tools"])
        want = departure(bad, k, [n["call"]])
    assert refused_at(grammar, ids_of(bad)) == want, kind


@pytest.mark.parametrize("kind", ["outside-enum", "repeated"])
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(cases(K3), st.data())
def test_refusals_inside_argument_values(kind: str, case: Case, data: st.DataObject) -> None:
    """A value outside an enum, and an argument given twice, are refused at
    the first token that leaves what the schema allows."""
    tpl, n, m = case.tpl, _names(case.tpl), case.tpl.markers
    calls = case.message.get("tool_calls", [])
    enums = ("enum", "int_enum") if kind == "outside-enum" else tuple(KINDS)
    found = [(j, a, key) for j, c in enumerate(calls) for a, key in enumerate(c["function"]["arguments"])
             if _tool(case, c["function"]["name"]).kinds.get(key) in enums]
    assume(found)
    ps = pieces(tpl, case.history, case.message)
    grammar = case.grammar()
    j, a, key = data.draw(st.sampled_from(found), label="argument")
    t = _tool(case, calls[j]["function"]["name"])
    first, last = _arg_pieces(ps, tpl, _args_before(case, j) + a)
    bad = list(ps)
    if kind == "outside-enum":
        k = find(ps, [m.sep], 0, first) + 1
        out = "#out" if t.kinds[key] == "enum" else "7"
        if ps[k].seg.special:  # an empty enum value
            bad.insert(k, piece(tpl, out))
        else:
            bad[k] = piece(tpl, out)
        want = departure(bad, k, [])
    else:
        # The argument again, at the end of the call.
        close = find(ps, [m.close, n["call"], m.sep], j)
        bad[close:close] = ps[first : last + 1]
        k = close + 4  # the repeated key's value
        given_keys = set(calls[j]["function"]["arguments"])
        if t.closed:
            alternatives = [escape(x) for x in t.kinds if x not in given_keys]
            if not alternatives:  # no key may come: the open marker departs
                want = offset(bad, close)
                assert refused_at(grammar, ids_of(bad)) == want
                return
        else:
            # Any other key may come: the key departs only at its closing quote.
            alternatives = [escape(key) + "x"]
        want = departure(bad, k, alternatives)
    assert refused_at(grammar, ids_of(bad)) == want


SCHEMA_CASES = json.loads((Path(__file__).parent / "data" / "cases" / "grammar-schema.json").read_text(
    encoding="utf-8"))


def _schema_call(args: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    tool = {"type": "function", "function": {"name": "f", "parameters": SCHEMA_CASES["schema"]}}
    history = {"messages": [{"role": "user", "content": "x"}], "tools": [tool], "thinking": False}
    message = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": args}}]}
    return history, pieces(K3, history, message)


@pytest.mark.parametrize("args", SCHEMA_CASES["accept"])
def test_schema_features_accept(args: dict[str, Any]) -> None:
    """A call that fits the schema is accepted, by both formats."""
    history, ps = _schema_call(args)
    accepts(K3.completion_grammar(history, vocab()), ids_of(ps))
    accepts(ebnf_to_lark(K3.completion_grammar(history, vocab(), format="xgrammar", max_calls=2)), ids_of(ps))


@pytest.mark.parametrize("case", SCHEMA_CASES["refuse"], ids=[c["refused_in"] for c in SCHEMA_CASES["refuse"]])
def test_schema_features_refuse(case: dict[str, Any]) -> None:
    """A value that does not fit is refused inside its own text."""
    history, ps = _schema_call(case["arguments"])
    grammar = K3.completion_grammar(history, vocab())
    k = find(ps, [case["refused_in"]])
    assert offset(ps, k) <= refused_at(grammar, ids_of(ps)) <= offset(ps, k + 1)


NUMBERS = {"type": "object", "additionalProperties": False, "properties": {
    "n": {"type": "number"}, "i": {"type": "integer"}, "lo": {"type": "number", "exclusiveMinimum": 0},
    "o": {"type": "object"}, "a": {"type": "array"},
    # Values of schemas with constraints of their own, whose structure and
    # bounds llguidance's JSON would otherwise write with unbounded numbers.
    "p": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "integer", "maximum": 5}}},
    "b": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    "m": {"anyOf": [{"type": "number", "minimum": -2}, {"type": "string", "maxLength": 2}]}}}


def _numbers_call(args: dict[str, Any]) -> tuple[str, list[Piece]]:
    tool = {"type": "function", "function": {"name": "f", "parameters": NUMBERS}}
    history = {"messages": [{"role": "user", "content": "x"}], "tools": [tool], "thinking": False}
    message = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": args}}]}
    return K3.completion_grammar(history, vocab()), pieces(K3, history, message)


@pytest.mark.parametrize("args", [
    {"n": 1e-07, "lo": 1e-07}, {"n": 1e300, "lo": 1e300, "i": 10**4299}, {"n": -2.5e-300, "lo": 1.7e16},
    {"n": 1e308, "i": -(10**40)}, {"n": 1.7e308, "lo": 1.7976931348623157e308},
    {"o": {"x": [1e-07, -1e300, {"\u00e9\x01": None}]}, "a": [5e-324, 2**64]},
    {"p": {"x": 1e-07, "y": -(10**4299), "\u00e9\x01\n": [1e300]}, "b": [10**4299, -(10**20), 0]},
    {"p": {"x": 1.7976931348623157e308}, "m": 1e300}, {"m": 10**400, "b": []}, {"m": 1e16, "p": {}},
    {"m": 123456789012345678.5, "p": {"y": 5}}])
def test_numbers_as_python_writes_them_are_accepted(args: dict[str, Any]) -> None:
    grammar, ps = _numbers_call(args)
    accepts(grammar, ids_of(ps))


@pytest.mark.parametrize(("key", "text"), [
    ("n", "1e400"), ("n", "1.8e308"), ("n", "1" * 400 + ".5"), ("i", "1" * 4301), ("lo", "-1e-07"), ("lo", "1e400"),
    ("o", '{"x": 1e400}'), ("a", "[1E999]"), ("a", '["\\ud800"]'), ("p", '{"x": 1e400}'), ("p", '{"x": 2e308}'),
    ("p", '{"y": -1' + "0" * 4300 + "}"), ("p", '{"z": 1e999}'), ("p", '{"x": 1, "\\u0078": 1e5}'),
    ("b", "[1" + "0" * 4300 + "]"), ("b", "[1e400]"), ("m", "1" * 400 + ".5"), ("m", "1e309"),
    ("m", "1" + "0" * 4300)])
def test_numbers_past_what_python_reads_are_refused(key: str, text: str) -> None:
    """A strict parse refuses these (or the schema does); the grammar
    refuses them inside the value."""
    good = {"n": 7, "i": 7, "lo": 7, "o": {"x": 7}, "a": [7], "p": {"x": 7}, "b": [7], "m": 7}[key]
    grammar, ps = _numbers_call({key: good})
    k = find(ps, [json.dumps(good)])
    ps[k] = piece(K3, text)
    assert offset(ps, k) <= refused_at(grammar, ids_of(ps)) < offset(ps, k + 1)


def _nested(depth: int) -> dict[str, Any]:
    """Arrays in arrays, ``depth`` deep, of objects."""
    s: dict[str, Any] = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0},
                                                         "y": {"type": "number"}}, "required": ["x"]}
    for i in range(depth):
        s = {"type": "array", "items": s} if i % 2 else {"type": "array", "items": s, "maxItems": 3}
    return {"type": "object", "properties": {"a": s, "b": {"anyOf": [s, {"type": "null"}]}}}


@pytest.mark.parametrize("fmt", ["llguidance", "gbnf", "xgrammar", "xgrammar-tag"])
def test_the_grammar_grows_linearly_with_the_schema_s_depth(fmt: str) -> None:
    """Each nested value is one rule, referred to by name: written out
    twice (an array's first and further items, an object member before and
    after a comma) it doubled at every level, and a tool schema of 20 nested
    arrays made a 145 MB grammar."""
    sizes = []
    for depth in (4, 8, 16):
        tool = {"type": "function", "function": {"name": "f", "parameters": _nested(depth)}}
        sizes.append(len(K3.completion_grammar({"messages": [{"role": "user", "content": "x"}], "tools": [tool],
                                                "tool_choice": "required"}, vocab(), format=fmt)))
    # Twice the levels, about twice what they add (doubling per level, it
    # was 2**8 times).
    assert sizes[2] - sizes[1] <= 2.5 * (sizes[1] - sizes[0]), sizes


def test_a_deeply_nested_schema_s_grammar_compiles_and_accepts() -> None:
    args = {"a": [[[[[[{"x": 5, "y": 1.5}]]], []]]], "b": None}
    tool = {"type": "function", "function": {"name": "f", "parameters": _nested(6)}}
    history = {"messages": [{"role": "user", "content": "x"}], "tools": [tool], "thinking": False}
    message = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": args}}]}
    accepts(K3.completion_grammar(history, vocab()), ids_of(pieces(K3, history, message)))


@pytest.mark.parametrize("where", ["key", "enum", "nested", "name"])
def test_a_fixed_string_that_spells_a_marker_is_refused(where: str) -> None:
    """llguidance would force the marker's token there, then refuse it: the
    request is refused, at the string's place."""
    schema: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "string"}}}
    name, place = "f", r"tools\[0\]\.function\.parameters\.properties"
    if where == "key":
        schema["properties"]["<|sep|>"] = {"type": "boolean"}
    elif where == "enum":
        schema["properties"]["a"]["enum"] = ["x<|open|>y"]
        place += r'\["a"\]\.enum\[0\]'
    elif where == "nested":
        schema["properties"]["a"] = {"type": "object", "properties": {"b": {"const": "<|close|>"}}}
        place += r'\["a"\]\.properties\["b"\]\.const'
    else:
        name, place = "call<|end_of_msg|>", r"tools\[0\]\.function\.name"
    req = {"messages": [{"role": "user", "content": "x"}],
           "tools": [{"type": "function", "function": {"name": name, "parameters": schema}}]}
    with pytest.raises(xtml.RequestError, match="spells a special token") as e:
        K3.completion_grammar(req, vocab())
    assert re.fullmatch(place + r'(\["<\|sep\|>"\])?', str(e.value.location)), e.value.location
    # Text that spells a marker stays allowed where it is free text.
    schema["properties"] = {"a": {"type": "string"}}
    K3.completion_grammar({**req, "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]},
                          vocab())


def test_tool_without_parameters_and_the_responses_shape() -> None:
    tools = [{"type": "function", "function": {"name": "free"}}, {"type": "function", "name": "flat"}]
    history = {"messages": [{"role": "user", "content": "x"}], "tools": tools, "thinking": False,
               "tool_choice": {"type": "function", "name": "flat"}}
    call = {"function": {"name": "flat", "arguments": {"a": [1, {"b": None}], "c": "text", "&\"": 1.5}}}
    message: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
    grammar = K3.completion_grammar(history, vocab())
    accepts(grammar, ids_of(pieces(K3, history, message)))
    assert "'flat'" in grammar.splitlines()[1] and "'free'" not in grammar.splitlines()[1]
    two = {**message, "tool_calls": [call, call]}
    accepts(grammar, ids_of(pieces(K3, history, two)))
    one = K3.completion_grammar(history, vocab(), parallel_tool_calls=False)
    ps = pieces(K3, history, two)
    assert refused_at(one, ids_of(ps)) == offset(ps, find(ps, ["<|open|>", "call"], 1))


def test_named_tool_choice_refuses_the_other_tool() -> None:
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
             for name in ("lookup", "log")]
    history = {"messages": [{"role": "user", "content": "x"}], "tools": tools, "thinking": False,
               "tool_choice": {"type": "function", "function": {"name": "lookup"}}}
    message = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "log", "arguments": {}}}]}
    ps = pieces(K3, history, message)
    k = find(ps, [' tool', '="']) + 2
    grammar = K3.completion_grammar(history, vocab())
    assert refused_at(grammar, ids_of(ps)) == departure(ps, k, ["lookup"])
    ok = {**message, "tool_calls": [{"function": {"name": "lookup", "arguments": {}}}] * 2}
    accepts(grammar, ids_of(pieces(K3, history, ok)))
    # One call at most without parallel calls: the second call's open marker departs.
    one = K3.completion_grammar({**history, "parallel_tool_calls": False}, vocab())
    ps2 = pieces(K3, history, ok)
    assert refused_at(one, ids_of(ps2)) == offset(ps2, find(ps2, ["<|open|>", "call"], 1))


def test_call_indexes_count_from_one() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    history = {"messages": [{"role": "user", "content": "x"}], "tools": tools, "thinking": False}
    call = {"function": {"name": "f", "arguments": {}}}
    message: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call] * 3}
    ps = pieces(K3, history, message)
    grammar = K3.completion_grammar(history, vocab(), max_calls=3)
    accepts(grammar, ids_of(ps))
    k = find(ps, [" index", '="', "2"]) + 2
    bad = list(ps)
    bad[k] = piece(K3, "3")
    assert refused_at(grammar, ids_of(bad)) == departure(bad, k, ["2"])
    # A fourth call is one more than max_calls.
    four = pieces(K3, history, {**message, "tool_calls": [call] * 6})
    assert refused_at(grammar, ids_of(four)) == offset(four, find(four, ["<|open|>", "call"], 3))


# -- a plugin's element ----------------------------------------------------------------

CITES = st.builds(lambda s, t: {"type": "citation", "source": s, "text": t}, st.text(min_size=1, max_size=12),
                  st.text(max_size=20))


@SETTINGS
@given(st.lists(st.one_of(CITES, st.builds(lambda t: {"type": "text", "text": t}, text())), max_size=4),
       st.booleans(), st.data())
def test_citation_elements_in_the_response(parts: list[dict[str, Any]], thinking: bool,
                                           data: st.DataObject) -> None:
    tpl = cited()
    n, m = tpl.dialect.names, tpl.markers
    history = {"messages": [{"role": "user", "content": "x"}], "thinking": thinking}
    message = {"role": "assistant", "content": parts, "reasoning_content": "r"}
    ps = pieces(tpl, history, message)
    grammar = tpl.completion_grammar(history, vocab())
    assert "cite" in grammar
    accepts(grammar, ids_of(ps))
    cites = sum(1 for p in parts if p["type"] == "citation")
    bad = list(ps)
    change = data.draw(st.sampled_from(["no-source", "attribute", "in-think"] if cites and thinking else
                                       ["no-source", "attribute"] if cites else ["in-think"] if thinking else []),
                       label="change") if (cites or thinking) else None
    if change is None:
        return
    if change == "in-think":
        # A citation where only text may stand.
        k = find(ps, [m.close, n["think"], m.sep]) if ps[0].seg.text != m.open else find(ps, [m.sep]) + 1
        el = pieces(tpl, history, {"role": "assistant", "content": [{"type": "citation", "source": "s",
                                                                     "text": "t"}]})
        start = find(el, [m.open, "cite"])
        bad[k:k] = el[start : start + 11]
        want = offset(bad, k)
    elif change == "no-source":
        j = data.draw(st.integers(0, cites - 1), label="citation")
        k = find(ps, [" source", '="'], j) + 2
        del bad[k]  # source=""
        want = departure(bad, k, [])
    else:
        j = data.draw(st.integers(0, cites - 1), label="citation")
        k = find(ps, [" source", '="'], j)
        bad[k] = piece(tpl, " href")
        want = departure(bad, k, [" source"])
    assert refused_at(grammar, ids_of(bad)) == want, change


def test_plugin_fragments_are_checked(tmp_path: Path) -> None:
    from xtml.plugins.api import ContentExtension

    class Bad(ContentExtension):
        name = "bad"

        def completion_grammar(self, names: Any) -> str:
            return 'element: TEXT "x"\n'

    tpl = cited()
    d = tpl.dialect
    import dataclasses

    broken = dataclasses.replace(d, content=(*d.content, Bad()))
    with pytest.raises(xtml.TemplateError, match=r"plugin 'bad'.*unexpected 'TEXT'"):
        xtml.Template(broken).completion_grammar({"messages": [{"role": "user", "content": "x"}]})


# -- options and errors ----------------------------------------------------------------


def test_errors_name_their_place() -> None:
    req = {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {}}]}
    with pytest.raises(xtml.RequestError, match=r"tools\[0\]"):
        K3.completion_grammar(req)
    ok = {"messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(xtml.OptionError, match="declares no tools"):
        K3.completion_grammar({**ok, "tool_choice": "required"})
    with pytest.raises(xtml.OptionError, match="does not declare"):
        K3.completion_grammar({**ok, "tool_choice": {"type": "function", "function": {"name": "f"}}})
    with pytest.raises(xtml.OptionError, match="format"):
        K3.completion_grammar(ok, format="outlines")
    with pytest.raises(xtml.TokenizerError, match="pass the tokenizer"):
        K3.completion_grammar(ok, format="xgrammar")
    with pytest.raises(xtml.TokenizerError, match="not a special token"):
        K3.completion_grammar(ok, xtml.load_tokenizer(deepseek_path()))
    with pytest.raises(xtml.MessageError, match=r"messages\[0\]"):
        K3.completion_grammar({"messages": [{"role": "nobody", "content": "x"}]})


def test_markers_by_id_and_wrapped_form() -> None:
    req = {"messages": [{"role": "user", "content": "x"}], "thinking": False}
    by_id = K3.completion_grammar(req, vocab(), token_refs="id")
    ids = K3.bind(vocab()).marker_ids
    rules = by_id.split("\n", 5)[-1]
    assert "<|close|>" not in rules and f"<[{ids['<|close|>']}]>" in rules
    ps = pieces(K3, req, {"role": "assistant", "content": "hi"})
    accepts(by_id, ids_of(ps))
    for form in (json.dumps({"grammars": [{"lark_grammar": by_id}]}), llguidance.grammar_from("lark", by_id)):
        m = llguidance.LLMatcher(lltok(), form, log_level=0)
        assert m.consume_tokens(ids_of(ps)) and m.is_accepting()


def test_grammar_states_its_limits() -> None:
    props = {f"k{i}": {"type": "string", "pattern": "^a"} for i in range(70)}
    tool = {"type": "function", "function": {"name": "wide", "parameters": {
        "type": "object", "properties": props, "required": ["k0"]}}}
    req = {"messages": [{"role": "user", "content": "x"}], "tools": [tool]}
    g = K3.completion_grammar(req, vocab())
    assert "limit: tool 'wide': 70 arguments are more than 64" in g
    assert "string pattern is not enforced" in g
    x = K3.completion_grammar(req, vocab(), format="xgrammar")
    assert x.startswith("# xtml completion grammar (xgrammar)") and "cannot express" in x
    assert "limit: tool 'wide': 70 arguments are more than 6" in x


# -- the xgrammar export, run through llguidance ---------------------------------------

_EBNF_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|ExcludeToken\(([^)]*)\)|Token\((\d+)\)|'
                         r'[A-Za-z_][A-Za-z0-9_.-]*|::=|[()|?*+]|\{\d*,?\d*\}|\s+|#[^\n]*')


def ebnf_to_lark(ebnf: str) -> str:
    """xgrammar EBNF (as the export writes it) in llguidance's Lark: token
    macros as token references, character classes as regexes, literals
    respelled. Enough to run the export's rules through a real matcher."""
    out = []
    for line in ebnf.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = []
        pos = 0
        while pos < len(line):
            mt = _EBNF_TOKEN.match(line, pos)
            assert mt is not None, line[pos : pos + 40]
            t = mt.group()
            pos = mt.end()
            if t.isspace() or t.startswith("#"):
                continue
            if t.startswith("ExcludeToken"):
                parts.append("<[^" + ",".join(x.strip() for x in mt.group(1).split(",")) + "]>")
            elif t.startswith("Token("):
                parts.append(f"<[{mt.group(2)}]>")
            elif t == "::=":
                parts[-1] += ":"
            elif t.startswith('"'):
                body = t[1:-1]
                s = re.sub(r'\\x([0-9a-fA-F]{2})|\\(.)',
                           lambda x: chr(int(x.group(1), 16)) if x.group(1) else
                           {"n": "\n", "t": "\t", "r": "\r"}.get(x.group(2), x.group(2)), body)
                parts.append(json.dumps(s) if s else '""')
            elif t.startswith("["):
                parts.append("/" + t.replace("/", "\\/") + "/")
            else:
                parts.append(t.replace(".", "_").replace("-", "_"))
        out.append(" ".join(parts))
    lark = "\n".join(out).replace("root:", "start:", 1)
    return "%llguidance {}\n" + lark + "\n"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([K3, BASE]).flatmap(cases), st.data())
def test_xgrammar_export_accepts_and_refuses(case: Case, data: st.DataObject) -> None:
    ps = pieces(case.tpl, case.history, case.message)
    ebnf = case.tpl.completion_grammar(case.history, vocab(), format="xgrammar", max_calls=4)
    grammar = ebnf_to_lark(ebnf)
    accepts(grammar, ids_of(ps))
    n, m = _names(case.tpl), case.tpl.markers
    calls = case.message.get("tool_calls", [])
    if not calls:
        k = find(ps, [m.close, n["response"], m.sep]) + 1
        bad = list(ps)
        bad[k] = piece(case.tpl, n["tools"])
        assert refused_at(grammar, ids_of(bad)) == departure(bad, k, [n["response"]])
        return
    j = data.draw(st.integers(0, len(calls) - 1), label="call")
    k = find(ps, [" " + n["tool"], '="'], j) + 2
    bad = list(ps)
    bad[k] = piece(case.tpl, "z" + ps[k].seg.text)
    assert refused_at(grammar, ids_of(bad)) == departure(bad, k, [])


# -- the command line and the docs -----------------------------------------------------


def test_cli_prints_what_llguidance_loads(tmp_path: Path) -> None:
    req = {"messages": [{"role": "user", "content": "hi"}], "thinking": False,
           "tools": [{"type": "function", "function": {"name": "f", "parameters": {
               "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]}
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req))
    code, out, err = run(["export", "grammar", str(path), "--format", "llguidance", "--tokenizer",
                              deepseek_path(), "--add-markers"])
    assert code == 0, err
    assert out == K3.completion_grammar(req, vocab())
    message = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}
    accepts(out, ids_of(pieces(K3, req, message)))
    code, out, err = run(["export", "grammar", str(path), "--json"])
    assert code == 0 and json.loads(out)["grammars"][0]["lark_grammar"] == K3.completion_grammar(req)
    code, out, err = run(["export", "grammar", str(path), "--format", "xgrammar", "-o", str(tmp_path / "g")])
    assert code == 2 and "needs --tokenizer" in err
    code, out, err = run(["export", "grammar", str(path), "--format", "xgrammar", "--tokenizer",
                              deepseek_path(), "--add-markers", "-o", str(tmp_path / "g.ebnf")])
    assert code == 0 and (tmp_path / "g.ebnf").read_text().startswith("# xtml completion grammar (xgrammar)")
    path.write_text(json.dumps({**req, "tool_choice": "sometimes"}))
    code, out, err = run(["export", "grammar", str(path)])
    assert code == 1 and "tool_choice" in err and out == ""


@pytest.mark.parametrize(("schema", "said"), [
    ({"type": "string", "pattern": "(["}, "unclosed character class"),
    ({"$ref": "#/nope"}, "nope"),
])
def test_cli_refuses_a_schema_llguidance_cannot_compile(tmp_path: Path, schema: dict[str, Any], said: str) -> None:
    """What an engine would refuse at its first request is refused when the
    grammar is written, in one line."""
    req = {"messages": [{"role": "user", "content": "hi"}],
           "tools": [{"type": "function", "function": {"name": "f", "parameters": {
               "type": "object", "properties": {"a": schema}}}}]}
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req))
    code, out, err = run(["export", "grammar", str(path)])
    assert code == 1 and out == "" and err.startswith("xtml: error: llguidance cannot compile this grammar: ")
    assert said in err and err.count("\n") == 1


@pytest.mark.parametrize("depth", [450, 2000])
def test_a_schema_nested_past_the_recursion_limit_is_a_request_error(depth: int) -> None:
    # 450 levels render (JSON is written in C) but the grammar's writer
    # recurses per level; 2000 are past the JSON writer too.
    inner: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        inner = {"type": "array", "items": inner}
    req = {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required",
           "tools": [{"type": "function", "function": {"name": "f", "parameters": {
               "type": "object", "properties": {"x": inner}}}}]}
    with pytest.raises(xtml.RequestError, match=r"nested too deeply|recursion depth") as e:
        K3.completion_grammar(req)
    assert e.value.location == "tools"


WRITERS = ("xtml.codec.completion.llguidance", "xtml.codec.completion.xgrammar", "xtml.codec.completion.writer")


def _exports_loaded(code: str) -> list[str]:
    """The grammar writers loaded in a fresh interpreter that ran ``code``."""
    script = code + f"\nimport sys\nprint(sorted(m for m in sys.modules if m in {WRITERS!r}))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr
    loaded: list[str] = ast.literal_eval(done.stdout.strip())
    return loaded


def test_import_xtml_loads_no_grammar_writer() -> None:
    assert _exports_loaded("import xtml, xtml.cli.main\nxtml.load('kimi-k3')") == []


@pytest.mark.parametrize(("fmt", "other"), [("llguidance", "xgrammar"), ("xgrammar", "llguidance")])
def test_asking_for_a_format_loads_its_writer_only(tiny_tokenizer: str, fmt: str, other: str) -> None:
    code = (f"import xtml\nk3 = xtml.load('kimi-k3')\n"
            f"vocab = xtml.load_tokenizer({tiny_tokenizer!r}, add_special_tokens=k3.markers.all())\n"
            f"k3.completion_grammar({{'messages': [{{'role': 'user', 'content': 'hi'}}]}}, vocab, format={fmt!r})")
    loaded = _exports_loaded(code)
    assert f"xtml.codec.completion.{fmt}" in loaded and f"xtml.codec.completion.{other}" not in loaded


def test_a_writer_refuses_a_plan_made_for_the_other_format() -> None:
    from xtml.codec.completion import completion_plan
    from xtml.codec.completion import llguidance as lark_writer
    from xtml.codec.completion import xgrammar as ebnf_writer

    req = {"messages": [{"role": "user", "content": "hi"}]}
    plan = completion_plan(K3.dialect, K3.bind(vocab()), req, format="xgrammar")
    assert ebnf_writer.write(plan) == K3.completion_grammar(req, vocab(), format="xgrammar")
    with pytest.raises(xtml.OptionError, match="spelled for xgrammar, not llguidance"):
        lark_writer.write(plan)
    with pytest.raises(xtml.OptionError, match="spelled for llguidance, not xgrammar"):
        ebnf_writer.write(completion_plan(K3.dialect, None, req))


def test_docs_examples_run() -> None:
    """Every ```python block of docs/grammar.md runs as written."""
    run_examples("docs/grammar.md")


def test_the_structural_tag_writes_markers_as_tokens_and_says_its_limits(tmp_path: Path) -> None:
    """The xgrammar structural tag: every marker a ``token`` by id, text
    tokens that are not special, and what it cannot express in its ``xtml``
    member (xgrammar itself matches it in tests/test_grammar_xgrammar.py)."""
    req = {"messages": [{"role": "user", "content": "hi"}], "thinking": True,
           "tools": [{"type": "function", "function": {"name": "f", "parameters": {
               "type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}}}}]}
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req))
    code, out, err = run(["export", "grammar", str(path), "--format", "xgrammar-tag", "--tokenizer",
                          deepseek_path(), "--add-markers"])
    assert code == 0, err
    tag = json.loads(out)
    v = xtml.load_tokenizer(deepseek_path(), add_special_tokens=K3.markers.all())
    assert out == K3.completion_grammar(req, v, format="xgrammar-tag") + "\n"
    assert tag["type"] == "structural_tag"
    assert tag["xtml"]["summary"].endswith("thinking on; tools 'f'; tool_choice auto")
    assert any("string lengths" in x for x in tag["xtml"]["limits"])

    def walk(f: Any) -> Any:
        yield f
        for x in f.get("elements", ()):
            yield from walk(x)
        if isinstance(f.get("content"), dict):
            yield from walk(f["content"])

    parts = list(walk(tag["format"]))
    ids = K3.bind(v).marker_ids
    tokens = {p["token"] for p in parts if p["type"] == "token"}
    assert tokens == {ids[m] for m in (K3.markers.open, K3.markers.close, K3.markers.sep, K3.markers.end)}
    texts = [p for p in parts if p["type"] == "any_tokens"]
    assert texts and all(set(p["exclude_tokens"]) == v.special_ids() for p in texts)
    assert not any(m in p.get("value", "") for p in parts for m in K3.markers.all())
    (grammar,) = [p for p in parts if p["type"] == "grammar"]
    assert "Token(" in grammar["grammar"] and grammar["syntax"] == "ebnf"
    code, out, err = run(["export", "grammar", str(path), "--format", "xgrammar-tag"])
    assert code == 2 and "needs --tokenizer" in err
    from xtml.codec.completion import completion_plan, xgrammar_tag

    with pytest.raises(xtml.OptionError, match="spelled for xgrammar, not xgrammar-tag"):
        xgrammar_tag.write(completion_plan(K3.dialect, K3.bind(vocab()), req, format="xgrammar"))


def test_a_grammar_after_the_reasoning_starts_at_the_next_channel() -> None:
    """``after_reasoning=True``: the grammar of what follows the reasoning's
    close (what vLLM constrains), which takes the rest of a rendered answer
    and refuses reasoning text; with thinking off it is the whole grammar."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}]
    req = {"messages": [{"role": "user", "content": "q"}], "tools": tools, "tool_choice": "required",
           "thinking": True}
    call = {"type": "function", "function": {"name": "f", "arguments": {"a": "x"}}}
    ps = pieces(K3, req, {"role": "assistant", "reasoning_content": "hm", "content": "", "tool_calls": [call]})
    ids = ids_of(ps)
    b = K3.bind(vocab())
    end = [b.marker_ids[K3.markers.close], *vocab().ids_of(["think"])[0], b.marker_ids[K3.markers.sep]]
    k = next(i for i in range(len(ids)) if ids[i:i + len(end)] == end)
    after = K3.completion_grammar(req, vocab(), after_reasoning=True)
    accepts(after, ids[k + len(end):])
    assert refused_at(after, ids) == 0
    off = {**req, "thinking": False}
    assert K3.completion_grammar(off, vocab(), after_reasoning=True) == K3.completion_grammar(off, vocab())
