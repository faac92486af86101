"""The completion grammar of GLM-4.6.

GLM writes its own text around the answer: ``\\n<think>`` … ``</think>``
(the model opens the block with thinking on; the prompt closed it with
thinking off), ``\\n`` before content, ``\\n<tool_call>NAME\\n`` before each
call, and arguments as key/value pairs whose values the parse types by the
declared tool's schema (a string property's value is its text, any other
JSON). Calls end with ``<|observation|>`` (the model waits for their
results), other answers with ``<|user|>`` or ``<|endoftext|>``.

Soundness by sampling: random walks under llguidance's real matcher parse
strictly (with the request's tools) to calls whose arguments validate,
and hold the request (:func:`~tests.helpers.layout_walks.violation`); a
reader of the contract written apart from the parse reads each walk the
same. Completeness: the render of every answer that holds the request is
taken, by names and by ids; the others refused. xgrammar's grammars are
matched by xgrammar itself (tests/test_grammar_layout_engines.py).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import settings

import xtml
from tests.helpers.layout_grammar import (
    ANSWERS,
    GLM,
    GLM_ANSWERS,
    TIME,
    WEATHER,
    bare_request,
    glm_answer_ids,
    takes,
    token_ids,
    vocab,
)
from tests.helpers.layout_walks import glm_read, sample
from xtml.chat.layout_open import string_typed
from xtml.vocab.vocabulary import byte_vocabulary

KIND = "glm-4.6"


def test_sampled_completions_parse_strictly_and_hold_the_request() -> None:
    sample(GLM, KIND, settings().max_examples)


def _held(request: dict[str, Any], message: dict[str, Any]) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in request.get("tools", ())}
    for c in message.get("tool_calls", ()):
        jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])


# A string property takes the text a render writes of a number: the parse
# reads it back as the text, which is a string of its schema.
_GLM_GOOD = {json.dumps(a, sort_keys=True): True for _, a, _ in ANSWERS
             if a.get("tool_calls") and a["tool_calls"][0]["function"]["arguments"] == {"city": 7}}


@pytest.mark.parametrize(("extra", "answer", "good"), ANSWERS)
def test_rendered_answers_are_taken_and_others_refused(extra: dict[str, Any], answer: dict[str, Any],
                                                       good: bool) -> None:
    v = vocab(KIND)
    good = _GLM_GOOD.get(json.dumps(answer, sort_keys=True), good)
    request = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER, TIME], **extra}
    ids = glm_answer_ids(request, answer, v)
    for refs in ("name", "id"):
        assert takes(GLM.completion_grammar(request, v, token_refs=refs), KIND, ids) == good, (refs, v.decode(ids))
    if good:
        message = GLM.parse(ids, v, completion=True, tools=request["tools"])
        assert glm_read(ids, v, request["tools"]) == message
        _held(request, message)


@pytest.mark.parametrize(("extra", "text", "good"), GLM_ANSWERS)
def test_answers_are_taken_as_the_request_allows(extra: dict[str, Any], text: str, good: bool) -> None:
    v = vocab(KIND)
    request = bare_request(extra)
    ids = token_ids(GLM, v, text)
    assert takes(GLM.completion_grammar(request, v), KIND, ids) == good, text
    if good:
        message = GLM.parse(ids, v, completion=True, tools=request["tools"])
        assert glm_read(ids, v, request["tools"]) == message
        _held(request, message)


def _tool(prop: Any, required: bool = True) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": prop}, "required": ["x"] if required else []}}}


def _call(value: str) -> str:
    return f"\n<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>{value}</arg_value>\n</tool_call><|observation|>"


@pytest.mark.parametrize(("prop", "value", "good", "read"), [
    # A string property's value is its text, whatever it spells.
    ({"type": "string"}, "5", True, "5"),
    ({"type": "string"}, '"a b"', True, '"a b"'),
    ({"type": ["string", "null"]}, "null", True, "null"),
    ({"type": "string", "maxLength": 2}, "abc", False, None),
    ({"enum": ["p", "q r"]}, "q r", True, "q r"),
    # Any other type is JSON, strings among them as JSON.
    ({"type": "integer"}, "5", True, 5),
    ({"type": "integer"}, "five", False, None),
    ({"type": ["integer", "null"]}, "null", True, None),
    ({"enum": ["p", 1]}, '"p"', True, "p"),
    ({"enum": ["p", 1]}, "p", False, None),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, '{"a": "b"}', True, {"a": "b"}),
    # A schema that says nothing of the type: any JSON but a string (which
    # the parse would read as the text, quotes and all), or any text where
    # any value goes.
    ({}, "some text", True, "some text"),
    ({}, "[1, 2]", True, [1, 2]),
    ({"minimum": 3}, "4", True, 4),
    ({"minimum": 3}, "2", False, None),
])
def test_each_value_reads_back_as_its_schema_says(prop: Any, value: str, good: bool, read: Any) -> None:
    v = vocab(KIND)
    tool = _tool(prop)
    request = {"messages": [{"role": "user", "content": "go"}], "tools": [tool], "tool_choice": "required",
               "enable_thinking": False}
    ids = token_ids(GLM, v, _call(value))
    assert takes(GLM.completion_grammar(request, v), KIND, ids) == good, value
    if good:
        message = GLM.parse(ids, v, completion=True, tools=[tool])
        assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"x": read}


def test_a_value_no_pair_reads_back_is_left_out_with_a_note() -> None:
    # No type given: text that reads as JSON is JSON, so a string of
    # lengths has no spelling that reads back as one.
    v = vocab(KIND)
    words = {"allOf": [{"type": "string", "minLength": 1}, {"maxLength": 3}]}
    base = {"messages": [{"role": "user", "content": "go"}]}
    g = GLM.completion_grammar({**base, "tools": [_tool(words, required=False)]}, v)
    assert "a string is not written" in g
    assert not takes(g, KIND, token_ids(GLM, v, "\n<think></think>" + _call("ab")))
    assert takes(g, KIND, token_ids(GLM, v, "\n<think></think>\n<tool_call>f\n</tool_call><|observation|>"))
    with pytest.raises(xtml.OptionError, match="no declared tool can be called") as e:
        GLM.completion_grammar({**base, "tools": [_tool(words)], "tool_choice": "required"}, v)
    assert e.value.option == "tool_choice"


def test_the_grammars_typing_is_the_parses() -> None:
    # The grammar writes each value as the parse will read it: the two
    # classify the same schemas.
    from xtml.chat.layout_open import read_value

    for prop, text in (({"type": "string"}, "5"), ({"type": "integer"}, "5"), ({"enum": ["a"]}, "5"),
                       ({"enum": ["a", 1]}, "5"), ({}, "5"), ({"type": ["string", "null"]}, "5"), (True, "5")):
        kind = string_typed(prop)
        value, ok = read_value(text, prop)
        assert ok and (value == text if kind else value == 5), prop
        assert read_value('"s"', prop)[0] == ('"s"' if kind is not False else "s"), prop


@pytest.mark.parametrize("fmt", ["llguidance", "gbnf", "xgrammar", "xgrammar-tag"])
def test_every_format_writes_the_pairs(fmt: str) -> None:
    v = vocab(KIND)
    g = GLM.completion_grammar(bare_request({}), v, format=fmt)
    b = GLM.bind(v)
    ref = {"llguidance": "<[{}]>", "gbnf": "<[{}]>"}.get(fmt, "Token({})")
    assert "template glm-4.6" in g and "get_weather" in g
    assert ref.format(b.token_ids["<arg_key>"]) in g and ref.format(b.token_ids["<|observation|>"]) in g


def test_a_vocabulary_that_spells_the_call_tokens_as_text() -> None:
    # Without the added tokens the reasoning block's are text, which the
    # grammar holds; the calls' would need a terminal per spelling.
    v = byte_vocabulary(GLM.layout.special)
    req = {"messages": [{"role": "user", "content": "hi"}]}
    g = GLM.completion_grammar(req, v)
    assert '"<think>"' in g
    with pytest.raises(xtml.TokenizerError, match="writes <tool_call>, </tool_call>, <arg_key>"):
        GLM.completion_grammar({**req, "tools": [WEATHER]}, v)
    assert "template glm-4.6" in GLM.completion_grammar({**req, "tools": [WEATHER], "tool_choice": "none"}, v)


def test_without_a_tokenizer_llguidance_names_the_tokens_an_answer_holds() -> None:
    # "[gMASK]" has no name in llguidance's syntax, but no answer holds it.
    req = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    g = GLM.completion_grammar(req)
    assert "<arg_key>" in g and "<|observation|>" in g and "gMASK" not in g
    assert "<arg_key>" in GLM.completion_grammar(req, vocab(KIND), token_refs="name")
    with pytest.raises(xtml.TokenizerError, match="pass the tokenizer"):
        GLM.completion_grammar(req, format="gbnf")


def test_a_tool_whose_name_a_parse_cuts_is_left_out() -> None:
    # A parse reads a call's name up to its newline.
    v = vocab(KIND)
    cut = {"type": "function", "function": {"name": "a\nb", "parameters": {"type": "object", "properties": {}}}}
    req = {"messages": [{"role": "user", "content": "hi"}], "tools": [cut, TIME], "enable_thinking": False}
    g = GLM.completion_grammar(req, v)
    assert "which ends a name in this format" in g
    assert not takes(g, KIND, token_ids(GLM, v, "\n<tool_call>a\nb\n</tool_call><|observation|>"))
    assert takes(g, KIND, token_ids(GLM, v, "\n<tool_call>get_time\n</tool_call><|observation|>"))
    with pytest.raises(xtml.OptionError, match="no declared tool can be called"):
        GLM.completion_grammar({**req, "tools": [cut], "tool_choice": "required"}, v)
