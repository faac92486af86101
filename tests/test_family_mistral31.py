"""Mistral Small 3.1's format as a layout dialect file, against Mistral
Small 3.1's own chat template
(``models/templates/mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja`` of
ggml-org/llama.cpp at 9190da2, which the sdist does not carry): its renders
and raises, by transformers with the clock pinned to each case's ``date``,
are committed with their requests (tests/data/families/mistral-small-3.1.jsonl).
Byte-equal text on each render, a refusal at the template's message and
field on each raise, and every field it leaves out reported.

The file (xtml/dialects/mistral-small-3.1.toml) uses what the layout
language says for it: a system turn of its own with a text option read from
the clock, tools declared before the last user message key by key, call ids
cut to their last nine characters, the content beside calls left out, a
list's first part or its Python ``str()``. What reads it back is held by
tests/test_parse_mistral31.py."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.family_cases import (
    dialect_fixtures,
    names_its_reference,
    refused_edit,
    texts_match,
    validates,
)
from tests.helpers.kimi_families import REASONING_KEYS, Case
from xtml.errors import MessageError

NAME = "mistral-small-3.1"
FILE = Path(xtml.__file__).resolve().parent / "dialects" / "mistral-small-3.1.toml"
TAIL = 9

_DEFAULT = ("You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI, a French startup "
            "headquartered in Paris.Your knowledge base was last updated on 2023-10-01. The current date is {}.When")
_PARALLEL = (
    "You are a helpful assistant that can call tools. If you call one or more tools, format them in a "
    "single JSON array or objects, where each object is a tool call, not as separate objects outside of "
    "an array or multiple arrays. Use the format [{\"name\": tool call name, \"arguments\": tool call "
    "arguments}, additional tool calls] if you call more than one tool. If you call tools, do not attempt"
    " to interpret them or otherwise provide a response until you receive a tool call result that you can"
    " interpret for the user.")


tpl, cases = dialect_fixtures(NAME, FILE)

def mistral_drops(req: dict[str, Any], opts: dict[str, Any]) -> set[tuple[int, str]]:
    """What Mistral Small 3.1's template leaves out of a request it renders:
    names, ids beyond their last nine characters, the content beside calls,
    the parts after the first where it reads the first, the tools when no
    user message holds them, and the generation prompt."""
    msgs = req["messages"]
    out: set[tuple[int, str]] = set()
    if req.get("add_generation_prompt"):
        out.add((-1, "add_generation_prompt"))
    if req.get("tools") and not any(m["role"] == "user" for m in msgs):
        out.add((-1, "tools"))
    for i, m in enumerate(msgs):
        for k, v in m.items():
            if v in (None, "", [], {}) or k in ("role", "content"):
                continue
            if k == "name" or k in REASONING_KEYS or (k == "tool_call_id" and m["role"] != "tool"):
                out.add((i, k))
        calls = m.get("tool_calls")
        if m["role"] == "tool" and len(m.get("tool_call_id") or "") > TAIL:
            out.add((i, "tool_call_id"))
        if calls:
            if any(len(c["id"]) > TAIL for c in calls):
                out.add((i, "tool_calls.id"))
            if m.get("content") not in (None, "", []):
                out.add((i, "content"))
        elif isinstance(m.get("content"), list) and (m["role"] == "assistant" or (i == 0 and m["role"] == "system")):
            out.update((i, f"content[{j}]") for j in range(1, len(m["content"])))
    return out


def mistral_refusal(req: dict[str, Any]) -> tuple[int, str]:
    """Where the template raises, message by message: a system message after
    the first, a call id or a result's tool_call_id shorter than nine
    characters or absent, an answer without content and calls."""
    for i, m in enumerate(req["messages"]):
        if m["role"] == "system" and i > 0:
            return i, "role"
        if m["role"] == "assistant" and m.get("tool_calls") is not None:
            for j, c in enumerate(m["tool_calls"]):
                if len(c.get("id") or "") < TAIL:
                    return i, f"tool_calls[{j}].id"
        elif m["role"] == "assistant" and m.get("content") is None:
            return i, "content"
        if m["role"] == "tool" and len(m.get("tool_call_id") or "") < TAIL:
            return i, "tool_call_id"
    raise AssertionError("the template renders this request")


test_the_file_names_its_reference = names_its_reference(NAME)


def test_text_against_the_official_template(tpl: xtml.Template, cases: list[Case]) -> None:
    counts = texts_match(tpl, cases, mistral_drops)
    assert counts["refused"] == sum(raises is not None for _, _, raises in cases)
    assert min(counts[k] for k in ("tools", "parallel", "results_in_a_row", "parts", "marker_text", "ends_assistant",
                                   "no_prompt", "dropped")) >= 10, counts


def test_each_refusal_is_where_the_template_raises(tpl: xtml.Template, cases: list[Case]) -> None:
    """The message and field of the template's raise, case by case, and
    every kind of raise the generated requests reach."""
    kinds: dict[str, int] = {}
    for case, _, raises in cases:
        if raises is None:
            continue
        with pytest.raises(MessageError) as caught:
            tpl.render(case["request"], **case["options"])
        where = mistral_refusal(case["request"])
        assert (caught.value.index, caught.value.path) == where, (raises, case)
        kind = where[1].split(".")[-1]
        kinds[kind] = kinds.get(kind, 0) + 1
    assert set(kinds) == {"role", "id", "tool_call_id", "content"}, kinds


def test_spellings_the_template_has(tpl: xtml.Template) -> None:
    """The tools before each user message equal to the last, their string
    values unescaped; the content beside calls left out; ids cut; a result
    list as Python's str(); the parallel-tool prompt and the system text
    joined with nothing between."""
    tools = [{"type": "function", "function": {"name": "f", "description": "say \"hi\"", "parameters": {
        "type": "object", "properties": {}}, "return": {"type": "string"}}},
             {"type": "function", "function": {"name": "g", "strict": True}}]
    req = {"messages": [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "beside", "tool_calls": [
            {"id": "call_abcdefghi", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
            {"id": "123456789", "type": "function", "function": {"name": "g", "arguments": {"b": "é"}}}]},
        {"role": "tool", "content": [{"type": "text", "text": "it's"}], "tool_call_id": "call_abcdefghi"},
        {"role": "tool", "content": None, "tool_call_id": "123456789"},
        {"role": "assistant", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
        {"role": "user", "content": "q"}], "tools": tools}
    r = tpl.render(req)
    declared = ('[AVAILABLE_TOOLS] [{"type": "function", "function": {"name": "f", "description": "say "hi"", '
                '"parameters": {"type": "object", "properties": {}}}}, {"type": "function", "function": {"name": "g", '
                '"strict": true}}][/AVAILABLE_TOOLS]')
    assert r.text == (
        "<s>[SYSTEM_PROMPT]" + _PARALLEL + "S[/SYSTEM_PROMPT]" + declared + "[INST]q[/INST]"
        '[TOOL_CALLS] [{"name": "f", "arguments": "{\\"a\\": 1}", "id": "abcdefghi"}, '
        '{"name": "g", "arguments": {"b": "é"}, "id": "123456789"}]</s>'
        "[TOOL_RESULTS] {\"content\": [{'type': 'text', 'text': \"it's\"}], \"call_id\": \"abcdefghi\"}[/TOOL_RESULTS]"
        '[TOOL_RESULTS] {"content": , "call_id": "123456789"}[/TOOL_RESULTS]'
        "A</s>" + declared + "[INST]q[/INST]")
    assert {(d.message, d.field) for d in r.dropped} == {
        (2, "content"), (2, "tool_calls.id"), (3, "tool_call_id"), (5, "content[1]"), (-1, "add_generation_prompt"),
        (-1, "tools[0].function.return")}


def test_the_default_system_prompt_holds_the_date(tpl: xtml.Template) -> None:
    req = {"messages": [{"role": "user", "content": "q"}], "add_generation_prompt": False}
    assert tpl.render(req, date="2024-02-29").text.startswith("<s>[SYSTEM_PROMPT]" + _DEFAULT.format("2024-02-29"))
    assert tpl.render({**req, "chat_template_kwargs": {"date": "2019-12-31"}}).text.startswith(
        "<s>[SYSTEM_PROMPT]" + _DEFAULT.format("2019-12-31"))
    # Not given: the day of the render, as the template reads the clock.
    before = datetime.now().strftime("%Y-%m-%d")
    r = tpl.render(req)
    after = datetime.now().strftime("%Y-%m-%d")
    assert any(r.text.startswith("<s>[SYSTEM_PROMPT]" + _DEFAULT.format(day)) for day in (before, after))
    assert r.dropped == ()
    with pytest.raises(xtml.OptionError, match="date must be a string") as e:
        tpl.render(req, date=20240229)
    assert e.value.option == "date"


@pytest.mark.parametrize(("messages", "where", "match"), [
    ([{"role": "user", "content": "q"}, {"role": "system", "content": "s"}], (1, "role"), "only first"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None}], (1, "content"), "needs content"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     (1, "tool_calls[0].id"), "'call_1' has fewer"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "abcdefghi", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}], (1, "tool_calls[1].id"), "no id"),
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}], (1, "tool_call_id"), "no id"),
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "r", "tool_call_id": ""}], (1, "tool_call_id"),
     "'' has fewer"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "x", "tool_calls": []}], (1, "tool_calls"),
     "give at least one"),
    ([{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "q"}], (0, "content[0]"),
     "first part's text"),
    ([{"role": "developer", "content": "d"}], (0, "role"), "not one of this format's"),
    ([{"role": "system", "content": None}, {"role": "user", "content": "q"}], (0, "content"), "needs content"),
])
def test_refusals_are_located(tpl: xtml.Template, messages: list[Any], where: tuple[int, str], match: str) -> None:
    with pytest.raises(MessageError, match=match) as e:
        tpl.render({"messages": messages})
    assert (e.value.index, e.value.path) == where


def test_user_parts_images_and_tools_without_a_user_message(tpl: xtml.Template) -> None:
    """Text parts joined, an image as [IMG] (its data reported); tools with
    no user message are written nowhere but the tool prompt, and reported;
    an empty list still writes the tool prompt and an unclosed list, as the
    template does."""
    req = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url",
                                                                                   "image_url": {"url": "x"}},
                                                     {"type": "text", "text": "b"}]}],
           "add_generation_prompt": False, "date": "2025-01-01"}
    r = tpl.render(req)
    assert r.text.endswith("[/SYSTEM_PROMPT][INST]a[IMG]b[/INST]")
    assert {(d.message, d.field) for d in r.dropped} == {(0, "content[1]")}
    alone = {"messages": [{"role": "system", "content": "S"}], "tools": [{"type": "function", "function": {
        "name": "f"}}], "add_generation_prompt": False}
    r = tpl.render(alone)
    assert r.text == "<s>[SYSTEM_PROMPT]" + _PARALLEL + "S[/SYSTEM_PROMPT]"
    assert {(d.message, d.field) for d in r.dropped} == {(-1, "tools")}
    empty = tpl.render({"messages": [{"role": "user", "content": "q"}], "tools": [], "add_generation_prompt": False})
    assert empty.text.endswith("[/SYSTEM_PROMPT][AVAILABLE_TOOLS] [[/AVAILABLE_TOOLS][INST]q[/INST]")
    assert _PARALLEL in empty.text
    with pytest.raises(xtml.OptionError, match="each tool's function") as e:
        tpl.render({"messages": [{"role": "user", "content": "q"}], "tools": [{"name": "f"}]})
    assert e.value.option == "tools"


def test_validate_accepts_the_file() -> None:
    validates(FILE)


@pytest.mark.parametrize(("old", "new", "match"), [
    ('date = { type = "string", clock = "%Y-%m-%d" }', 'date = { type = "string" }', "a string option is"),
    ('date = { type = "string", clock = "%Y-%m-%d" }', 'date = { type = "string", clock = "day" }',
     "a string option is"),
    ("id_tail = 9", "id_tail = -1", "id_tail is an integer"),
    ('ids = "given"', 'ids = "generated"\nid = "x{name}"', "id_tail is an integer"),
    ('first_only = ["system"]', 'first_only = ["developer"]', "first_only lists accepted roles"),
    ('render = "last_user"', 'render = "drop"', "pair and skip are read with"),
    ("{date}", "{day}", "unknown slot {day}"),
    ('"{!first}, {/}\\"{key}', '"{!first}, {/}{?has_tools}{/}\\"{key}', "unknown condition 'has_tools'"),
])
def test_the_new_keys_are_checked_in_the_file(tmp_path: Path, old: str, new: str, match: str) -> None:
    refused_edit(FILE, tmp_path, old, new, match)



def test_a_text_option_nothing_writes_is_refused(tmp_path: Path) -> None:
    text = FILE.read_text(encoding="utf-8")
    start = text.index('turn = """')
    path = tmp_path / "bad.toml"
    path.write_text(text[:start] + text[text.index('"""', start + 10) + 3:], encoding="utf-8")
    with pytest.raises(xtml.TemplateError, match=r"read by a format with a \[turns\] section or a \[system\] turn") \
            as e:
        xtml.load(str(path))
    assert "options.date" in str(e.value)
