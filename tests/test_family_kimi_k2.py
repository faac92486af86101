"""The ``kimi-k2`` layout dialect against Kimi K2's own chat template
(``moonshotai-Kimi-K2.jinja`` of llama.cpp's sdist, rendered by
transformers): byte-equal text wherever the official template renders, a
located refusal wherever it raises or prints a Python list, and every field
it leaves out reported. Kimi K2's tokenizer is not packaged: ids are
checked over byte tokens with the format's tokens as special ids."""

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
    k2_drops,
    python_list,
    vocabulary,
)
from xtml.chat.template_file import builtin_files

NAME = "kimi-k2"


tpl, cases = dialect_fixtures(NAME)

test_the_dialect_names_its_reference = names_its_reference(NAME)


def test_text_against_the_official_template(tpl: xtml.Template, cases: list[Case]) -> None:
    counts = texts_match(tpl, cases, k2_drops, python_list)
    # The template raises on none of the generated requests.
    assert counts["refused"] == 0
    assert min(v for k, v in counts.items() if k not in ("refused", "reasoning_shown")) >= 10, counts


def test_spellings_the_template_has(tpl: xtml.Template) -> None:
    """A call's id is the format's own, a string argument is written as a
    JSON string, a tool result's "\\n" is a backslash and an n, and an
    image is its placeholder with a newline after it."""
    req = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "u"}},
                                     {"type": "text", "text": "this"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "ok"}], "add_generation_prompt": False}
    r = tpl.render(req)
    assert r.text == ("<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>"
                      "<|im_user|>user<|im_middle|>see<|media_start|>image<|media_content|><|media_pad|>"
                      "<|media_end|>\nthis<|im_end|><|im_assistant|>assistant<|im_middle|>"
                      "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
                      '"{\\"a\\": 1}"<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
                      "<|im_system|>tool<|im_middle|>## Return of call_9\\nok<|im_end|>")
    assert {(d.message, d.field) for d in r.dropped} == {(0, "content[1]"), (1, "tool_calls.id")}
    vocab = vocabulary(tpl)
    back = tpl.parse(tpl.encode(req, vocab), vocab)
    assert back == tpl.normalize(req)
    assert back["messages"][1]["content"] == [{"type": "text", "text": "see"}, {"type": "image"},
                                              {"type": "text", "text": "this"}]
    assert back["messages"][2]["tool_calls"] == [
        {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]


def test_parse_gives_the_normal_form_back(tpl: xtml.Template, cases: list[Case]) -> None:
    n, texts = check_parse(tpl, cases)
    print(NAME, {"ids": n, "text": texts})
    assert n >= 300 and texts >= 200


def test_a_rendered_answer_parses_back_strictly_and_streams(tpl: xtml.Template, cases: list[Case]) -> None:
    counts = check_answers(tpl, cases)
    print(NAME, counts)
    assert counts["answers"] >= 40 and counts["with_calls"] >= 5 and counts["nameless"] == 0


def test_any_answer_streams_as_it_parses(tpl: xtml.Template) -> None:
    check_any_answer_streams(tpl, [
        "hm", "ok ", "\n", "é", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
        "functions.f:0", "<|tool_call_argument_begin|>", '{"a": 1}', "<|tool_call_end|>", "<|im_user|>",
        "<|media_pad|>"])


def test_short_answers_stream_alike_in_every_grouping(tpl: xtml.Template) -> None:
    n = check_every_grouping(tpl, [
        "a\n<|tool_calls_section_begin|><|tool_call_begin|>f<|tool_call_argument_begin|>",
        "é<|tool_calls_section_begin|><|tool_call_begin|>x<|tool_call_argument_begin|>{}<|tool_call_end|>",
        "ok<|tool_calls_section_end|>\n<|im_end|>x", "<|im_user|>h\né\n<|im_end|>"])
    assert n >= 300


def test_hostile_answers_lose_nothing_silently(tpl: xtml.Template) -> None:
    vocab = vocabulary(tpl)

    def ids(text: str) -> list[int]:
        return tpl.completion_ids(text, vocab)

    call = ("<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}"
            "<|tool_call_end|>")
    section = f"<|tool_calls_section_begin|>{call}<|tool_calls_section_end|>"
    # Marker text inside arguments is text in ids (no token): the call reads whole.
    args = '{"q": "a <|tool_call_end|> b"}'
    inside = vocab.encode_texts([args])[0]
    got = tpl.parse(ids("<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>")
                    + inside + ids("<|tool_call_end|><|tool_calls_section_end|><|im_end|>"), vocab, completion=True)
    assert got["tool_calls"] == [{"id": "functions.f:0", "type": "function",
                                  "function": {"name": "f", "arguments": args}}]
    # Cut inside a call: withheld and said, never half read.
    cut = tpl.parse(ids("Sure." + section[:-60]), vocab, completion=True, lenient=True)
    assert "tool_calls" not in cut and cut["content"] == "Sure."
    assert [d["kind"] for d in cut["diagnostics"]] == ["truncated", "truncated", "truncated"]
    with pytest.raises(xtml.ParseError):
        tpl.parse(ids("Sure." + section[:-60]), vocab, completion=True)
    # A call, then text: the text is a repair, the call kept.
    after = tpl.parse(ids(section + "and more<|im_end|>"), vocab, completion=True, lenient=True)
    assert len(after["tool_calls"]) == 1 and [d["kind"] for d in after["diagnostics"]] == ["stray-content"]
    # Arguments that are not JSON, and an id that names no tool: withheld with a diagnostic.
    bad = tpl.parse(ids(section.replace('{"city": "Paris"}', "{oops") + "<|im_end|>"), vocab, completion=True,
                    lenient=True)
    assert "tool_calls" not in bad and [d["kind"] for d in bad["diagnostics"]] == ["bad-argument"]
    # Arguments nested deeper than a JSON reader recurses: withheld, never a crash.
    deep = "[" * 50000 + "]" * 50000
    for lenient in (True, False):
        try:
            got = tpl.parse(ids(section.replace('{"city": "Paris"}', deep) + "<|im_end|>"), vocab, completion=True,
                            lenient=lenient)
        except xtml.ParseError as e:
            assert not lenient and "not a JSON object" in e.msg
        else:
            assert lenient and [d["kind"] for d in got["diagnostics"]] == ["bad-argument"]
    nameless = tpl.parse(ids(section.replace("functions.get_weather:0", "call_1") + "<|im_end|>"), vocab,
                         completion=True, lenient=True)
    assert "tool_calls" not in nameless and [d["kind"] for d in nameless["diagnostics"]] == ["bad-call"]
    # Content and two calls; a tool the request does not declare is still read (the caller checks names).
    two = tpl.parse(ids("ok<|tool_calls_section_begin|>" + call + call.replace("get_weather:0", "unknown:1")
                        + "<|tool_calls_section_end|><|im_end|>"), vocab, completion=True)
    assert two["content"] == "ok" and [c["function"]["name"] for c in two["tool_calls"]] == ["get_weather", "unknown"]


def test_the_cli_renders_and_validates(tmp_path: Path) -> None:
    request = {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
    code, out, err = run(["render", "-t", NAME, "-"], stdin=json.dumps(request))
    assert code == 0, err
    assert out.rstrip("\n") == xtml.load(NAME).render(request).text
    assert out.startswith('<|im_system|>tool_declare<|im_middle|>[{"type": "function"')
    code, out, _ = run(["validate", str(builtin_files(layout=True)[NAME])])
    assert code == 0 and ": valid (checked: toml, keys, tokens, patterns" in out, out
    # A generated id needs its spelling: said at the key.
    text = builtin_files(layout=True)[NAME].read_text(encoding="utf-8")
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('id = "functions.{name}:{index}"\n', ""), encoding="utf-8")
    code, out, _ = run(["validate", str(bad)])
    assert code == 1 and "calls.id: generated ids need their spelling" in out, out
