"""Gemma 4's format as a layout dialect file, against Gemma 4's own chat
template (``google-gemma-4-31B-it.jinja`` of llama.cpp's sdist, rendered by
transformers at test time): byte-equal text wherever the official template
renders, a located refusal wherever it raises or prints a Python repr, and
every field it leaves out reported.

The file (xtml/dialects/gemma-4.toml) uses what the layout language
says for it: a system turn written only when it has something to hold, tool
declarations and call arguments written by the ``gemma`` value syntax (an
``xtml.value_syntaxes`` entry point the core never names), tool results
folded into the calling model turn, a turn the next answer continues, text
trimmed part by part and reasoning spelled in content cut out. Every
reader reads it back (tests/test_parse_gemma4.py); what reads back otherwise
(a first developer message, declarations in the format's own spelling, an
answer continuing a turn left open) is reported here with the rest."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.family_cases import (
    dialect_fixtures,
    edited,
    names_its_reference,
    refused_edit,
    texts_match,
    validates,
)
from tests.helpers.kimi_families import REASONING_KEYS, Case
from xtml.errors import MessageError, RequestError

NAME = "gemma-4"
FILE = Path(xtml.__file__).resolve().parent / "dialects" / "gemma-4.toml"
# The keywords of a parameter's schema the declaration writes.
WRITTEN = ("description", "type", "enum", "items", "nullable", "properties", "required")
Q = '<|"|>'


tpl, cases = dialect_fixtures(NAME, FILE)

def _held(msgs: list[dict[str, Any]]) -> int:
    """How many messages the system turn holds (a first system or developer
    message)."""
    return int(bool(msgs) and msgs[0]["role"] in ("system", "developer"))


def _owner(msgs: list[dict[str, Any]], i: int) -> dict[str, Any] | None:
    """The message a tool result at ``i`` is written in: the nearest message
    before it that is not a tool result, when it has calls."""
    for j in range(i - 1, _held(msgs) - 1, -1):
        if msgs[j]["role"] != "tool":
            return msgs[j] if msgs[j]["role"] == "assistant" and msgs[j].get("tool_calls") else None
    return None


def _written_name(owner: dict[str, Any], result: dict[str, Any]) -> Any:
    """The name a result is written under: the last call whose id is its
    tool_call_id (an absent one equal to an absent one), else its own."""
    name = result.get("name")
    for c in owner["tool_calls"]:
        if c.get("id") == result.get("tool_call_id"):
            name = c["function"]["name"]
    return name


def gemma_drops(req: dict[str, Any], opts: dict[str, Any]) -> set[tuple[int, str]]:
    """What Gemma 4's template leaves out of a request it renders: names
    (but a result's written as its own), tool_call_id, call ids, reasoning
    but beside calls after the last user message, reasoning spelled in an
    answer's content, tool results not right after calls, the schema
    keywords its declarations skip, and the generation prompt after calls."""
    msgs = req["messages"]
    out: set[tuple[int, str]] = set()
    for t in req.get("tools") or ():
        if any(k not in WRITTEN for p in t["function"]["parameters"]["properties"].values() for k in p):
            out.add((-1, "tools"))
    last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=-1)
    last = next((m for m in reversed(msgs[_held(msgs):]) if m["role"] != "tool"), None)
    if req["add_generation_prompt"] and last is not None and last.get("tool_calls"):
        out.add((-1, "add_generation_prompt"))
    for i, m in enumerate(msgs):
        for k, v in m.items():
            if v in (None, "", [], {}) or k in ("role", "content", "tool_calls", *REASONING_KEYS):
                continue
            owner = _owner(msgs, i) if m["role"] == "tool" else None
            if not (k == "name" and owner is not None and _written_name(owner, m) == v):
                out.add((i, k))
        if any(c.get("id") for c in m.get("tool_calls") or ()):
            out.add((i, "tool_calls.id"))
        for k in REASONING_KEYS:
            if m.get(k) and not (m.get("tool_calls") and i > last_user):
                out.add((i, k))
        content = m.get("content")
        texts = [content] if isinstance(content, str) else [p["text"] for p in content or ()]
        if m["role"] == "assistant" and any("<|channel>" in x or "<channel|>" in x for x in texts):
            out.add((i, "content"))
        if m["role"] == "tool" and _owner(msgs, i) is None:
            out.add((i, "content"))
        if m["role"] == "assistant" and not m.get("tool_calls") and _continues_open(msgs, i):
            out.add((i, "content"))
        for c in m.get("tool_calls") or ():
            args = c["function"]["arguments"]
            if "{" in c["function"]["name"] or (isinstance(args, str) and ":" in args
                                                and not args.lstrip().startswith("{")):
                out.add((i, "tool_calls"))
    return out | _read_otherwise(req, opts)


def _continues_open(msgs: list[dict[str, Any]], i: int) -> bool:
    """Whether answer ``i`` follows results written in a turn left open (an
    answer with calls and no content): it reads back as that turn's content."""
    j = i - 1
    while j >= _held(msgs) and msgs[j]["role"] == "tool":
        j -= 1
    m = msgs[j] if j >= _held(msgs) else {}
    return j < i - 1 and m.get("role") == "assistant" and bool(m.get("tool_calls")) and not m.get("content")


def _read_otherwise(req: dict[str, Any], opts: dict[str, Any]) -> set[tuple[int, str]]:
    """What the parse reads back otherwise: a first developer message as the
    system message, an empty system text beside the format's own turn, and
    tools declared otherwise than given (types upper-case, parameters
    spelled as the declaration spells them)."""
    msgs = req["messages"]
    out: set[tuple[int, str]] = set()
    tools = req.get("tools") or []
    if _held(msgs):
        if not str(msgs[0].get("content") or "").strip() and (opts.get("enable_thinking") or tools):
            out.add((0, "content"))
        elif msgs[0]["role"] == "developer":
            out.add((0, "role"))
    if any(set(t["function"]) - {"name", "description"} or not isinstance(t["function"].get("description"), str)
           for t in tools):
        out.add((-1, "tools"))
    return out


def gemma_reprs(req: dict[str, Any]) -> list[int]:
    """Where the template prints a Python repr: a first system or developer
    message's list of parts, which it trims as a string."""
    msgs = req["messages"]
    return [0] if _held(msgs) and isinstance(msgs[0].get("content"), list) else []


def gemma_refusal(req: dict[str, Any]) -> tuple[int, str]:
    """Where the template raises: a tool result it writes whose name is
    None (no call of its message has its tool_call_id, and it has no name)."""
    msgs = req["messages"]
    for i, m in enumerate(msgs):
        owner = _owner(msgs, i) if m["role"] == "tool" else None
        if owner is not None and not isinstance(_written_name(owner, m), str):
            return i, "tool_call_id"
    raise AssertionError("the template renders this request")


test_the_file_names_its_reference = names_its_reference(NAME)


def test_text_against_the_official_template(tpl: xtml.Template, cases: list[Case]) -> None:
    counts = texts_match(tpl, cases, gemma_drops, gemma_reprs)
    assert counts["refused"] == sum(raises is not None for _, _, raises in cases)
    assert counts["refused_repr"] == sum(bool(gemma_reprs(c["request"])) for c, _, _ in cases) >= 5
    assert min(counts[k] for k in ("tools", "parallel", "results_in_a_row", "parts", "marker_text", "ends_assistant",
                                   "no_prompt", "dropped")) >= 10, counts


def test_each_refusal_is_where_the_template_raises(tpl: xtml.Template, cases: list[Case]) -> None:
    n = 0
    for case, _, raises in cases:
        if raises is None:
            continue
        with pytest.raises(MessageError, match="under the name of the call it answers") as caught:
            tpl.render(case["request"], **case["options"])
        assert (caught.value.index, caught.value.path) == gemma_refusal(case["request"]), (raises, case)
        n += 1
    assert n >= 5


def test_the_cases_reach_what_the_format_folds(cases: list[Case]) -> None:
    """The generated requests render (by the template) each spelling the
    file has: results folded after calls, in a run, before content; a turn
    left open and continued by the next answer's calls, or a closed one
    continued; reasoning beside calls; a thinking system turn, a developer
    turn; string arguments inside the braces; calls left waiting for
    results."""
    texts = [want for _, want, _ in cases if want is not None]
    for piece in ("<tool_call|><|tool_response>response:", "<tool_response|><|tool_response>",
                  "<tool_response|><|tool_call>", "<turn|>\n<|tool_call>", "<|turn>system\n<|think|>\n",
                  "<|turn>developer\n", "{{", "<|tool>declaration:"):
        assert sum(piece in t for t in texts) >= 3, piece
    assert sum(bool(re.search(r"<tool_response\|>[^<]", t)) for t in texts) >= 10
    assert sum(bool(re.search(r"<\|channel>thought\n[^<]", t)) for t in texts) >= 10
    assert any(t.endswith("<tool_call|><|tool_response>") for t in texts)


def test_spellings_the_template_has(tpl: xtml.Template) -> None:
    """A first developer message as the system text; tools declared after
    it in Gemma's syntax (a default left out); text trimmed part by part;
    reasoning beside calls; an object's arguments in the syntax, a string's
    as given inside the braces; results under the name of the call they
    answer (or their own), right after the calls; an answer with results
    and no content leaves the turn open and the next continues it; reasoning
    in content cut out; calls without results end opening them, and no
    generation prompt follows."""
    tools = [{"type": "function", "function": {"name": "f", "description": "F.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "default": 1}, "b": {"type": "string"}},
        "required": ["a"]}}}]
    req = {"messages": [
        {"role": "developer", "content": "  Be brief.  "},
        {"role": "user", "content": [{"type": "text", "text": " q1 "}, {"type": "text", "text": " q2"}]},
        {"role": "assistant", "content": "", "reasoning_content": "R", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"b": "x", "a": 2}}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": '{"a": 3}'}}]},
        {"role": "tool", "tool_call_id": "c2", "content": " r2 "},
        {"role": "tool", "name": "g", "content": [{"type": "text", "text": "r"}, {"type": "text", "text": "3"}]},
        {"role": "assistant", "content": "<|channel>thought\nhidden<channel|> done ", "reasoning_content": "gone"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": True}}}]}],
        "tools": tools}
    r = tpl.render(req, enable_thinking=True)
    assert r.text == (
        "<bos><|turn>system\n<|think|>\nBe brief.<|tool>declaration:f{description:" + Q + "F." + Q
        + ",parameters:{properties:{a:{type:" + Q + "INTEGER" + Q + "},b:{type:" + Q + "STRING" + Q + "}},required:["
        + Q + "a" + Q + "],type:" + Q + "OBJECT" + Q + "}}<tool|><turn|>\n"
        "<|turn>user\nq1q2<turn|>\n"
        "<|turn>model\n<|channel>thought\nR\n<channel|>"
        "<|tool_call>call:f{a:2,b:" + Q + "x" + Q + "}<tool_call|><|tool_call>call:f{{\"a\": 3}}<tool_call|>"
        "<|tool_response>response:f{value:" + Q + " r2 " + Q + "}<tool_response|>"
        "<|tool_response>response:g{value:" + Q + "r3" + Q + "}<tool_response|>"
        "done<turn|>\n"
        "<|tool_call>call:f{a:1,b:true}<tool_call|><|tool_response>")
    assert {(d.message, d.field) for d in r.dropped} == {
        (-1, "tools"), (2, "tool_calls.id"), (3, "tool_call_id"), (5, "reasoning_content"), (5, "content"),
        (6, "tool_calls.id"), (-1, "add_generation_prompt"), (0, "role")}
    # The quote, the declaration's and the calls' marks are tokens; text is text.
    tokens = [s.text for s in r.segments if s.special]
    assert tokens.count(Q) == 16 and tokens.count("<|tool_call>") == 3 and "<|tool>" in tokens
    assert not r.ambiguous


@pytest.mark.parametrize(("fields", "shown", "dropped"), [
    ({"reasoning": "A", "reasoning_content": "B"}, "A", {"reasoning_content"}),
    ({"thinking": "T", "reasoning_content": "B"}, "B", {"thinking"}),
    ({"thinking": "T", "reasoning": "A"}, "A", {"thinking"}),
    ({"reasoning": "", "reasoning_content": "B"}, "B", set()),
    ({"thinking": "T"}, "T", set()),
])
def test_one_reasoning_field_is_written(tpl: xtml.Template, fields: dict[str, str], shown: str,
                                        dropped: set[str]) -> None:
    """The template reads reasoning, then reasoning_content (where
    transformers copies thinking): the first holding text is written, any
    other holding text reported."""
    call = {"type": "function", "function": {"name": "f", "arguments": {}}}
    r = tpl.render({"messages": [{"role": "user", "content": "q"},
                                 {"role": "assistant", "content": "", "tool_calls": [call], **fields}]})
    assert r.text.endswith("<|turn>model\n<|channel>thought\n" + shown + "\n<channel|><|tool_call>call:f{}"
                           "<tool_call|><|tool_response>")
    assert {d.field for d in r.dropped if d.message == 1} == dropped


@pytest.mark.parametrize(("messages", "opts", "tail", "dropped"), [
    ([{"role": "user", "content": "q"}], {}, "<|turn>user\nq<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
     set()),
    ([{"role": "user", "content": "q"}], {"enable_thinking": True}, "<turn|>\n<|turn>model\n", set()),
    # A tool result after a user message is not written; the prompt is.
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "r", "name": "f"}], {"enable_thinking": True},
     "<|turn>user\nq<turn|>\n<|turn>model\n", {(1, "content"), (1, "name")}),
    # Results with content close the turn, and still no prompt follows.
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "so", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {}}}]}, {"role": "tool", "content": "r"}], {},
     "<|tool_call>call:f{}<tool_call|><|tool_response>response:f{value:" + Q + "r" + Q + "}<tool_response|>so"
     "<turn|>\n", {(-1, "add_generation_prompt")}),
])
def test_the_generation_prompt(tpl: xtml.Template, messages: list[Any], opts: dict[str, Any], tail: str,
                               dropped: set[tuple[int, str]]) -> None:
    r = tpl.render({"messages": messages}, **opts)
    assert r.text.endswith(tail) and r.text.startswith("<bos>")
    assert {(d.message, d.field) for d in r.dropped} == dropped


@pytest.mark.parametrize(("messages", "where", "match"), [
    ([{"role": "system", "content": [{"type": "text", "text": "s"}]}, {"role": "user", "content": "q"}],
     (0, "content"), "as a string"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": {}}}]},
      {"role": "tool", "content": None, "tool_call_id": "a"}], (2, "content"), "print None"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": {}}}]},
      {"role": "tool", "content": "r", "tool_call_id": "b"}], (2, "tool_call_id"), "no call before it"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], (0, "content[0]"),
     "only text parts"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"k": ["<turn|>"]}}}]}],
     (1, "tool_calls[0].function.arguments.k[0]"), "spells one of the gemma-4 format's tokens"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"k:": 1}}}]}],
     (1, "tool_calls[0].function.arguments[\"k:\"]"), "cannot be written bare"),
])
def test_refusals_are_located(tpl: xtml.Template, messages: list[Any], where: tuple[int, str], match: str) -> None:
    with pytest.raises(MessageError, match=match) as e:
        tpl.render({"messages": messages})
    assert (e.value.index, e.value.path) == where


def test_a_tool_that_spells_a_token_is_refused(tpl: xtml.Template) -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": "ends <tool|> early"}}]
    with pytest.raises(RequestError, match="spells one of") as e:
        tpl.render({"messages": [{"role": "user", "content": "q"}], "tools": tools})
    assert e.value.location == "tools[0].function.description"
    # Content that spells a token stays text, reported as ambiguous.
    r = tpl.render({"messages": [{"role": "user", "content": "a <turn|> b"}]})
    assert r.ambiguous and any("a <turn|> b" in s.text for s in r.segments if not s.special)


def test_validate_accepts_the_file() -> None:
    validates(FILE)


def test_every_reader_reads_it(tpl: xtml.Template) -> None:
    """Nothing it writes is left to no reader (tests/test_parse_gemma4.py
    reads it back)."""
    assert tpl.layout.render_only == ()  # type: ignore[attr-defined]


@pytest.mark.parametrize(("old", "new", "where", "match"), [
    ('syntax = "gemma"\nkeywords', 'syntax = "nope"\nkeywords', "tools.syntax", "value syntax 'nope' is not installed"),
    ('render = "syntax"', 'render = "drop"', "tools.syntax", "a value syntax is read with render"),
    ('arguments = "syntax"', 'arguments = "as_given"', "calls.syntax", "a value syntax is read with arguments"),
    ("leave_open = true", 'leave_open = "yes"', "calls.leave_open", "must be true or false"),
    ('continue = ["assistant"]', 'continue = ["bot"]', "roles.continue", "continue lists accepted roles"),
    ('roles = ["system", "developer"]', 'roles = ["developer"]', "system.roles", "system among them"),
    ('strip = ["<|channel>", "<channel|>"]', 'strip = ["<|channel>"]', "content.strip", "two non-empty strings"),
    ('show = "after_last_user"', 'show = "after_last_query"', "reasoning.show", "after_last_user"),
    ('keys = ["reasoning", "reasoning_content", "thinking"]', 'keys = ["reasoning", "thoughts"]', "reasoning.keys",
     "keys lists reasoning"),
    ("{results}", "", "system.turn", None),
    ("{system|trim}{tools}", "{system|trim}", "system.turn", "go together"),
    ('{!after_calls}', '{!after_tools}', "prompt.body", "unknown condition 'after_tools'"),
])
def test_the_new_keys_are_checked_in_the_file(tmp_path: Path, old: str, new: str, where: str,
                                              match: str | None) -> None:
    if match is None:
        # The body need not write results: the file stays valid.
        xtml.load(str(edited(FILE, tmp_path, old, new)))
        return
    assert where in str(refused_edit(FILE, tmp_path, old, new, match))


def test_the_fold_keys_need_results_folded() -> None:
    from xtml.chat.layout_file import check_any_text

    text = FILE.read_text(encoding="utf-8")
    start = text.index("result = ")
    d, problems = check_any_text(text[:start] + text[text.index("\n", start) + 1:], "bad.toml")
    assert d is None
    folded = {p.key for p in problems if "tool results are folded" in p.message}
    assert folded == {"calls.pending", "calls.leave_open", "roles.continue", "content.trim", "content.strip",
                      "roles.body.assistant", "reasoning.keys", "prompt.body", "calls.each"}, problems
