"""The Jinja and Hugging Face exports of the Gemma 4 layout dialect
(xtml/dialects/gemma-4.toml), rendered by transformers,
``@huggingface/jinja`` and llama.cpp's server: xtml's text, or a raise with
xtml's message where xtml refuses. What the format asks of the exporter
beyond the other dialects: tools declared and an object's arguments written
by a value syntax, whose writer comes from the syntax as Jinja macros (keys
sorted as Python's ``dictsort``, numbers as Python's ``str()``); tool results
folded into the calling turn under the name of the call they answer; a
turn left waiting for results, or open and continued by the next answer;
text trimmed part by part and reasoning spelled in content cut out; the
reasoning keys in the format's order. Where an engine cannot write what
Python writes (a key of other than printable ASCII to sort, a float its
``tojson`` rounds), the template raises rather than write other text."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.family_requests import family_requests
from tests.helpers.jinja_engines import ENGINES, need_engine
from tests.helpers.jinja_probe import xtml_render
from tests.helpers.layout_export import SETTLED, hf_export, hf_renders, load_dialect, outcomes
from xtml.exports.jinja import jinja_template

pytestmark = pytest.mark.engines

FILE = Path(xtml.__file__).resolve().parent / "dialects" / "gemma-4.toml"
"""The dialect file (loaded by path here only)."""

N = 90
LIMITS = ("this engine's Jinja cannot write what the gemma value syntax writes here",
          "this engine's tojson writes the number ")
"""The template's own raises where an engine cannot write what xtml writes."""
Q = '<|"|>'


def load(path: Path = FILE) -> xtml.Template:
    return load_dialect(path)


@pytest.fixture(scope="module")
def tpl() -> xtml.Template:
    return load()


def corpus() -> list[dict[str, Any]]:
    return [{**c["request"], **c["options"]} for c in family_requests("gemma-4", N)]


def features(text: str) -> set[str]:
    """What a request rendered by xtml exercised."""
    out = set()
    for name, piece in (("tools declared", "<|tool>declaration:"), ("calls", "<|tool_call>call:"),
                        ("results folded", "<|tool_response>response:"), ("thinking", "<|think|>"),
                        ("reasoning shown", "<|channel>thought\n"), ("string arguments", "{{")):
        if piece in text:
            out.add(name)
    if text.endswith("<tool_call|><|tool_response>"):
        out.add("calls waiting for results")
    if "<tool_response|><|tool_call>" in text or "<turn|>\n<|tool_call>" in text:
        out.add("a turn continued")
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_the_template_renders_what_xtml_renders(engine: str, tpl: xtml.Template) -> None:
    """The family's generated requests (tools, parallel calls, results in a
    row and as parts, reasoning, thinking, marker spellings in text):
    xtml's text from what the engine handed over, or both refuse (counted)."""
    need_engine(engine)
    requests = corpus()
    got = outcomes(engine, tpl, requests, limits=LIMITS)
    counts = got["counts"]
    for request in requests:
        want, _ = xtml_render(tpl, request)
        if want is not None:
            counts.update(features(want))
    print(f"gemma-4 {engine}: {dict(counts)}")
    assert not got["bad"], f"{len(got['bad'])} differ ({dict(counts)}); the first:\n{got['bad'][0]}"
    assert sum(counts[k] for k in SETTLED) == N, dict(counts)
    assert counts["equal"] >= N * 2 // 3, dict(counts)
    for feature in ("tools declared", "calls", "results folded", "thinking", "reasoning shown", "string arguments"):
        assert counts[feature] >= 3, (feature, dict(counts))


# -- the keys one by one ------------------------------------------------------------------------

RICH = {"type": "function", "function": {
    "name": "f", "description": "say \"hi\" \\ {{ x }} {% y %}",
    "parameters": {"type": "object", "properties": {
        "b": {"type": "string", "enum": ["x\"y", "Z", "é"], "description": "B."},
        "A": {"type": "array", "items": {"type": "object", "required": ["k"], "properties": {
            "k": {"type": "integer", "nullable": True}}, "maxItems": 3}},
        "a": {"type": "number", "default": 0.5, "minimum": 1e-05},
        "items": {"type": "object", "properties": {"z": {"type": "boolean"}, "Y": {"type": "string"}},
                  "required": ["Y"]},
        "n": {"type": "array", "items": {"type": ["string", "null"]}},
        "o": {"type": "object"}},
        "required": ["b", "a"]},
    "response": {"type": "object", "description": "R."}}}
PLAIN = {"type": "function", "function": {"name": "g", "description": "G", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}
USER = {"role": "user", "content": " q "}


def call(name: str, args: Any, cid: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
    if cid is not None:
        out["id"] = cid
    return out


def answer(*calls: dict[str, Any], content: Any = "", **more: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls), **more}


def result(content: Any, cid: str | None = None, name: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "tool", "content": content}
    if cid is not None:
        out["tool_call_id"] = cid
    if name is not None:
        out["name"] = name
    return out


ARGS = {"b": "x\"\\\n", "Zeta": [1, 2.5, None, True, {"Inner": "v", "a": 0.1}], "alpha": -3, "items": {"get": 1e-07},
        "A": 1e16, "a": "é"}


def key_requests() -> list[tuple[str, dict[str, Any]]]:
    """(what it holds, a request) for each key the format adds, each way it
    renders or raises."""
    turn = [USER, answer(call("f", ARGS, "c1"), call("g", '{"q": 1}', "c2"), reasoning_content="R"),
            result(" r1 ", "c1"), result([{"type": "text", "text": "a"}, {"type": "text", "text": " b "}], "c2")]
    return [
        ("tools: enum, items, nullable, nested objects, a response, a type list",
         {"messages": [{"role": "system", "content": "  S  "}, USER], "tools": [RICH, PLAIN]}),
        ("tools with thinking and a developer message",
         {"messages": [{"role": "developer", "content": "D"}, USER], "tools": [PLAIN], "enable_thinking": True}),
        ("an empty tool list", {"messages": [USER], "tools": []}),
        ("arguments sorted, numbers as str(), a string as given; results folded",
         {"messages": turn, "tools": [RICH, PLAIN]}),
        ("results with content close the turn", {"messages": [*turn[:3], {**turn[1], "content": "so"}]}),
        ("a turn left open continued by the next answer",
         {"messages": [*turn, answer(call("g", {}), content=None)], "add_generation_prompt": True}),
        ("an answer after results with content", {"messages": [*turn, {"role": "assistant", "content": "done"}]}),
        ("calls waiting for results, no prompt", {"messages": [USER, answer(call("g", {"q": "x"}))]}),
        ("a result under its own name", {"messages": [USER, answer(call("g", {}, "c1")), result("r", "zz", "h")]}),
        ("absent ids match absent ids", {"messages": [USER, answer(call("g", {}), call("f", {})), result("r")]}),
        ("a result after a user message is left out", {"messages": [USER, result("r", name="g"), USER]}),
        ("reasoning in content cut, text trimmed part by part", {"messages": [
            USER, {"role": "assistant", "content": [{"type": "text", "text": " a<|channel>x<channel|>b "},
                                                    {"type": "text", "text": " c "}]}, USER]}),
        ("reasoning keys in the format's order", {"messages": [
            USER, answer(call("g", {}), reasoning="A", reasoning_content="B", thinking="T")]}),
        ("a key of other than ASCII among others", {"messages": [USER, answer(call("g", {"é": 1, "a": 2}))]}),
        # Refused by xtml and the template alike.
        ("a result with no name to write", {"messages": [USER, answer(call("g", {}, "c1")), result("r", "c9")]}),
        ("a result without content", {"messages": [USER, answer(call("g", {}, "c1")), result(None, "c1")]}),
        ("a result's part that is no text part",
         {"messages": [USER, answer(call("g", {}, "c1")), result(["r"], "c1")]}),
        ("an argument that spells a token", {"messages": [USER, answer(call("g", {"k": [1, {"x": "<turn|>"}]}))]}),
        ("an argument's key that spells a token", {"messages": [USER, answer(call("g", {"<|tool>": 1}))]}),
        ("a key that cannot be written bare", {"messages": [USER, answer(call("g", {"a": {"k:": 1}}))]}),
        ("a tool that spells a token", {"messages": [USER], "tools": [
            PLAIN, {"type": "function", "function": {"name": "h", "description": "ends <tool|> early"}}]}),
        ("a tool that is no function", {"messages": [USER], "tools": [{"name": "f"}]}),
        ("tools that are no list", {"messages": [USER], "tools": "f"}),
        ("a system list of parts", {"messages": [{"role": "system", "content": [{"type": "text", "text": "s"}]},
                                                 USER]}),
        ("reasoning that is no string", {"messages": [USER, answer(call("g", {}), reasoning=5)]}),
        ("a user's part that is no text part", {"messages": [{"role": "user", "content": ["q"]}]}),
    ]


# How many requests of :func:`key_requests` each engine cannot write as xtml
# does (the template raises): keys of other than printable ASCII to sort.
ENGINE_LIMITS = {"transformers": 0, "hfjs": 1, "llamacpp": 1}


@pytest.mark.parametrize("engine", ENGINES)
def test_each_key_renders_as_xtml_or_raises_alike(engine: str, tpl: xtml.Template) -> None:
    """Each key the format adds, each way it renders or raises: xtml's text;
    xtml's message where xtml refuses; the template's own raise where the
    engine cannot write what xtml writes, never other text."""
    need_engine(engine)
    requests = [r for _, r in key_requests()]
    got = outcomes(engine, tpl, requests, limits=LIMITS)
    counts = got["counts"]
    print(f"gemma-4 keys {engine}: {dict(counts)}")
    assert not got["bad"], f"{len(got['bad'])} differ ({dict(counts)}); the first:\n{got['bad'][0]}"
    assert counts["the engine cannot write it: the template raises"] == ENGINE_LIMITS[engine], dict(counts)
    assert sum(counts[k] for k in SETTLED) == len(requests), dict(counts)
    assert counts["equal"] >= 10 and counts["both refuse"] + counts["both refuse content as parts"] >= 5, \
        dict(counts)


def test_the_value_syntax_writes_its_own_macros(tpl: xtml.Template) -> None:
    """The template holds the gemma syntax's macros, and the core's writer
    names no syntax: a syntax without the ``jinja`` operation is refused by
    name at the dialect's file."""
    from xtml.plugins.values import NoOperation, ValueSyntax, load_value_syntax

    template = jinja_template(tpl.dialect)
    assert "{%- macro x_vs_declare(tools) -%}" in template and "{%- macro x_vs_write(arguments, at) -%}" in template
    assert "jinja" in load_value_syntax("gemma").operations

    class NoJinja(ValueSyntax):
        name = "plain"
        operations = frozenset({"declare", "write"})

    with pytest.raises(NoOperation, match="no 'jinja' operation"):
        NoJinja().jinja_macros("p_")
    import xtml.plugins.values as values

    values._loaded["plain"] = NoJinja()
    try:
        d: Any = tpl.dialect
        for bad in (dataclasses.replace(d, tools_syntax="plain"), dataclasses.replace(d, calls_syntax="plain")):
            with pytest.raises(xtml.TemplateError, match="value syntax 'plain' has no 'jinja' operation") as info:
                jinja_template(bad)
            assert str(info.value).endswith(f"(at {FILE})"), info.value
    finally:
        del values._loaded["plain"]


def test_what_the_writer_cannot_write_is_refused(tpl: xtml.Template) -> None:
    """Folded results beside what the fold does not write, arguments by a
    syntax without folded results: refused at the file."""
    d: Any = tpl.dialect
    for bad, says in ((dataclasses.replace(d, flags=("prefix",), message_conds=True), "with flags"),
                      (dataclasses.replace(d, call_result=None, calls_pending=None, results_open=False, continues=(),
                                           content_trim=(), content_strip=None, reasoning_keys=()),
                       "arguments by a value syntax with tool results folded")):
        with pytest.raises(xtml.TemplateError, match=says) as info:
            jinja_template(bad)
        assert str(info.value).endswith(f"(at {FILE})"), info.value


def test_export_jinja_and_the_hf_folder(tpl: xtml.Template, tmp_path: Path) -> None:
    """``xtml export jinja`` prints the template; the folder of ``xtml
    export hf``, loaded by transformers alone, renders xtml's text."""
    _, hf = hf_export(tpl, str(FILE), tmp_path / "gemma")
    texts = hf_renders(tpl, hf, corpus())
    assert texts >= N // 2, texts
