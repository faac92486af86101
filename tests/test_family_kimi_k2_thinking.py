"""The ``kimi-k2-thinking`` layout dialect against Kimi K2 Thinking's own
chat template (``models/templates/moonshotai-Kimi-K2-Thinking.jinja`` of
ggml-org/llama.cpp at 0c3c896, which the sdist carries only as later
edited): its renders, by transformers, are committed with their requests
(tests/data/families/kimi-k2-thinking.jsonl). Byte-equal text on each, the
drops reported, prompts and answers read back, answers streamed."""

from __future__ import annotations

import json

import pytest

import xtml
from tests.helpers.cli import run
from tests.helpers.family_cases import dialect_fixtures, names_its_reference
from tests.helpers.kimi_families import (
    Case,
    check_answers,
    check_any_answer_streams,
    check_every_grouping,
    check_parse,
    check_texts,
    thinking_drops,
    vocabulary,
)
from xtml.chat.template_file import builtin_files

NAME = "kimi-k2-thinking"


tpl, cases = dialect_fixtures(NAME)

test_the_dialect_names_its_reference = names_its_reference(NAME)


def test_text_against_the_official_template(tpl: xtml.Template, cases: list[Case]) -> None:
    counts = check_texts(tpl, cases, thinking_drops)
    print(NAME, counts)
    assert counts["equal"] == len(cases) == 400
    assert min(v for k, v in counts.items() if k not in ("refused", "refused_repr")) >= 10, counts


def test_names_ids_and_reasoning_as_the_template_writes_them(tpl: xtml.Template) -> None:
    """A name is the role text; ids are written as given (an absent one
    empty) and a call's name only as its id spells it; reasoning shows
    after the last answer without calls, in a block on every answer."""
    req = {"messages": [
        {"role": "user", "name": "alice", "content": "hi"},
        {"role": "assistant", "content": "one", "reasoning_content": "old"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "", "reasoning": "\nnew\n", "tool_calls": [
            {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
            {"type": "function", "function": {"name": "g", "arguments": {"b": "ü"}}}]},
        {"role": "tool", "name": "f", "tool_call_id": "functions.f:0", "content": [{"type": "text", "text": "ok"}]},
    ], "add_generation_prompt": True}
    r = tpl.render(req)
    assert r.text == (
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
        "<|im_user|>alice<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>one<|im_end|>"
        "<|im_user|>user<|im_middle|>more<|im_end|><|im_assistant|>assistant<|im_middle|><think>\nnew\n</think>"
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1}"
        "<|tool_call_end|><|tool_call_begin|><|tool_call_argument_begin|>{\"b\": \"ü\"}<|tool_call_end|>"
        "<|tool_calls_section_end|><|im_end|><|im_system|>f<|im_middle|>## Return of functions.f:0\nok<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>")
    assert {(d.message, d.field) for d in r.dropped} == {(1, "reasoning_content"), (3, "tool_calls.function.name")}
    vocab = vocabulary(tpl)
    back = tpl.parse(tpl.encode(req, vocab), vocab)
    assert back == tpl.normalize(req)
    assert back["messages"][1] == {"role": "user", "name": "alice", "content": "hi"}
    assert back["messages"][4]["reasoning_content"] == "\nnew\n"
    assert back["messages"][4]["tool_calls"][1] == {"type": "function", "function": {"name": "",
                                                                                      "arguments": '{"b": "ü"}'}}
    assert back["messages"][5] == {"role": "tool", "name": "f", "tool_call_id": "functions.f:0", "content": "ok"}


def test_parse_gives_the_normal_form_back(tpl: xtml.Template, cases: list[Case]) -> None:
    n, texts = check_parse(tpl, cases)
    print(NAME, {"ids": n, "text": texts})
    assert n == 400 and texts >= 200


def test_a_rendered_answer_parses_back_strictly_and_streams(tpl: xtml.Template, cases: list[Case]) -> None:
    counts = check_answers(tpl, cases)
    print(NAME, counts)
    assert counts["answers"] >= 100 and counts["with_calls"] >= 20 and counts["nameless"] >= 20


def test_any_answer_streams_as_it_parses(tpl: xtml.Template) -> None:
    check_any_answer_streams(tpl, [
        "<think>", "</think>", "hm", "\n", "\n\n", "ok ", "é", "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>", "<|tool_call_begin|>", "functions.f:0", "<|tool_call_argument_begin|>",
        '{"a": 1}', "<|tool_call_end|>", "<|im_user|>"])


def test_short_answers_stream_alike_in_every_grouping(tpl: xtml.Template) -> None:
    n = check_every_grouping(tpl, [
        "<think>\né</think>\nok<|im_end|>", "<think>a<|im_user|>b", "\n</think>a<|tool_calls_section_begin|>",
        "<think></think><|tool_calls_section_begin|><|tool_call_begin|>f:0<|tool_call_argument_begin|>"])
    assert n >= 300


def test_hostile_answers_lose_nothing_silently(tpl: xtml.Template) -> None:
    vocab = vocabulary(tpl)

    def ids(text: str) -> list[int]:
        return tpl.completion_ids(text, vocab)

    call = "<|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{\"q\": \"x\"}<|tool_call_end|>"
    section = f"<|tool_calls_section_begin|>{call}<|tool_calls_section_end|>"
    whole = tpl.parse(ids("<think>\nplan\n</think>\nok" + section + "<|im_end|>"), vocab, completion=True)
    assert whole == {"role": "assistant", "reasoning_content": "\nplan\n", "content": "\nok", "tool_calls": [
        {"id": "functions.search:0", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}]}
    thought = ids("<think>plan</think>")
    assert tpl.reasoning_tokens(thought + ids("ok<|im_end|>"), vocab) == len(thought)
    # Cut in the reasoning: said, the reasoning kept, no content made up.
    cut = tpl.parse(ids("<think>plan"), vocab, completion=True, lenient=True)
    assert cut["reasoning_content"] == "plan" and cut["content"] == ""
    assert [d["kind"] for d in cut["diagnostics"]] == ["truncated", "truncated"]
    # A reasoning token out of place is a repair, never text.
    stray = tpl.parse(ids("ok</think>go<|im_end|>"), vocab, completion=True, lenient=True)
    assert stray["content"] == "okgo" and [d["kind"] for d in stray["diagnostics"]] == ["stray-token"]
    with pytest.raises(xtml.ParseError):
        tpl.parse(ids("ok</think>go<|im_end|>"), vocab, completion=True)


def test_the_cli_renders_and_validates() -> None:
    request = {"messages": [{"role": "user", "content": "hi", "name": "alice"}]}
    code, out, err = run(["render", "-t", NAME, "-"], stdin=json.dumps(request))
    assert code == 0, err
    assert out.rstrip("\n") == xtml.load(NAME).render(request).text
    assert "<|im_user|>alice<|im_middle|>hi<|im_end|>" in out
    code, out, _ = run(["validate", str(builtin_files(layout=True)[NAME])])
    assert code == 0 and ": valid (checked: toml, keys, tokens, patterns" in out, out


@pytest.mark.parametrize(("message", "read"), [
    # A tool result named as the system role reads back as a system message.
    ({"role": "tool", "name": "system", "tool_call_id": "a", "content": "r"},
     {"role": "system", "content": "## Return of a\nr"}),
    # A named system message that holds a tool result's shape reads back as one.
    ({"role": "system", "name": "x", "content": "## Return of a\nb"},
     {"role": "tool", "name": "x", "tool_call_id": "a", "content": "b"}),
    # Named as the tool role, but not of a tool result's shape: a system message.
    ({"role": "system", "name": "tool", "content": "plain"}, {"role": "system", "name": "tool", "content": "plain"}),
    ({"role": "user", "name": "assistant", "content": "hi"}, {"role": "user", "name": "assistant", "content": "hi"}),
])
def test_names_that_are_role_text_read_back_as_the_format_tells_them(
        tpl: xtml.Template, message: dict[str, str], read: dict[str, str]) -> None:
    vocab = vocabulary(tpl)
    req = {"messages": [{"role": "system", "content": "s"}, message]}
    normal = tpl.normalize(req)
    assert normal["messages"][1] == read
    assert tpl.parse(tpl.encode(req, vocab), vocab) == normal
