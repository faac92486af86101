"""The Jinja and Hugging Face exports of the Mistral Small 3.1 layout dialect
(xtml/dialects/mistral-small-3.1.toml), rendered by transformers,
``@huggingface/jinja`` and llama.cpp's server: xtml's text, or a raise with
xtml's message where xtml refuses. What the format asks of the exporter
beyond the other dialects: a system turn of its own, always written, with
the default system prompt holding the date (``date`` when given, else the
engine's clock); a system message written only first; tools declared before
the last user message (and each user message equal to it), each tool's
function key by key with its string values unescaped; call ids and tool
results' ids cut to their last nine characters (fewer: a raise); the content
beside calls left out; a list's first part, or a tool result's list as
Python's ``str()``, which only jinja2 writes itself: the other engines get
the template's own spelling, for printable ASCII, and a raise beyond it."""

from __future__ import annotations

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
from tests.helpers.layout_export import (
    HOSTILE_TEXT,
    INJECT_SQ,
    SETTLED,
    braced,
    hf_export,
    hf_renders,
    load_dialect,
    outcomes,
)
from xtml.exports.jinja import jinja_template

pytestmark = pytest.mark.engines

FILE = Path(xtml.__file__).resolve().parent / "dialects" / "mistral-small-3.1.toml"
"""The dialect file (loaded by path here only)."""

N = 90
LIMITS = ("this engine's Jinja cannot write Python's str()", "this engine counts an id's characters",
          "this engine's tojson writes the number ")
"""The template's own raises where an engine cannot write what xtml writes."""


def load(path: Path = FILE) -> xtml.Template:
    return load_dialect(path)


@pytest.fixture(scope="module")
def tpl() -> xtml.Template:
    return load()


def corpus() -> list[dict[str, Any]]:
    """The family's generated requests; every third without ``date`` (the
    default system prompt then holds the day the engine's clock gives)."""
    out = []
    for k, c in enumerate(family_requests("mistral-small-3.1", N)):
        options = {o: v for o, v in c["options"].items() if not (o == "date" and k % 3 == 0)}
        out.append({**c["request"], **options})
    return out


def features(request: dict[str, Any], text: str) -> set[str]:
    """What a request rendered by xtml exercised."""
    msgs = request["messages"]
    out = set()
    if "[AVAILABLE_TOOLS]" in text:
        out.add("tools declared")
    if text.count("[AVAILABLE_TOOLS]") > 1:
        out.add("tools before an equal user message too")
    if "[TOOL_CALLS]" in text:
        out.add("calls")
    if any(len(c.get("id") or "") > 9 for m in msgs for c in m.get("tool_calls") or []):
        out.add("call ids cut")
    if any(m.get("tool_calls") and m.get("content") not in (None, "", []) for m in msgs):
        out.add("content beside calls left out")
    if any(m.get("role") == "tool" and isinstance(m.get("content"), list) for m in msgs):
        out.add("a result's list as str()")
    if "The current date is" in text:
        out.add("default system prompt, date given" if "date" in request else "default system prompt, the clock")
    if msgs[0].get("role") == "system":
        out.add("system message")
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_the_template_renders_what_xtml_renders(engine: str, tpl: xtml.Template) -> None:
    """The family's generated requests (tools, parallel calls with long and
    short ids, results in a row, lists, the default system prompt with a
    date given and from the clock, marker spellings): xtml's text from what
    the engine handed over, or both refuse, or the template raises where
    the engine cannot write what xtml writes (counted)."""
    need_engine(engine)
    requests = corpus()
    got = outcomes(engine, tpl, requests, limits=LIMITS)
    counts = got["counts"]
    for request in requests:
        want, _ = xtml_render(tpl, request)
        if want is not None:
            counts.update(features(request, want))
    print(f"mistral-small-3.1 {engine}: {dict(counts)}")
    assert not got["bad"], f"{len(got['bad'])} differ ({dict(counts)}); the first:\n{got['bad'][0]}"
    assert sum(counts[k] for k in SETTLED) == N, dict(counts)
    assert counts["equal"] >= N * 2 // 3, dict(counts)
    assert counts["both refuse"] >= 5, dict(counts)
    for feature in ("tools declared", "calls", "call ids cut", "default system prompt, date given",
                    "default system prompt, the clock", "system message"):
        assert counts[feature] >= 3, (feature, dict(counts))


# -- the keys one by one ------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {
    "name": "f", "description": "say \"hi\" \\ back\nslash 'q' {{ x }} {% y %}", "strict": True,
    "parameters": {"type": "object", "properties": {"a": {"type": "number", "default": 0.5, "minimum": 1e-05},
                                                    "s": {"type": "string", "enum": ["x\"y", "é"]}}},
    "return": {"type": "string"}}},
    {"type": "function", "function": {"name": "g", "description": "", "parameters": {}}}]
USER = {"role": "user", "content": "q"}


def call(cid: str | None, args: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "function": {"name": "f", "arguments": args or {"a": 1}}}
    if cid is not None:
        out["id"] = cid
    return out


def result(cid: str | None, content: Any = "r") -> dict[str, Any]:
    out: dict[str, Any] = {"role": "tool", "content": content}
    if cid is not None:
        out["tool_call_id"] = cid
    return out


def key_requests() -> list[tuple[str, dict[str, Any]]]:
    """(what it holds, a request) for each key the format adds, each way it
    renders or raises."""
    turn = [USER, {"role": "assistant", "content": "beside", "tool_calls": [
        call("call_abcdefghijk", {"s": "x\"\\\n", "n": 0.1}), call("123456789", '{"a": 1}')]},
        result("call_abcdefghijk"), result("123456789")]
    ascii_list = [{"type": "text", "text": "it's \"q\" \\ \n\t"}, {"type": "text", "text": "b", "n": [1, 2.5, True,
                                                                                                None, {"k": "v"}]}]
    out: list[tuple[str, dict[str, Any]]] = [
        ("tools with quotes, backslashes, newlines and floats", {"messages": [USER], "tools": TOOLS}),
        ("tools before each user message equal to the last", {"messages": [
            USER, {"role": "assistant", "content": "a"}, {"role": "user", "content": "other"},
            {"role": "assistant", "content": "b"}, USER], "tools": TOOLS[1:]}),
        ("tools and no user message", {"messages": [{"role": "system", "content": "S"}], "tools": TOOLS}),
        ("an empty tool list", {"messages": [USER], "tools": []}),
        ("calls with long and exact ids, content beside them", {"messages": turn, "tools": TOOLS}),
        ("a system message and a date", {"messages": [{"role": "system", "content": "S"}, *turn],
                                         "date": "2020-02-29"}),
        ("the default system prompt from the clock", {"messages": [USER, {"role": "assistant", "content": "a"}]}),
        ("a system message's first part, an answer's first part", {"messages": [
            {"role": "system", "content": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}]}, USER,
            {"role": "assistant", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}]}),
        ("a result's list of printable ASCII as str()", {"messages": [*turn[:2], result("call_abcdefghijk",
                                                                                       ascii_list)]}),
        ("a result's list of other characters as str()", {"messages": [*turn[:2], result(
            "123456789", [{"type": "text", "text": "é\u200b\x85"}])]}),
        ("a result's empty list", {"messages": [*turn[:2], result("123456789", [])]}),
        ("a non-ASCII id", {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
            call("id_日本語日本語日本")]}]}),
        # Refused by xtml and the template alike.
        ("a later system message", {"messages": [USER, {"role": "system", "content": "s"}]}),
        ("a short call id", {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
            call("call_1")]}]}),
        ("a call without an id", {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
            call("abcdefghi"), call(None)]}]}),
        ("a result without an id", {"messages": [USER, result(None)]}),
        ("a result's short id", {"messages": [USER, result("")]}),
        ("an empty list of calls", {"messages": [USER, {"role": "assistant", "content": "x", "tool_calls": []}]}),
        ("a system list without a text part first", {"messages": [
            {"role": "system", "content": [{"type": "image"}]}, USER]}),
        ("an answer without content", {"messages": [USER, {"role": "assistant", "content": None}]}),
        ("a date that is no string", {"messages": [USER], "date": 20240229}),
        ("a tool that is no function", {"messages": [USER], "tools": [{"name": "f"}]}),
        ("tools that are no list", {"messages": [USER], "tools": "f"}),
    ]
    return out


# How many requests of :func:`key_requests` each engine cannot write as xtml
# does (the template raises): Python's str() of other than printable ASCII,
# and an id of other than printable ASCII.
ENGINE_LIMITS = {"transformers": 0, "hfjs": 2, "llamacpp": 2}


@pytest.mark.parametrize("engine", ENGINES)
def test_each_key_renders_as_xtml_or_raises_alike(engine: str, tpl: xtml.Template) -> None:
    """Each key the format adds, each way it renders or raises: xtml's text;
    xtml's message where xtml refuses; the template's own raise where the
    engine cannot write what xtml writes (Python's str() of other than
    printable ASCII, an id's characters counted as bytes or UTF-16 units),
    never other text."""
    need_engine(engine)
    requests = [r for _, r in key_requests()]
    got = outcomes(engine, tpl, requests, limits=LIMITS)
    counts = got["counts"]
    print(f"mistral-small-3.1 keys {engine}: {dict(counts)}")
    assert not got["bad"], f"{len(got['bad'])} differ ({dict(counts)}); the first:\n{got['bad'][0]}"
    assert counts["the engine cannot write it: the template raises"] == ENGINE_LIMITS[engine], dict(counts)
    settled = ("equal", "both refuse", "the engine refuses the request",
               "the engine cannot write it: the template raises")
    assert sum(counts[k] for k in settled) == len(requests), dict(counts)
    assert counts["equal"] >= 10 and counts["both refuse"] >= 5, dict(counts)


def test_the_clock_and_an_engine_without_one(tpl: xtml.Template) -> None:
    """Without ``date``, the default system prompt holds the day the
    engine's ``strftime_now`` gives (transformers' here); an engine that
    has none raises, and renders when ``date`` is given."""
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


def test_what_the_writer_cannot_write_is_refused(tpl: xtml.Template) -> None:
    """A clock read with a directive the engines spell otherwise, a system
    turn beside tools in a system turn, ids cut that the format generates,
    content left out beside calls it does not write: refused at the file,
    never written half-right. The readers' gate does not stop the export."""
    import dataclasses

    from xtml.chat.layout import DROP, SYSTEM
    from xtml.chat.layout_turn import TextOption

    d: Any = tpl.dialect
    gated = dataclasses.replace(d, render_only=("a system turn of its own", "call ids cut to their last characters"))
    assert jinja_template(gated) == jinja_template(d)
    for bad, says in (
            (dataclasses.replace(d, text_options={"date": TextOption("date", "string", None, clock="%A %d")}),
             "not %A"),
            (dataclasses.replace(d, tools=SYSTEM), "a system turn of the format's own without tools"),
            (dataclasses.replace(d, call_ids="generated"), "cuts ids the request gives only"),
            (dataclasses.replace(d, calls="drop", calls_content=DROP), "beside calls it writes each only")):
        with pytest.raises(xtml.TemplateError, match=says) as info:
            jinja_template(bad)
        assert str(info.value).endswith(f"(at {FILE})"), info.value


def _hostile_file() -> str:
    """The dialect file with Jinja's delimiters, quotes and backslashes in the
    text it adds: the system turn, the tool block, each tool, each key."""
    text = FILE.read_text(encoding="utf-8")
    swaps = {'turn = """[SYSTEM_PROMPT]': 'turn = """[SYSTEM_PROMPT]' + braced(HOSTILE_TEXT).replace("\\", "\\\\"),
             'block = "[AVAILABLE_TOOLS] [': "block = " + toml("[AVAILABLE_TOOLS] " + braced(INJECT_SQ) + "[")[:-1],
             'pair = "{!first}, {/}': 'pair = "{!first}, {/}' + toml(braced(HOSTILE_TEXT))[1:-1]}
    for old, new in swaps.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize("engine", ENGINES)
def test_hostile_text_in_what_the_format_adds_stays_text(engine: str, tmp_path: Path) -> None:
    """Each engine renders xtml's text from the exported template of a file
    whose system turn, tool block and key pattern hold Jinja's delimiters,
    quotes and backslashes."""
    need_engine(engine)
    path = tmp_path / "hostile.toml"
    path.write_text(_hostile_file(), encoding="utf-8")
    hostile = load(path)
    requests: list[dict[str, Any]] = [
        {"messages": [USER], "tools": TOOLS[1:], "date": "2024-01-01"},
        {"messages": [{"role": "system", "content": "S"}, USER, {"role": "assistant", "content": "", "tool_calls": [
            call("call_abcdefghijk")]}, result("call_abcdefghijk")], "date": "2024-01-01", "tools": TOOLS[1:]}]
    text = "".join(hostile.render(r).text for r in requests)
    for spelt in ("[SYSTEM_PROMPT]" + HOSTILE_TEXT, "[AVAILABLE_TOOLS] " + INJECT_SQ + "[", HOSTILE_TEXT + '"name"'):
        assert spelt in text, spelt
    got = outcomes(engine, hostile, requests, route=True)
    assert not got["bad"], got["bad"][0]
    assert got["counts"]["equal"] == len(requests), dict(got["counts"])


def test_export_jinja_and_the_hf_folder(tpl: xtml.Template, tmp_path: Path) -> None:
    """``xtml export jinja`` prints the template; the folder of ``xtml
    export hf``, loaded by transformers alone, renders xtml's text."""
    config, hf = hf_export(tpl, str(FILE), tmp_path / "mistral")
    assert config["eos_token"] == "</s>"
    texts = hf_renders(tpl, hf, corpus())
    assert texts >= N // 2, texts
