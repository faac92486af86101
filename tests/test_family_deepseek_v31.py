"""The ``deepseek-v3.1`` layout dialect against DeepSeek V3.1's own chat
template (``models/templates/deepseek-ai-DeepSeek-V3.1.jinja`` of
ggml-org/llama.cpp as first added, at 0374c5b; the sdist carries a later
edit): its renders and raises, by transformers, are committed with their
requests (tests/data/families/deepseek-v3.1.jsonl). Byte-equal text on each
render, a located refusal on each raise, the drops reported, prompts and
answers read back, answers streamed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import xtml
from tests.helpers.cli import run
from tests.helpers.family_cases import dialect_fixtures, names_its_reference, texts_match
from tests.helpers.kimi_families import (
    Case,
    check_answers,
    check_any_answer_streams,
    check_every_grouping,
    check_parse,
    deepseek_drops,
    vocabulary,
)
from xtml.chat.template_file import builtin_files

NAME = "deepseek-v3.1"


tpl, cases = dialect_fixtures(NAME)

test_the_dialect_names_its_reference = names_its_reference(NAME)


def test_text_against_the_official_template(tpl: xtml.Template, cases: list[Case]) -> None:
    counts = texts_match(tpl, cases, deepseek_drops)
    assert counts["refused"] == sum(raises is not None for _, _, raises in cases)
    # (Content parts raise in this template: none is rendered.)
    assert min(v for k, v in counts.items() if k not in ("refused_repr", "reasoning_shown", "parts")) >= 10, counts


def test_what_the_template_does_with_order_prefix_and_thinking(tpl: xtml.Template) -> None:
    """System messages go first, joined; an answer after a tool result has
    no assistant tag and keeps its content whole; the prefix shows only
    with thinking on; no generation prompt after a tool result."""
    req = {"messages": [
        {"role": "user", "content": "q"},
        {"role": "system", "content": "s1"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "content": "r"},
        {"role": "assistant", "content": "x</think>y"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "a</think>b", "prefix": True},
        {"role": "tool", "content": "r2"}], "add_generation_prompt": True}
    r = tpl.render(req, thinking=True)
    assert r.text == ("<｜begin▁of▁sentence｜>s1<｜User｜>q<｜Assistant｜></think><｜tool▁calls▁begin｜>"
                      "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
                      "<｜end▁of▁sentence｜><｜tool▁output▁begin｜>r<｜tool▁output▁end｜>x</think>y"
                      "<｜end▁of▁sentence｜><｜User｜>more<｜Assistant｜><think>b<｜end▁of▁sentence｜>"
                      "<｜tool▁output▁begin｜>r2<｜tool▁output▁end｜>")
    assert {(d.message, d.field) for d in r.dropped} == {(2, "tool_calls.id"), (6, "content"),
                                                         (-1, "add_generation_prompt")}
    vocab = vocabulary(tpl)
    back = tpl.parse(tpl.encode(req, vocab, thinking=True), vocab)
    assert back == tpl.normalize(req, thinking=True)
    assert back["messages"][0] == {"role": "system", "content": "s1"}
    assert back["messages"][6] == {"role": "assistant", "content": "b", "prefix": True}
    assert back["add_generation_prompt"] is False
    # enable_thinking is read where thinking is not given.
    assert tpl.render({"messages": [{"role": "user", "content": "q"}]}, enable_thinking=True).text.endswith(
        "<｜Assistant｜><think>")
    assert tpl.render({"messages": [{"role": "user", "content": "q"}]}, enable_thinking=True,
                      thinking=False).text.endswith("<｜Assistant｜></think>")


def test_parse_gives_the_normal_form_back(tpl: xtml.Template, cases: list[Case]) -> None:
    n, texts = check_parse(tpl, cases)
    print(NAME, {"ids": n, "text": texts})
    assert n == 322 and texts >= 200


def test_a_rendered_answer_parses_back_strictly_and_streams(tpl: xtml.Template, cases: list[Case]) -> None:
    counts = check_answers(tpl, cases)
    print(NAME, counts)
    assert counts["answers"] >= 100 and counts["with_calls"] >= 20 and counts["nameless"] == 0


def test_any_answer_streams_as_it_parses(tpl: xtml.Template) -> None:
    check_any_answer_streams(tpl, [
        "<think>", "</think>", "hm", "\n", "ok ", "é", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>", "f", "<｜tool▁sep｜>", '{"a": 1}', "<｜tool▁call▁end｜>", "<｜User｜>"])


def test_short_answers_stream_alike_in_every_grouping(tpl: xtml.Template) -> None:
    n = check_every_grouping(tpl, [
        "hm\n</think>ok<｜end▁of▁sentence｜>", "é<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}",
        "a</think>b</think>c<｜User｜>", "<think>x<｜end▁of▁sentence｜>y"])
    assert n >= 200


def test_hostile_answers_lose_nothing_silently(tpl: xtml.Template) -> None:
    vocab = vocabulary(tpl)

    def ids(text: str) -> list[int]:
        return tpl.completion_ids(text, vocab)

    call = "<｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"q\": \"x\"}<｜tool▁call▁end｜>"
    section = f"<｜tool▁calls▁begin｜>{call}<｜tool▁calls▁end｜>"
    end = "<｜end▁of▁sentence｜>"
    # With thinking on the prompt opened the block: text before </think> is reasoning.
    whole = tpl.parse(ids("plan\n</think>ok" + section + end), vocab, completion=True)
    assert whole == {"role": "assistant", "reasoning_content": "plan\n", "content": "ok", "tool_calls": [
        {"type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}]}
    thought = ids("plan</think>")
    assert tpl.reasoning_tokens(thought + ids("ok" + end), vocab) == len(thought)
    assert tpl.reasoning_tokens(ids("ok" + end), vocab) == 0
    # Marker text inside arguments is text in ids: the call reads whole.
    args = '{"q": "a <｜tool▁call▁end｜> b"}'
    got = tpl.parse(ids("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>") + vocab.encode_texts([args])[0]
                    + ids("<｜tool▁call▁end｜><｜tool▁calls▁end｜>" + end), vocab, completion=True)
    assert got["tool_calls"][0]["function"]["arguments"] == args
    # Cut inside a call: withheld and said.
    cut = tpl.parse(ids("Sure." + section[:-30]), vocab, completion=True, lenient=True)
    assert "tool_calls" not in cut and cut["content"] == "Sure."
    assert [d["kind"] for d in cut["diagnostics"]] == ["truncated", "truncated", "truncated"]
    with pytest.raises(xtml.ParseError):
        tpl.parse(ids("Sure." + section[:-30]), vocab, completion=True)
    # Text after the section is a repair; the call is kept.
    after = tpl.parse(ids(section + "and more" + end), vocab, completion=True, lenient=True)
    assert len(after["tool_calls"]) == 1 and [d["kind"] for d in after["diagnostics"]] == ["stray-content"]
    bad = tpl.parse(ids(section.replace('{"q": "x"}', "{oops") + end), vocab, completion=True, lenient=True)
    assert "tool_calls" not in bad and [d["kind"] for d in bad["diagnostics"]] == ["bad-argument"]


def test_the_cli_renders_and_validates() -> None:
    request = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
               "chat_template_kwargs": {"thinking": True}}
    code, out, err = run(["render", "-t", NAME, "-"], stdin=json.dumps(request))
    assert code == 0, err
    assert out.rstrip("\n") == "<｜begin▁of▁sentence｜>s<｜User｜>hi<｜Assistant｜><think>"
    code, out, _ = run(["validate", str(builtin_files(layout=True)[NAME])])
    assert code == 0 and ": valid (checked: toml, keys, tokens, patterns" in out, out


def test_the_checker_locates_a_bad_cut_and_an_unknown_flag(tmp_path: Path) -> None:
    text = builtin_files(layout=True)[NAME].read_text(encoding="utf-8")
    bad = tmp_path / "bad.toml"
    broken = text.replace('unless = "after_tool or has_calls"', 'unless = "after_nothing"').replace(
        "{?prefix and thinking", "{?prefixed and thinking")
    bad.write_text(broken, encoding="utf-8")
    code, out, _ = run(["validate", str(bad)])
    assert code == 1
    lines = out.splitlines()
    assert any(": content.cut.unless: unknown condition 'after_nothing'" in ln for ln in lines), out
    assert any(": roles.frame.assistant.open: unknown condition 'prefixed'" in ln for ln in lines), out


def test_the_generation_prompt_is_the_one_after_a_user_message(tpl: xtml.Template) -> None:
    assert [(s.text, s.special) for s in tpl.generation_prompt()] == [("<｜Assistant｜>", True), ("</think>", True)]
