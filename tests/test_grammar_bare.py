"""The completion grammar of Llama 3.1 and DeepSeek V3.1.

Llama 3.1 writes a call bare: the whole answer is ``{"name": …,
"parameters": …}``, or a built-in tool's call after ``<|python_tag|>``, and
a parse reads any such text as a call. So the grammar's free text never
spells a call's opening nor has a JSON object's shape, a JSON answer
(``response_format``) whose schema may hold an object of a call's keys is
refused by name, and ``<|eom_id|>`` (a call that waits for its results)
ends calls only. DeepSeek V3.1's prompt opens the reasoning block with
thinking on: the answer is reasoning up to ``</think>``, then the content
and the calls; after a tool result the format writes no prompt, and the
answer has no block.

Each answer of :data:`~tests.helpers.layout_grammar.BARE_ANSWERS` is taken
or refused as the request allows it, in llguidance's grammar by names and
by ids; xgrammar's and llama.cpp's take the same
(tests/test_grammar_layout_engines.py). Random walks: tests/test_grammar_layout.py.
"""

from __future__ import annotations

from typing import Any

import pytest

import xtml
from tests.helpers.layout_grammar import BARE, BARE_ANSWERS, bare_request, takes, token_ids, vocab
from xtml.codec.completion.layout_plan import may_spell_call

LLAMA, DEEPSEEK = BARE["llama-3.1"], BARE["deepseek-v3.1"]
CASES = [(name, *case) for name, answers in BARE_ANSWERS.items() for case in answers]


@pytest.mark.parametrize(("name", "extra", "text", "good"), CASES)
def test_answers_are_taken_as_the_request_allows(name: str, extra: dict[str, Any], text: str, good: bool) -> None:
    tpl, v = BARE[name], vocab(name)
    request = bare_request(extra)
    ids = token_ids(tpl, v, text)
    for refs in ("name", "id"):
        grammar = tpl.completion_grammar(request, v, token_refs=refs)
        assert takes(grammar, name, ids) == good, (refs, text)
    if good:
        tpl.parse(ids, v, completion=True)


def test_what_a_parse_reads_of_the_answers_the_grammar_takes() -> None:
    v = vocab("llama-3.1")
    req = bare_request({"builtin_tools": ["brave_search"]})
    ids = token_ids(LLAMA, v, '<|python_tag|>brave_search.call(query="weather in Paris")<|eom_id|>')
    assert takes(LLAMA.completion_grammar(req, v), "llama-3.1", ids)
    msg = LLAMA.parse(ids, v, completion=True)
    assert [c["function"] for c in msg["tool_calls"]] == [
        {"name": "brave_search", "arguments": '{"query": "weather in Paris"}'}]
    d = vocab("deepseek-v3.1")
    ids = token_ids(DEEPSEEK, d, "Look it up.</think>Sunny.<｜end▁of▁sentence｜>")
    assert takes(DEEPSEEK.completion_grammar(bare_request({"thinking": True}), d), "deepseek-v3.1", ids)
    msg = DEEPSEEK.parse(ids, d, completion=True)
    assert (msg["reasoning_content"], msg["content"]) == ("Look it up.", "Sunny.")


@pytest.mark.parametrize(("text", "good"), [
    ("{x} is a set.", True),
    ("A set: {x}", True),
    ("\u3000{}\u2028", False),   # Python's strip takes both for whitespace
    ("\x1c{}", False),
    ('{"name": "f"}', False),    # a call's opening, though not a call
])
def test_free_text_never_has_a_calls_shape(text: str, good: bool) -> None:
    v = vocab("llama-3.1")
    ids = token_ids(LLAMA, v, text + "<|eot_id|>")
    assert takes(LLAMA.completion_grammar(bare_request({"tool_choice": "none"}), v), "llama-3.1", ids) == good
    if good:
        assert LLAMA.parse(ids, v, completion=True)["content"] == text


@pytest.mark.parametrize(("schema", "spells"), [
    ({"type": "object"}, True),
    ({}, True),
    ({"type": "object", "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
      "additionalProperties": False}, True),
    ({"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": False}, False),
    ({"type": "array", "items": {"type": "object", "properties": {}, "additionalProperties": False}}, False),
    ({"type": "array", "items": {"type": "object"}}, True),
    ({"$defs": {"o": {"type": "object"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/o"}},
      "additionalProperties": False}, True),
    ({"enum": [{"name": "f", "parameters": {}}]}, True),
    ({"enum": ["a", 1]}, False),
    ({"$ref": "https://example.com/s.json"}, True),
    ({"type": "string"}, False),
    # The reader finds a call's two keys in whichever objects they are.
    ({"type": "object", "properties": {
        "x": {"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": False},
        "y": {"type": "string"},
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
      "additionalProperties": False}, True),
    ({"type": "object", "properties": {"a": {"type": "array"}}, "additionalProperties": False}, True),
])
def test_json_answers_that_may_hold_a_call_are_refused_by_name(schema: Any, spells: bool) -> None:
    assert may_spell_call(schema) == spells
    req = bare_request({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}})
    v = vocab("llama-3.1")
    if spells:
        with pytest.raises(xtml.OptionError, match="reads a JSON object of the keys 'name' and 'parameters'") as e:
            LLAMA.completion_grammar(req, v)
        assert e.value.option == "response_format"
    else:
        assert "template llama-3.1" in LLAMA.completion_grammar(req, v)


def test_a_json_answer_never_holds_a_calls_keys() -> None:
    # Found by review: "name" in one object and "parameters" in another
    # read as a call after text, the content cut before it.
    v = vocab("llama-3.1")
    answer = '{"x": {"name": "a"}, "y": "b", "parameters": {}}<|eot_id|>'
    with pytest.raises(xtml.ParseError):
        LLAMA.parse(token_ids(LLAMA, v, answer), v, completion=True)
    lenient = LLAMA.parse(token_ids(LLAMA, v, answer), v, completion=True, lenient=True)
    assert lenient["content"] != answer[:-len("<|eot_id|>")]


def test_built_in_tools_that_a_call_cannot_spell_are_left_out_with_a_note() -> None:
    v = vocab("llama-3.1")
    g = LLAMA.completion_grammar(bare_request({"builtin_tools": ["brave_search", "a.call(b"]}), v)
    assert "brave_search.call(" in g and "'a.call(b' is not a name a call can spell" in g


@pytest.mark.parametrize("fmt", ["gbnf", "xgrammar", "xgrammar-tag"])
def test_every_format_writes_both(fmt: str) -> None:
    for name, extra in (("llama-3.1", {"builtin_tools": ["brave_search"]}), ("deepseek-v3.1", {"thinking": True})):
        tpl, v = BARE[name], vocab(name)
        g = tpl.completion_grammar(bare_request(extra), v, format=fmt)
        assert f"template {name}" in g and "get_weather" in g


def test_deepseek_over_its_own_tokenizer() -> None:
    # DeepSeek's tokenizer has the format's tokens as added, not special,
    # tokens: free text still never is one.
    v = vocab("deepseek")
    req = bare_request({"thinking": True})
    g = DEEPSEEK.completion_grammar(req, v)
    good = token_ids(DEEPSEEK, v, "Hm.</think>Sunny.<｜end▁of▁sentence｜>")
    assert takes(g, "deepseek", good)
    think = DEEPSEEK.bind(v).token_ids["</think>"]
    assert not takes(g, "deepseek", [*v.ids_of(["Hm."])[0], think, think])
