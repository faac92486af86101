"""The Jinja and Hugging Face exports of the gpt-oss layout dialect
(xtml/dialects/gpt-oss.toml), rendered by transformers,
``@huggingface/jinja`` and llama.cpp's server: xtml's text, or a raise with
xtml's message where xtml refuses. What the format asks of the exporter
beyond the other dialects: one message written as several (an answer's
reasoning on the analysis channel where the history policy or the end of the
render shows it, its first call on the commentary channel with the content
beside it as the reasoning, its text on the final channel), a tool result
from ``functions.NAME`` of the call it answers, a later system message left
out, the system message with the date (given, or the engine's clock), the
model's identity, the reasoning effort and the built-in tools a list option
names, and the tools as a TypeScript namespace written by the value syntax's
own Jinja macros. Where an engine cannot write what Python writes (``str()``
of a list, the length of a type of other than ASCII, a float its ``tojson``
rounds), the template raises rather than write other text."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

import xtml
from tests.helpers.family_requests import family_requests
from tests.helpers.jinja_engines import ENGINES, need_engine, render_all
from tests.helpers.jinja_probe import toml, xtml_render
from tests.helpers.layout_export import HOSTILE_TEXT, SETTLED, braced, hf_export, hf_renders, load_dialect, outcomes
from xtml.exports.jinja import jinja_template

pytestmark = pytest.mark.engines

FILE = Path(xtml.__file__).resolve().parent / "dialects" / "gpt-oss.toml"
"""The dialect file (loaded by path here only)."""

N = 120
LIMITS = ("this engine's Jinja cannot write what the typescript value syntax writes here",
          "this engine's Jinja cannot write Python's str()", "this engine's tojson writes the number ")
"""The template's own raises where an engine cannot write what xtml writes."""


def load(path: Path = FILE) -> xtml.Template:
    return load_dialect(path)


@pytest.fixture(scope="module")
def tpl() -> xtml.Template:
    return load()


def corpus() -> list[dict[str, Any]]:
    """The family's generated requests; every third without ``date`` (the
    system message then holds the day the engine's clock gives)."""
    out = []
    for k, c in enumerate(family_requests("gpt-oss", N)):
        options = {o: v for o, v in c["options"].items() if not (o == "date" and k % 3 == 0)}
        out.append({**c["request"], **options})
    return out


def features(request: dict[str, Any], text: str) -> set[str]:
    """What a request rendered by xtml exercised."""
    out = set()
    for name, piece in (("tools declared", "namespace functions {"), ("calls", "<|channel|>commentary json"),
                        ("results", "<|start|>functions."), ("reasoning shown", "<|channel|>analysis<|message|>"),
                        ("final answers", "<|channel|>final<|message|>"), ("ends the render", "<|return|>"),
                        ("builtin tools", "## browser"), ("developer message", "<|start|>developer")):
        if piece in text:
            out.add(name)
    if "Current date: " in text:
        out.add("date given" if "date" in request else "date from the clock")
    if "model_identity" in request:
        out.add("model_identity")
    if "reasoning_effort" in request:
        out.add("reasoning_effort")
    return out


def rewrites_return(request: dict[str, Any]) -> bool:
    """Whether llama-server changes the prompt the template wrote: for a
    gpt-oss template and a request without a generation prompt it replaces
    the prompt's last ``<|return|>`` by ``<|end|>`` (its own handling of the
    format, after the template), which here is one a message's text spells."""
    return request.get("add_generation_prompt") is False and "<|return|>" in json.dumps(request["messages"])


@pytest.mark.parametrize("engine", ENGINES)
def test_the_template_renders_what_xtml_renders(engine: str, tpl: xtml.Template) -> None:
    """The family's generated requests (tools, calls and results, reasoning,
    the system message's options, marker spellings in text): xtml's text
    from what the engine handed over, or both refuse, or the template raises
    where the engine cannot write what xtml writes (counted)."""
    need_engine(engine)
    requests = corpus()
    rewritten = [r for r in requests if engine == "llamacpp" and rewrites_return(r)]
    requests = [r for r in requests if r not in rewritten]
    got = outcomes(engine, tpl, requests, limits=LIMITS)
    counts = got["counts"]
    counts["llama-server rewrites the prompt's last <|return|>"] = len(rewritten)
    assert len(rewritten) <= N // 10, len(rewritten)
    for request in requests:
        want, _ = xtml_render(tpl, request)
        if want is not None:
            counts.update(features(request, want))
    print(f"gpt-oss {engine}: {dict(counts)}")
    assert not got["bad"], f"{len(got['bad'])} differ ({dict(counts)}); the first:\n{got['bad'][0]}"
    assert sum(counts[k] for k in SETTLED) == len(requests), dict(counts)
    assert counts["equal"] >= N * 2 // 3, dict(counts)
    assert counts["both refuse"] >= 3, dict(counts)
    for feature in ("tools declared", "calls", "results", "reasoning shown", "final answers", "ends the render",
                    "builtin tools", "developer message", "date given", "date from the clock", "model_identity",
                    "reasoning_effort"):
        assert counts[feature] >= 3, (feature, dict(counts))


# -- the keys one by one ------------------------------------------------------------------------

RICH = {"type": "function", "function": {
    "name": "f", "description": "say \"hi\" \\ {{ x }} {% y %}",
    "parameters": {"type": "object", "properties": {
        "b": {"type": "string", "enum": ["x\"y", "Z", 3], "description": "B.", "default": "Z"},
        "A": {"type": "array", "items": {"type": "object", "required": ["k"], "properties": {
            "k": {"type": "integer"}, "s": {"type": "string", "nullable": True}}}},
        "a": {"type": "number", "default": 0.5, "description": "é"},
        "items": {"type": "object", "properties": {"z": {"type": "boolean"}, "Y": {"type": "string"}},
                  "required": ["Y"]},
        "n": {"type": "array", "items": {"type": ["string", "null"]}, "nullable": True},
        "m": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        "w": {"type": "array"},
        "o": {"oneOf": [{"type": "string", "description": "s", "default": "v"}, {"type": "number", "default": 2},
                        {"type": "object", "properties": {"q": {"type": "string"}}}], "default": "v"},
        "t": {"type": ["string", "integer"], "default": {"k": [1, None, True]}},
        "u": {"description": "anything"}},
        "required": ["b", "a"]}}}
PLAIN = {"type": "function", "function": {"name": "g", "description": "G", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}
BARE = {"type": "function", "function": {"name": "h", "description": "no parameters"}}
USER = {"role": "user", "content": "q"}
DAY = {"date": "2025-06-01"}


def call(name: str, args: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}


def answer(*calls: dict[str, Any], content: Any = "", **more: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls), **more}


def tool_with(name: str, **fn: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "d", **fn}}


def key_requests() -> list[tuple[str, dict[str, Any]]]:
    """(what it holds, a request) for each key the format adds, each way it
    renders or raises."""
    turn = [USER, answer(call("f", {"b": "Z", "a": 1.25}), content="let me look"),
            {"role": "tool", "content": "42"}, {"role": "tool", "content": [{"type": "text", "text": "t"}]}]
    return [
        ("tools: enum, arrays, nested objects, oneOf, type lists, defaults, a key named items",
         {"messages": [{"role": "system", "content": "  S  "}, USER], "tools": [RICH, PLAIN, BARE], **DAY}),
        ("a developer message, built-in tools, identity and effort",
         {"messages": [{"role": "developer", "content": "D"}, USER], "tools": [PLAIN], "builtin_tools": ["python"],
          "model_identity": "You are M.", "reasoning_effort": "high", **DAY}),
        ("built-in tools alone, one unknown", {"messages": [USER], "builtin_tools": ["browser", "x"], **DAY}),
        ("an empty tool list", {"messages": [USER], "tools": [], **DAY}),
        ("a system message of parts, as Python's str()",
         {"messages": [{"role": "system", "content": [{"type": "text", "text": "it's"}]}, USER], **DAY}),
        ("a call with content as its reasoning, results named by it",
         {"messages": turn, "tools": [RICH], **DAY}),
        ("reasoning after the last answer shown, the ending answer's given even empty",
         {"messages": [USER, {"role": "assistant", "content": "a", "reasoning_content": "old"}, USER,
                       answer(call("g", '{"q": "x"}'), thinking="plan"), {"role": "tool", "content": "r"},
                       {"role": "assistant", "content": "done", "reasoning": ""}],
          "add_generation_prompt": False, **DAY}),
        ("only the first call is written", {"messages": [USER, answer(call("g", {}), call("h", {}))], **DAY}),
        ("a later system message is left out",
         {"messages": [USER, {"role": "system", "content": "late"}, {"role": "assistant", "content": "x"}],
          "add_generation_prompt": False, **DAY}),
        ("an answer without content beside its call", {"messages": [USER, answer(call("g", {}), content=None)],
                                                       **DAY}),
        # Refused by xtml and the template alike.
        ("content and reasoning both beside a call",
         {"messages": [USER, answer(call("g", {}), content="c", reasoning_content="r")], **DAY}),
        ("a channel header in content",
         {"messages": [USER, {"role": "assistant", "content": "x<|channel|>final<|message|>y"}], **DAY}),
        ("a channel header in reasoning",
         {"messages": [USER, {"role": "assistant", "content": "x", "thinking": "<|channel|>analysis<|message|>"}],
          **DAY}),
        ("reasoning under two names", {"messages": [USER, {"role": "assistant", "content": "x",
                                                           "reasoning_content": "a", "reasoning": "b"}], **DAY}),
        ("a result after no call", {"messages": [USER, {"role": "tool", "content": "r"}], **DAY}),
        ("an empty list of calls", {"messages": [USER, answer(content="x")], **DAY}),
        ("an answer without content or calls", {"messages": [USER, {"role": "assistant"}], **DAY}),
        ("built-in tools that are no list", {"messages": [USER], "builtin_tools": "browser", **DAY}),
        ("tools that are no list", {"messages": [USER], "tools": "f", **DAY}),
        ("a tool that spells a token", {"messages": [USER], "tools": [tool_with("a<|end|>")], **DAY}),
        ("a tool without a description", {"messages": [USER], "tools": [
            {"type": "function", "function": {"name": "f"}}], **DAY}),
        ("a description that is no string", {"messages": [USER], "tools": [
            {"type": "function", "function": {"name": "f", "description": 5}}], **DAY}),
        ("a tool that is no function", {"messages": [USER], "tools": [{"name": "f"}], **DAY}),
        ("properties that are no object", {"messages": [USER], "tools": [tool_with("f", parameters={
            "type": "object", "properties": {"p": {"type": "object", "properties": ["x"]}}})], **DAY}),
        ("required that is no list", {"messages": [USER], "tools": [tool_with("f", parameters={
            "type": "object", "properties": {"p": {"type": "string"}}, "required": 3})], **DAY}),
        ("an enum default that is no string", {"messages": [USER], "tools": [tool_with("f", parameters={
            "type": "object", "properties": {"p": {"type": "string", "enum": ["a"], "default": 1}}})], **DAY}),
        ("a date that is no string", {"messages": [USER], "date": 5}),
    ]


# How many requests of :func:`key_requests` each engine cannot write as xtml
# does (the template raises): a system message of parts as Python's str()
# outside jinja2 (the template spells printable ASCII itself) writes alike.
ENGINE_LIMITS = {"transformers": 0, "hfjs": 0, "llamacpp": 0}


@pytest.mark.parametrize("engine", ENGINES)
def test_each_key_renders_as_xtml_or_raises_alike(engine: str, tpl: xtml.Template) -> None:
    """Each key the format adds, each way it renders or raises: xtml's text;
    xtml's message where xtml refuses; the template's own raise where the
    engine cannot write what xtml writes, never other text."""
    need_engine(engine)
    requests = [r for _, r in key_requests()]
    got = outcomes(engine, tpl, requests, limits=LIMITS)
    counts = got["counts"]
    print(f"gpt-oss keys {engine}: {dict(counts)}")
    assert not got["bad"], f"{len(got['bad'])} differ ({dict(counts)}); the first:\n{got['bad'][0]}"
    assert counts["the engine cannot write it: the template raises"] == ENGINE_LIMITS[engine], dict(counts)
    assert sum(counts[k] for k in SETTLED) == len(requests), dict(counts)
    # llama-server hands some requests over otherwise (parts joined, a
    # generation prompt added), which xtml then renders.
    assert counts["equal"] >= 9 and counts["both refuse"] + counts["both refuse content as parts"] >= 8, \
        dict(counts)


MUTATIONS: tuple[tuple[str, Any], ...] = (
    ("reasoning_content", "a"), ("thinking", "b"), ("content", "x<|channel|>final<|message|>"),
    ("reasoning", "<|channel|>analysis<|message|>"), ("tool_calls", []), ("role", "tool"), ("content", None),
    ("content", 5), ("content", [{"type": "text", "text": "p"}]), ("role", "developer"),
    ("tool_calls", [{"type": "function", "function": {"name": "zz", "arguments": {"k": 1}}}]), ("bogus", 1),
    ("reasoning_content", 3))
"""A message's field set to a value the format writes or refuses."""


def mutated(n: int) -> list[dict[str, Any]]:
    """The family's requests with one to three messages' fields set from
    :data:`MUTATIONS` (several refusals in one request, in any order)."""
    import random

    rnd = random.Random(7)
    out = []
    for c in family_requests("gpt-oss", n):
        request = json.loads(json.dumps({**c["request"], **c["options"]}))
        for _ in range(rnd.randint(1, 3)):
            key, value = rnd.choice(MUTATIONS)
            rnd.choice(request["messages"])[key] = value
        out.append(request)
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_several_refusals_in_one_request_raise_as_xtml_raises(engine: str, tpl: xtml.Template) -> None:
    """Requests with several of the format's refusals: the template raises
    the one xtml raises (its checks run message by message, each in xtml's
    order), or renders xtml's text."""
    need_engine(engine)
    requests = [r for r in mutated(60) if not (engine == "llamacpp" and rewrites_return(r))]
    got = outcomes(engine, tpl, requests, limits=LIMITS)
    counts = got["counts"]
    print(f"gpt-oss mutated {engine}: {dict(counts)}")
    assert not got["bad"], f"{len(got['bad'])} differ ({dict(counts)}); the first:\n{got['bad'][0]}"
    assert sum(counts[k] for k in SETTLED) == len(requests), dict(counts)
    # llama-server refuses some itself and hands others over mended.
    assert counts["both refuse"] >= (len(requests) // 3 if engine != "llamacpp" else 8), dict(counts)


def test_the_value_syntax_writes_its_own_macros(tpl: xtml.Template) -> None:
    """The template holds the typescript syntax's macros, and the core's
    writer names no syntax: a syntax without the ``jinja`` operation is
    refused by name at the dialect's file."""
    from xtml.plugins.values import NoOperation, ValueSyntax, load_value_syntax

    template = jinja_template(tpl.dialect)
    assert "{%- macro x_vs_declare(tools) -%}" in template
    exports = Path(xtml.__file__).parent / "exports"
    assert not [p.name for p in exports.glob("*.py") if "typescript" in p.read_text(encoding="utf-8").lower()]
    assert "jinja" in load_value_syntax("typescript").operations

    class NoJinja(ValueSyntax):
        name = "plain"
        operations = frozenset({"declare"})

    with pytest.raises(NoOperation, match="no 'jinja' operation"):
        NoJinja().jinja_macros("p_")
    import xtml.plugins.values as values

    values._loaded["plain"] = NoJinja()
    try:
        with pytest.raises(xtml.TemplateError, match="value syntax 'plain' has no 'jinja' operation") as info:
            d: Any = tpl.dialect
            jinja_template(dataclasses.replace(d, tools_syntax="plain"))
        assert str(info.value).endswith(f"(at {FILE})"), info.value
    finally:
        del values._loaded["plain"]


def test_the_declaration_is_the_syntax_s_own() -> None:
    """The macros write what :meth:`declare` writes, tool by tool, in
    jinja2 (the corpus and the keys run every engine)."""
    from xtml.plugins.typescript import syntax
    from xtml.plugins.typescript_jinja import macros

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    source = ("{%- set x_py = true -%}{%- macro x_ascii(s) -%}y{%- endmacro -%}"
              "{%- macro x_repr(s) -%}{{ s }}{%- endmacro -%}{%- macro x_pfloat(v) -%}{{ v }}{%- endmacro -%}"
              + macros("t_") + "{{ t_declare(tools) }}")
    compiled = env.from_string(source)
    for tools in ([RICH], [PLAIN, BARE], [], [tool_with("e", parameters={"type": "object", "properties": {
            "p": {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "object"}]}}}})]):
        assert compiled.render(tools=tools) == syntax.declare(tools), tools


def test_what_the_writer_cannot_write_is_refused(tpl: xtml.Template) -> None:
    """Keys the split writer does not write beside a message written as
    several: refused at the file, never written half-right."""
    d: Any = tpl.dialect
    for bad, says in ((dataclasses.replace(d, flags=("prefix",), message_conds=True), "message flags"),
                      (dataclasses.replace(d, calls_section=d.calls_each), "a calls section"),
                      (dataclasses.replace(d, missing_by_role={"user": "with_calls"}), "content.missing.user")):
        with pytest.raises(xtml.TemplateError, match=says) as info:
            jinja_template(bad)
        assert str(info.value).endswith(f"(at {FILE})"), info.value


def test_the_clock_and_an_engine_without_one(tpl: xtml.Template) -> None:
    """Without ``date``, the system message holds the day the engine's
    ``strftime_now`` gives (transformers' here); an engine that has none
    raises, and renders when ``date`` is given."""
    template = jinja_template(tpl.dialect)
    request = {"messages": [USER], "add_generation_prompt": False}
    before = datetime.now().strftime("%Y-%m-%d")
    got = render_all("transformers", template, [request])[0]
    after = datetime.now().strftime("%Y-%m-%d")
    assert got.text in {tpl.render(request, date=day).text for day in (before, after)}
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(template)
    with pytest.raises(jinja2.TemplateError, match=r"no clock \(strftime_now\): give date \(at option 'date'\)"):
        compiled.render(messages=[USER], tools=None, add_generation_prompt=False)
    assert compiled.render(messages=[USER], tools=None, add_generation_prompt=False, date="1999-12-31") == \
        tpl.render(request, date="1999-12-31").text


def _hostile_file() -> str:
    """The dialect file with Jinja's delimiters, quotes and backslashes in the
    text it adds: the system message, a tool result's header, a call."""
    text = FILE.read_text(encoding="utf-8")
    swaps = {"turn = '''<|start|>system<|message|>{model_identity}":
             "turn = '''<|start|>system<|message|>{model_identity}" + braced(HOSTILE_TEXT),
             'open = "<|start|>functions.{call_name} to=assistant':
             "open = " + toml("<|start|>functions.{call_name}" + braced(HOSTILE_TEXT))[:-1] + " to=assistant",
             'each = "<|start|>assistant to=functions.{name}':
             "each = " + toml("<|start|>assistant to=functions.{name}" + braced(HOSTILE_TEXT))[:-1]}
    for old, new in swaps.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize("engine", ENGINES)
def test_hostile_text_in_what_the_format_adds_stays_text(engine: str, tmp_path: Path) -> None:
    """Each engine renders xtml's text from the exported template of a file
    whose system message, result header and call hold Jinja's delimiters,
    quotes and backslashes."""
    need_engine(engine)
    path = tmp_path / "hostile.toml"
    path.write_text(_hostile_file(), encoding="utf-8")
    hostile = load(path)
    requests: list[dict[str, Any]] = [
        {"messages": [USER], "tools": [PLAIN], **DAY},
        {"messages": [USER, answer(call("g", {"q": "x"})), {"role": "tool", "content": "r"}], "tools": [PLAIN],
         **DAY}]
    text = "".join(hostile.render(r).text for r in requests)
    for spelt in ("OpenAI." + HOSTILE_TEXT,
                  "functions.g" + HOSTILE_TEXT, "to=functions.g" + HOSTILE_TEXT):
        assert spelt in text, spelt
    got = outcomes(engine, hostile, requests, route=True)
    assert not got["bad"], got["bad"][0]
    assert got["counts"]["equal"] == len(requests), dict(got["counts"])


def test_export_jinja_and_the_hf_folder(tpl: xtml.Template, tmp_path: Path) -> None:
    """``xtml export jinja`` prints the template; the folder of ``xtml
    export hf``, loaded by transformers alone, renders xtml's text."""
    _, hf = hf_export(tpl, str(FILE), tmp_path / "gpt-oss")
    # (Requests without a date read the clock: the test above.)
    texts = hf_renders(tpl, hf, (r for r in corpus() if "date" in r))
    assert texts >= N // 3, texts
