"""gpt-oss's format (harmony) as a layout dialect file, against gpt-oss's own
chat template (``openai-gpt-oss-120b.jinja`` of llama.cpp's sdist, rendered
by transformers at test time with the clock pinned to each case's
``date``): byte-equal text wherever the template renders, a located refusal
wherever it raises, and every field it leaves out reported.

The file (xtml/dialects/gpt-oss.toml) uses what the layout language
says for a format that writes one message as several: an answer as its
reasoning on the analysis channel, then its first call or its final text
(closed by ``<|return|>`` where it ends the render), the content beside a
call as its reasoning, tool results named by the call they answer, a later
system message left out, list options as conditions, texts refused in an
answer, and the tools declared by the ``typescript`` value syntax. The
readers of a format that writes a message as several read those back
(tests/test_parse_gptoss.py); the exports refuse it."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.family_cases import (
    dialect_fixtures,
    names_its_reference,
    reference_template,
    refused_edit,
    texts_match,
    validates,
)
from tests.helpers.family_requests import hf_render
from tests.helpers.kimi_families import REASONING_KEYS, Case
from xtml.errors import MessageError
from xtml.plugins.values import load_value_syntax

NAME = "gpt-oss"
FILE = Path(xtml.__file__).resolve().parent / "dialects" / "gpt-oss.toml"
TAGS = ("<|channel|>analysis<|message|>", "<|channel|>final<|message|>")
_SYSTEM = ("<|start|>system<|message|>{identity}\nKnowledge cutoff: 2024-06\nCurrent date: {day}\n\nReasoning: {effort}"
           "\n\n{tools}# Valid channels: analysis, commentary, final. Channel must be included for every message.")


tpl, cases = dialect_fixtures(NAME, FILE)


@pytest.fixture(scope="module")
def template() -> str:
    return reference_template(NAME)

def reasoning_of(m: dict[str, Any]) -> tuple[str, Any]:
    """The reasoning key a message gives and its value (the generator gives
    one at most)."""
    return next(((k, m[k]) for k in REASONING_KEYS if m.get(k) is not None), ("", None))


def gptoss_drops(req: dict[str, Any], opts: dict[str, Any]) -> set[tuple[int, str]]:
    """What gpt-oss's template leaves out of a request it renders: names,
    tool_call_id, call ids and every call but a message's first, a later
    system message, the reasoning of an answer that does not end the render,
    and the content (or reasoning) beside a call that a later answer
    follows; tools the namespace spells as other tools (it reads back
    otherwise)."""
    msgs = req["messages"]
    n = len(msgs)
    out: set[tuple[int, str]] = set()
    tools = req.get("tools")
    if tools:
        namespace = load_value_syntax("typescript")
        if namespace.declared(namespace.declare(tools)) != tools:
            out.add((-1, "tools"))
    for i, m in enumerate(msgs):
        for k in ("name", "tool_call_id"):
            if m.get(k) not in (None, ""):
                out.add((i, k))
        if i > 0 and m["role"] in ("system", "developer") and m.get("content") not in (None, "", []):
            out.add((i, "content"))
        if m["role"] != "assistant":
            continue
        key, thinking = reasoning_of(m)
        calls = m.get("tool_calls")
        if calls:
            if any(c.get("id") for c in calls):
                out.add((i, "tool_calls.id"))
            out.update((i, f"tool_calls[{j}]") for j in range(1, len(calls)))
            if any(later["role"] == "assistant" and "tool_calls" not in later for later in msgs[i + 1:]):
                if m.get("content"):
                    out.add((i, "content"))
                elif thinking:
                    out.add((i, key))
        elif thinking and not (i == n - 1 and not req["add_generation_prompt"]):
            out.add((i, key))
    return out


def gptoss_refusal(req: dict[str, Any]) -> tuple[int, str, str]:
    """Where the template raises, message by message in its order, and what
    it raises: channel tags in an answer's content or reasoning, content and
    reasoning both beside a call, a message without content or with parts
    where it adds content to text."""
    for i, m in enumerate(req["messages"]):
        role, content = m["role"], m.get("content")
        if role in ("system", "developer"):
            continue  # the first is the developer message, a later one is left out
        key, thinking = reasoning_of(m)
        if role == "assistant":
            if isinstance(content, str) and any(t in content for t in TAGS):
                return i, "content", "tags"
            if isinstance(thinking, str) and any(t in thinking for t in TAGS):
                return i, key, "tags"
            if m.get("tool_calls"):
                if content and thinking:
                    return i, key, "both"
                continue
        if content is None:
            return i, "content", "none"
        if isinstance(content, list) and role != "tool":
            return i, "content", "parts"
    raise AssertionError("the template renders this request")


_RAISES = {"tags": "tags in the content field", "both": "Cannot pass both content and thinking",
           "none": "no attribute 'content'", "parts": "can only concatenate str (not \"list\")"}
_REFUSALS = {"tags": "refuses '<|channel|>", "both": "not both", "none": "needs content",
             "parts": "a list of parts is not read"}


test_the_file_names_its_reference = names_its_reference(NAME)


def test_text_against_the_official_template(tpl: xtml.Template, cases: list[Case]) -> None:
    counts = texts_match(tpl, cases, gptoss_drops)
    assert counts["refused"] == sum(raises is not None for _, _, raises in cases)
    assert min(counts[k] for k in ("tools", "parallel", "results_in_a_row", "marker_text", "ends_assistant",
                                   "no_prompt", "dropped")) >= 10, counts
    shown = [want for _, want, _ in cases if want is not None]
    # Reasoning kept before calls and on the answer that ends the render;
    # calls; <|return|>; each option of the template.
    for what in ("<|channel|>analysis<|message|>", "<|call|>", "<|return|>", "<|start|>developer", "namespace "
                 "functions", "## browser", "## python", "to=assistant<|channel|>commentary"):
        assert sum(what in t for t in shown) >= 5, what


def test_each_refusal_is_where_the_template_raises(tpl: xtml.Template, cases: list[Case]) -> None:
    """The message and field of the template's raise, case by case, and
    what it raises, for every kind of raise the generated requests reach."""
    kinds: dict[str, int] = {}
    for case, _, raises in cases:
        if raises is None:
            continue
        with pytest.raises(MessageError) as caught:
            tpl.render(case["request"], **case["options"])
        index, path, kind = gptoss_refusal(case["request"])
        assert (caught.value.index, caught.value.path) == (index, path), (raises, case)
        assert _RAISES[kind] in raises and _REFUSALS[kind] in str(caught.value), (raises, str(caught.value))
        kinds[kind] = kinds.get(kind, 0) + 1
    assert set(kinds) == set(_RAISES), kinds


def test_spellings_the_template_has(tpl: xtml.Template, template: str) -> None:
    """A developer message read as the system message and a later one left
    out; a call's content as its reasoning, left out where a later answer
    follows it (kept where none does: the generated cases); its second call
    left out; a result named by the first call,
    its content as JSON (a list too); string arguments quoted again; the
    answer that ends the render closed by <|return|> with its reasoning,
    even empty."""
    tools = [{"type": "function", "function": {"name": "f", "description": "F.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "default": 3}}, "required": []}}}]
    req: dict[str, Any] = {"messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "first I look", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {}}}]},
        {"role": "tool", "content": [{"type": "text", "text": "it's"}], "tool_call_id": "c1"},
        {"role": "tool", "content": "two", "name": "g"},
        {"role": "system", "content": "later"},
        {"role": "assistant", "thinking": "", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": {"a": "é"}}}]},
        {"role": "tool", "content": "3"},
        {"role": "assistant", "content": "done", "reasoning": ""}], "tools": tools,
        "add_generation_prompt": False}
    r = tpl.render(req, date="2024-02-29", reasoning_effort="high")
    system = _SYSTEM.format(identity="You are ChatGPT, a large language model trained by OpenAI.", day="2024-02-29",
                            effort="high", tools="")
    assert r.text == (
        system + "\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace functions "
        "{\n\n// F.\ntype f = (_: {\na?: number, // default: 3,\n}) => any;\n\n} // namespace functions<|end|>"
        "<|start|>user<|message|>q<|end|>"
        '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>"{\\"a\\": 1}"<|call|>'
        '<|start|>functions.f to=assistant<|channel|>commentary<|message|>[{"type": "text", "text": "it\'s"}]<|end|>'
        '<|start|>functions.f to=assistant<|channel|>commentary<|message|>"two"<|end|>'
        '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"a": "é"}<|call|>'
        '<|start|>functions.f to=assistant<|channel|>commentary<|message|>"3"<|end|>'
        "<|start|>assistant<|channel|>analysis<|message|><|end|>"
        "<|start|>assistant<|channel|>final<|message|>done<|return|>")
    # (integer is written number, an empty required list not at all: the
    # tools read back otherwise.)
    assert {(d.message, d.field) for d in r.dropped} == {
        (-1, "tools"), (2, "content"), (2, "tool_calls.id"), (2, "tool_calls[1]"), (3, "tool_call_id"), (4, "name"),
        (5, "content")}
    case = {"request": req, "options": {"date": "2024-02-29", "reasoning_effort": "high"}}
    assert r.text == hf_render(NAME, template, case)
    # With a generation prompt the last answer is history: its reasoning
    # and the content beside the first call (a later answer follows) go.
    req["messages"][-1]["reasoning"] = "R"
    r = tpl.render({**req, "add_generation_prompt": True}, date="2024-02-29")
    assert "first I look" not in r.text and "<|channel|>analysis" not in r.text
    assert r.text.endswith("<|start|>assistant<|channel|>final<|message|>done<|end|><|start|>assistant")
    assert {(8, "reasoning"), (2, "content")} <= {(d.message, d.field) for d in r.dropped}


@pytest.mark.parametrize(("options", "system"), [
    ({"model_identity": "", "builtin_tools": []}, "<|start|>system<|message|>\nKnowledge cutoff"),
    ({"model_identity": "I am.", "builtin_tools": ["python"]}, "I am.\nKnowledge"),
    ({"builtin_tools": ["browser"]}, "# Tools\n\n## browser\n\n// Tool for browsing.\n"),
    ({"builtin_tools": ["python", "browser"]}, "} // namespace browser\n\n## python\n\n"),
])
def test_the_system_message_against_the_official_template(tpl: xtml.Template, template: str,
                                                           options: dict[str, Any], system: str) -> None:
    for messages in ([{"role": "user", "content": "q"}], [{"role": "system", "content": ""},
                                                          {"role": "user", "content": "q"}],
                     [{"role": "system", "content": [{"type": "text", "text": "parts"}]}]):
        case = {"request": {"messages": messages, "add_generation_prompt": True}, "options": {**options,
                                                                                             "date": "2025-01-01"}}
        r = tpl.render(case["request"], **case["options"])
        assert r.text == hf_render(NAME, template, case) and system in r.text
        assert r.dropped == ()


def test_the_date_and_the_options(tpl: xtml.Template) -> None:
    req = {"messages": [{"role": "user", "content": "q"}], "add_generation_prompt": False}
    assert "\nCurrent date: 2019-12-31\n" in tpl.render({**req, "chat_template_kwargs": {"date": "2019-12-31"}}).text
    # Not given: the day of the render, as the template reads the clock.
    before = datetime.now().strftime("%Y-%m-%d")
    text = tpl.render(req).text
    after = datetime.now().strftime("%Y-%m-%d")
    assert any(f"\nCurrent date: {day}\n" in text for day in (before, after))
    r = tpl.render(req, builtin_tools=["browser", "shell"])
    assert "## browser" in r.text and "shell" not in r.text
    assert [(d.message, d.field) for d in r.dropped] == [(-1, "builtin_tools")] and "'shell'" in r.dropped[0].why
    for option, value, match in (("builtin_tools", "browser", "a list of names"), ("date", 20240229, "a string"),
                                 ("model_identity", None, None)):
        if match is None:
            assert "You are ChatGPT" in tpl.render(req, **{option: value}).text
            continue
        with pytest.raises(xtml.OptionError, match=match) as e:
            tpl.render(req, **{option: value})
        assert e.value.option == option


@pytest.mark.parametrize(("messages", "where", "match"), [
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a<|channel|>final<|message|>b"}],
     (1, "content"), "refuses"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None,
                                         "reasoning_content": "<|channel|>analysis<|message|>"}],
     (1, "reasoning_content"), "refuses"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "c", "thinking": "t", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}], (1, "thinking"), "not both"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None}], (1, "content"),
     "content on a message without calls"),
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}], (1, "role"), "no assistant message with"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "assistant", "content": "a"},
      {"role": "tool", "content": "r"}], (3, "role"), "since the last answer"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "content": None}],
     (2, "content"), "needs content"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "x", "tool_calls": []}], (1, "tool_calls"),
     "give at least one"),
    ([{"role": "user", "content": [{"type": "text", "text": "q"}]}], (0, "content"), "list of parts"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "thinking": "x",
                                         "reasoning_content": "y"}], (1, "thinking"), "under one name"),
    # The first of two raises, in the template's order: the tags come before
    # a later message's missing content.
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "<|channel|>final<|message|>"},
      {"role": "user", "content": None}], (1, "content"), "refuses"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "text", "text": "a"}],
                                         "thinking": "<|channel|>final<|message|>"}], (1, "thinking"), "refuses"),
])
def test_refusals_are_located(tpl: xtml.Template, template: str, messages: list[Any], where: tuple[int, str],
                              match: str) -> None:
    with pytest.raises(MessageError, match=match) as e:
        tpl.render({"messages": messages})
    assert (e.value.index, e.value.path) == where
    if "under one name" not in match and "at least one" not in match:
        # The template raises there too (transformers reads one reasoning
        # name; an empty call list is refused before the template reads it).
        with pytest.raises(Exception):  # noqa: B017 - any raise of the template
            hf_render(NAME, template, {"request": {"messages": messages, "add_generation_prompt": True},
                                       "options": {"date": "2025-01-01"}})


def test_a_tool_that_the_syntax_refuses_is_located(tpl: xtml.Template) -> None:
    with pytest.raises(xtml.RequestError) as e:
        tpl.render({"messages": [{"role": "user", "content": "q"}], "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {}}}]})
    assert (e.value.location or "").startswith("tools[0]")


def test_what_the_namespace_does_not_write_is_reported(tpl: xtml.Template, template: str) -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": "", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}}}]
    case: dict[str, Any] = {"request": {"messages": [{"role": "user", "content": "q"}], "tools": tools,
                                        "add_generation_prompt": True}, "options": {"date": "2025-01-01"}}
    r = tpl.render(case["request"], **case["options"])
    assert r.text == hf_render(NAME, template, case) and "n?: number,\n" in r.text
    assert [(d.message, d.field) for d in r.dropped] == [(-1, "tools")] and "'minimum'" in r.dropped[0].why
    # An empty list declares nothing, as the template tests it.
    case["request"]["tools"] = []
    r = tpl.render(case["request"], **case["options"])
    assert r.text == hf_render(NAME, template, case) and "developer" not in r.text and r.dropped == ()


def test_validate_accepts_the_file() -> None:
    validates(FILE)


@pytest.mark.parametrize(("old", "new", "match"), [
    ('drop_later = ["system"]', 'drop_later = ["developer"]', "drop_later lists accepted roles"),
    ("keep = 1", "keep = -1", "keep is how many"),
    ('ending = "given"', 'ending = "always"', "ending is \"given\""),
    ('forbid = { assistant = [', 'forbid = { critic = [', "forbid is"),
    ('values = ["browser", "python"]', 'values = ["browser", "python", "a b"]', "a list option is"),
    ('content = "reasoning"', 'content = "reasoning"\nsection = "{calls}"', "a section of calls is not written"),
    ('arguments = "tojson"', 'arguments = "string"', "arguments is one of 'as_given', 'tojson'"),
    ("[system]\n", "[system]\ndefault = \"S\"\n", "a default system message is not written by a format that "
                                                  "writes a message as several"),
    ('assistant = "with_calls"', 'assistant = "with calls"', "missing is"),
    ("{?ends}", "{?last}", "unknown condition 'last'"),
    ("{?some_tools}# Tools", "{?builtin_tools_shell}# Tools", "unknown condition 'builtin_tools_shell'"),
    ("functions.{call_name} to", "functions.{name} to", "unknown slot {name}"),
])
def test_the_new_keys_are_checked_in_the_file(tmp_path: Path, old: str, new: str, match: str) -> None:
    refused_edit(FILE, tmp_path, old, new, match)


def test_its_names_are_unknown_to_other_files(tmp_path: Path) -> None:
    """The conditions and slots of a format that writes a message as several
    are known to no other file: the Mistral file with {?ends} is refused."""
    text = (FILE.parent / "mistral-small-3.1.toml").read_text(encoding="utf-8")
    path = tmp_path / "bad.toml"
    path.write_text(text.replace('close = "</s>"', 'close = "{?ends}</s>{/}"', 1), encoding="utf-8")
    with pytest.raises(xtml.TemplateError, match="unknown condition 'ends'"):
        xtml.load(str(path))


def test_a_result_list_is_json_and_a_string_is_quoted(tpl: xtml.Template) -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "now", "arguments": {}}}]}
    for content, written in (("a\"b", '"a\\"b"'), ([{"type": "text", "text": "é"}], '[{"type": "text", "text": "é"}]'),
                             ("", '""')):
        r = tpl.render({"messages": [{"role": "user", "content": "q"}, call, {"role": "tool", "content": content}]})
        assert f"<|start|>functions.now to=assistant<|channel|>commentary<|message|>{written}<|end|>" in r.text
        assert json.loads(written) == content
