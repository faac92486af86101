"""The completion grammar of the layout dialects (``smollm2``, ``qwen3``,
``kimi-k2``, ``kimi-k2-thinking``).

Soundness, by sampling (the property of tests/test_grammar_sampling.py):
random walks under llguidance's real matcher, each a completion the grammar
admits, must parse strictly as a completion and hold the request:
``tool_choice`` (none: no call; required or named: calls only, to the named
tool), ``parallel_tool_calls`` false (one call), calls to declared tools with
arguments of their schemas, ``response_format`` (the content is JSON of the
schema), and the reasoning block as the prompt leaves it. Three
vocabularies: byte-level ones with every token of the format as one id, and
one without Qwen3's added tokens (``<think>``, ``<tool_call>``…), which are
then text, as over SmolLM2's own vocabulary (checked too, on the GGUF).
The Kimi formats write their calls in a section, each with an id of their
spelling (``functions.NAME:INDEX``): Kimi K2's ids are the format's own, so
each walk's must be the one the format generates for the call's name and
place; Kimi K2 Thinking's are the model's, of that spelling.

Completeness: the render of an assistant answer that holds the request is
taken by the grammar, id by id, in every format llguidance reads (the
others are matched by their engines: tests/test_grammar_layout_engines.py).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import settings

import xtml
from tests.helpers.layout_grammar import (
    ANSWER,
    ANSWERS,
    KIMI,
    QWEN3,
    SMOLLM2,
    TIME,
    WEATHER,
    answer_ids,
    kimi_answers,
    takes,
    token_ids,
    vocab,
)
from tests.helpers.layout_walks import sample
from xtml.vocab.vocabulary import byte_vocabulary


@pytest.mark.parametrize(("name", "kind"), [("qwen3", "qwen3"), ("qwen3", "chatml"), ("smollm2", "chatml"),
                                           ("kimi-k2", "kimi-k2"), ("kimi-k2-thinking", "kimi-k2-thinking"),
                                           ("llama-3.1", "llama-3.1"), ("deepseek-v3.1", "deepseek-v3.1")])
def test_sampled_completions_parse_strictly_and_hold_the_request(name: str, kind: str) -> None:
    sample(xtml.load(name), kind, settings().max_examples)


def test_sampled_completions_over_smollm2s_own_vocabulary() -> None:
    # Qwen3's format over SmolLM2's vocabulary, as the real model serves it
    # (fewer examples: a mask over 49,152 ids costs more).
    sample(QWEN3, "gguf", 5)


# -- completeness on rendered answers ---------------------------------------------------

@pytest.mark.parametrize("kind", ["qwen3", "chatml"])
@pytest.mark.parametrize(("extra", "answer", "good"), ANSWERS)
def test_rendered_answers_are_taken_and_others_refused(kind: str, extra: dict[str, Any], answer: dict[str, Any],
                                                       good: bool) -> None:
    v = vocab(kind)
    request = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER, TIME], **extra}
    ids = answer_ids(QWEN3, request, answer, v)
    grammar = QWEN3.completion_grammar(request, v)
    assert takes(grammar, kind, ids) == good, v.decode(ids)
    if good:
        QWEN3.parse(ids, v, completion=True)


@pytest.mark.parametrize("name", sorted(KIMI))
@pytest.mark.parametrize(("extra", "answer", "good"), kimi_answers())
def test_kimi_rendered_answers_are_taken_and_others_refused(name: str, extra: dict[str, Any],
                                                            answer: dict[str, Any], good: bool) -> None:
    tpl, v = KIMI[name], vocab(name)
    request = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER, TIME], **extra}
    ids = answer_ids(tpl, request, answer, v)
    for fmt in ("llguidance", "llguidance-ids"):
        grammar = tpl.completion_grammar(request, v, token_refs="name" if fmt == "llguidance" else "id")
        assert takes(grammar, name, ids) == good, (fmt, v.decode(ids))
    if good:
        tpl.parse(ids, v, completion=True)


def _kimi_call(tpl: Any, v: xtml.Vocabulary, call_id: str, think: bool = False) -> list[int]:
    """One call as the Kimi formats write one, in its section, then the
    stop token."""
    text = ("<think>hm</think>" if think else "") + ("<|tool_calls_section_begin|><|tool_call_begin|>"
            f"{call_id}<|tool_call_argument_begin|>{{}}<|tool_call_end|><|tool_calls_section_end|><|im_end|>")
    return token_ids(tpl, v, text)


@pytest.mark.parametrize(("call_id", "k2", "thinking"), [
    ("functions.get_time:0", True, True),
    # Kimi K2 writes its own ids, counting the calls from 0; the model
    # gives Kimi K2 Thinking's, of the same spelling.
    ("functions.get_time:1", False, True),
    ("functions.get_time:007", False, True),
    ("functions.get_time:", False, False),
    ("functions.get_time", False, False),
    ("get_time:0", False, False),
    ("functions.get_weather:0", False, False),
    ("functions.search:0", False, False),
])
def test_kimi_ids_are_spelled_as_the_format_spells_them(call_id: str, k2: bool, thinking: bool) -> None:
    req = {"messages": [{"role": "user", "content": "What time is it?"}], "tools": [WEATHER, TIME],
           "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    for name, good in (("kimi-k2", k2), ("kimi-k2-thinking", thinking)):
        tpl, v = KIMI[name], vocab(name)
        ids = _kimi_call(tpl, v, call_id, think=name == "kimi-k2-thinking")
        assert takes(tpl.completion_grammar(req, v), name, ids) == good, (name, call_id)
        if good:
            call = tpl.parse(ids, v, completion=True)["tool_calls"][0]
            assert call["id"] == call_id and call["function"]["name"] == "get_time"


def test_kimi_calls_are_counted_up_to_max_calls() -> None:
    tpl, v = KIMI["kimi-k2"], vocab("kimi-k2")
    req = {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER, TIME]}
    now = {"type": "function", "function": {"name": "get_time", "arguments": {}}}
    ids = {n: answer_ids(tpl, req, {"content": "", "tool_calls": [now] * n}, v) for n in (1, 2, 3, 64, 65)}
    g = tpl.completion_grammar(req, v, max_calls=2)
    assert takes(g, "kimi-k2", ids[2]) and not takes(g, "kimi-k2", ids[3])
    # Each index is spelled out: by default as many as the XTML engine's
    # grammar counts, and one call only under parallel_tool_calls false.
    default = tpl.completion_grammar(req, v)
    assert takes(default, "kimi-k2", ids[64]) and not takes(default, "kimi-k2", ids[65])
    one = tpl.completion_grammar({**req, "parallel_tool_calls": False}, v)
    assert takes(one, "kimi-k2", ids[1]) and not takes(one, "kimi-k2", ids[2])


def test_kimi_thinking_writes_the_reasoning_block_on_every_answer() -> None:
    tpl, v = KIMI["kimi-k2-thinking"], vocab("kimi-k2-thinking")
    req = {"messages": [{"role": "user", "content": "hi"}]}
    g = tpl.completion_grammar(req, v)
    stop = "<|im_end|>"
    for text, good in (("<think></think>Hello", True), ("<think>Say hi.</think>Hello", True), ("Hello", False),
                       ("<think>a</think>\nHello", True), ("<think>a<think>b</think>Hi", False)):
        assert takes(g, "kimi-k2-thinking", token_ids(tpl, v, text + stop)) == good, text
    # Where the block ended (vLLM's reasoning parser took it), the answer
    # goes on from there: no second block.
    after = tpl.completion_grammar(req, v, after_reasoning=True)
    assert takes(after, "kimi-k2-thinking", token_ids(tpl, v, "Hello" + stop))
    assert not takes(after, "kimi-k2-thinking", token_ids(tpl, v, "<think></think>Hello" + stop))


def test_smollm2_answers() -> None:
    v = vocab("chatml")
    req = {"messages": [{"role": "user", "content": "hi"}]}
    ids = answer_ids(SMOLLM2, req, {"content": "Hello! How can I help?"}, v)
    assert takes(SMOLLM2.completion_grammar(req, v), "chatml", ids)
    rf = {**req, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}}
    good = answer_ids(SMOLLM2, req, {"content": '{"answer": "hi"}'}, v)
    bad = answer_ids(SMOLLM2, req, {"content": "hi"}, v)
    g = SMOLLM2.completion_grammar(rf, v)
    assert takes(g, "chatml", good) and not takes(g, "chatml", bad)


# -- what the grammar says and refuses ----------------------------------------------------


def test_tokens_are_ids_or_text_as_the_vocabulary_has_them() -> None:
    req = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "tool_choice": "required"}
    ids = QWEN3.completion_grammar(req, vocab("qwen3"))
    b = QWEN3.bind(vocab("qwen3"))
    assert f"<[{b.token_ids['<tool_call>']}]>" in ids and '"<tool_call>"' not in ids
    text = QWEN3.completion_grammar(req, vocab("chatml"))
    assert '"<tool_call>"' in text and "spells as text (<think>" in text
    # The stop tokens stay ids: SmolLM2's vocabulary has them.
    stop = QWEN3.bind(vocab("chatml")).token_ids["<|im_end|>"]
    assert f"<[{stop}]>" in text
    for fmt in ("gbnf", "xgrammar", "xgrammar-tag"):
        g = QWEN3.completion_grammar(req, vocab("chatml"), format=fmt)
        assert "<tool_call>" in g and "get_weather" in g
    assert re.search(r"tool_choice required", text)


def test_what_cannot_be_held_is_refused_by_name() -> None:
    v = vocab("chatml")
    base = {"messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(xtml.OptionError, match="smollm2 format has no tool calls") as e:
        SMOLLM2.completion_grammar({**base, "tools": [WEATHER], "tool_choice": "required"}, v)
    assert e.value.option == "tool_choice"
    with pytest.raises(xtml.OptionError, match="declares no tools"):
        QWEN3.completion_grammar({**base, "tool_choice": "required"}, v)
    with pytest.raises(xtml.OptionError, match="names 'nope'"):
        QWEN3.completion_grammar({**base, "tools": [WEATHER], "tool_choice": {"type": "function",
                                                                             "function": {"name": "nope"}}}, v)
    with pytest.raises(xtml.RequestError, match="parallel_tool_calls must be true or false"):
        QWEN3.completion_grammar({**base, "tools": [WEATHER], "parallel_tool_calls": "no"}, v)
    with pytest.raises(xtml.TokenizerError, match="pass the tokenizer"):
        QWEN3.completion_grammar({**base, "tools": [WEATHER]}, format="gbnf")
    bad = {"type": "function", "function": {"name": "a<tool_call>b", "parameters": {"type": "object"}}}
    with pytest.raises(xtml.RequestError, match="spells '<tool_call>'"):
        QWEN3.completion_grammar({**base, "tools": [bad]}, v)
    with pytest.raises(xtml.RequestError, match="max_chars=10"):
        QWEN3.completion_grammar({**base, "tools": [WEATHER]}, v, max_chars=10)
    with pytest.raises(xtml.OptionError, match="max_calls must be a positive integer"):
        QWEN3.completion_grammar({**base, "tools": [WEATHER]}, v, max_calls=0)
    # Without a tokenizer, llguidance's grammar names the tokens.
    named = QWEN3.completion_grammar({**base, "tools": [WEATHER], "tool_choice": "required"})
    assert "<tool_call>" in named and "<[" not in named


@pytest.mark.parametrize("name", ["smollm2", "qwen3", "llama-3.1", "deepseek-v3.1", "kimi-k2", "kimi-k2-thinking"])
def test_each_layout_dialect_has_a_grammar(name: str) -> None:
    tpl: Any = xtml.load(name)
    v = byte_vocabulary(tpl.layout.tokens)
    req = {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}
    for fmt in ("llguidance", "gbnf", "xgrammar", "xgrammar-tag"):
        assert f"template {name}" in tpl.completion_grammar({**req, "response_format": {"type": "json_schema",
                                                            "json_schema": {"name": "a", "schema": ANSWER}}},
                                                            v, format=fmt)
        if name == "llama-3.1":
            # Any JSON object may be a call's: llama reads one as the call.
            with pytest.raises(xtml.OptionError, match="reads a JSON object of the keys 'name' and 'parameters'"):
                tpl.completion_grammar(req, v, format=fmt)
        else:
            assert f"template {name}" in tpl.completion_grammar(req, v, format=fmt)


@pytest.mark.parametrize("string", [{"type": "string"}, {"type": "string", "minLength": 1, "maxLength": 40}])
def test_json_strings_spell_no_token_the_vocabulary_writes_as_text(string: dict[str, Any]) -> None:
    # Found by a walk: a string of lengths (llguidance's %json, which no
    # terminal can be intersected with) spelled "</tool_response>", which
    # a parse reads as the token, so the call was not read.
    v = vocab("chatml")
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": string}, "required": ["s"], "additionalProperties": False}}}
    req = {"messages": [{"role": "user", "content": "go"}], "tools": [tool], "tool_choice": "required",
           "enable_thinking": False}
    grammar = QWEN3.completion_grammar(req, v)
    for value, ok in (("a <tool_resp> b", True), ("a </tool_response> b", False)):
        text = '<tool_call>\n{"name": "f", "arguments": {"s": "' + value + '"}}\n</tool_call>'
        stop = v.special_id("<|im_end|>")
        assert stop is not None
        ids = [*v.ids_of([text])[0], stop]
        assert takes(grammar, "chatml", ids) == ok, value
        if ok:
            assert QWEN3.parse(ids, v, completion=True)["tool_calls"][0]["function"]["name"] == "f"
        else:
            with pytest.raises(xtml.ParseError):
                QWEN3.parse(ids, v, completion=True)


def test_max_calls_bounds_the_calls() -> None:
    v = vocab("qwen3")
    req = {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER, TIME]}
    two = _call_ids(v, req, 2)
    three = _call_ids(v, req, 3)
    g = QWEN3.completion_grammar(req, v, max_calls=2)
    assert takes(g, "qwen3", two) and not takes(g, "qwen3", three)
    assert takes(QWEN3.completion_grammar(req, v), "qwen3", three)


def _call_ids(v: xtml.Vocabulary, req: dict[str, Any], n: int) -> list[int]:
    call = {"type": "function", "function": {"name": "get_time", "arguments": {}}}
    return answer_ids(QWEN3, req, {"content": "", "tool_calls": [call] * n}, v)
