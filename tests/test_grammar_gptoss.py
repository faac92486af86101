"""The completion grammar of gpt-oss (harmony), in every format.

An answer after the prompt's ``<|start|>assistant`` is analysis messages
(``<|channel|>analysis<|message|>`` text ``<|end|>``, each later message
after ``<|start|>assistant``), maybe none, then either the final message
(``<|channel|>final<|message|>`` text, or JSON under response_format,
``<|return|>``) or one call in the template's header form (``
to=functions.NAME<|channel|>commentary json<|message|>`` a JSON object of
the tool's schema ``<|call|>``).

Soundness by sampling: random walks under each format's own matcher
(llguidance for its grammar and for the GBNF one, xgrammar for its EBNF
and its structural tag) parse strictly, read the same by the answer's
contract (a reader written apart from the dialect's parse), to calls whose
arguments validate and that hold the request (tool_choice, response_format).
Completeness: every rendered answer the request allows is taken, and the
answers it does not allow refused.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import xtml
from tests.helpers.gptoss_grammar import (
    ANSWERS,
    KIND,
    answer_texts,
    check,
    drawn,
    gptoss_read,
    llguidance_walk,
    request,
    xgrammar_walks,
)
from tests.helpers.layout_grammar import GPTOSS, takes, token_ids, vocab
from tests.helpers.mistral_grammar import lark_of
from xtml.template import LayoutTemplate

WALKED = 200
"""Walks per format: one per drawn request."""


def _parse(ids: list[int]) -> dict[str, Any]:
    return GPTOSS.parse(ids, vocab(KIND), completion=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize("fmt", ["llguidance", "gbnf"])
def test_sampled_completions_parse_strictly_and_hold_the_request(fmt: str) -> None:
    batch = drawn(WALKED)
    kinds = {"reasoning": 0, "call": 0, "final": 0}
    for case, seed in batch:
        ids = llguidance_walk(case, seed, fmt)
        check(case, ids, fmt, _parse)
        message = gptoss_read(ids, vocab(KIND))
        kinds["reasoning"] += "reasoning_content" in message
        kinds["call" if "tool_calls" in message else "final"] += 1
    assert len(batch) == WALKED
    # The walks reach every part of the answer.
    assert min(kinds.values()) >= WALKED // 20, kinds


@pytest.mark.engines
def test_xgrammar_samples_parse_strictly_and_hold_the_request() -> None:
    batch = drawn(WALKED)
    for fmt in ("xgrammar", "xgrammar-tag"):
        version, walks = xgrammar_walks(batch, fmt)
        for (case, _), ids in zip(batch, walks, strict=True):
            try:
                check(case, ids, fmt, _parse)
            except AssertionError as e:
                raise AssertionError(f"xgrammar {version}, {fmt}: {e}") from None


@pytest.mark.parametrize(("extra", "text", "good"), answer_texts())
@pytest.mark.parametrize("fmt", ["llguidance", "gbnf"])
def test_rendered_answers_are_taken_and_others_refused(extra: dict[str, Any], text: str, good: bool,
                                                       fmt: str) -> None:
    v = vocab(KIND)
    ids = token_ids(GPTOSS, v, text)
    g = GPTOSS.completion_grammar(request(extra), v, format=fmt)
    assert takes(lark_of(g) if fmt == "gbnf" else g, KIND, ids) == good, text
    if good:
        assert _parse(ids) == gptoss_read(ids, v)


def test_the_rendered_answers_are_the_templates() -> None:
    # The table's rendered answers are the template's: its call header, the
    # analysis message before it, the close that ends the render.
    texts = answer_texts()
    call = next(t for (extra, a, _), (_, t, _) in zip(ANSWERS, texts, strict=True)
                if not isinstance(a, str) and a.get("reasoning_content") == "Call it.")
    assert call == ('<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant to=functions.get_weather'
                    '<|channel|>commentary json<|message|>{"city": "Paris", "days": 3}<|call|>')


@pytest.mark.parametrize("fmt", ["llguidance", "gbnf", "xgrammar", "xgrammar-tag"])
def test_every_format_writes_the_messages(fmt: str) -> None:
    v = vocab(KIND)
    ids = GPTOSS.bind(v).token_ids
    ref = {"llguidance": "<[{}]>", "gbnf": "<[{}]>"}.get(fmt, "Token({})")
    g = GPTOSS.completion_grammar(request({}), v, format=fmt)
    assert "template gpt-oss" in g and "get_weather" in g and '"analysis"' in g.replace('\\"', '"')
    for t in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"):
        assert ref.format(ids[t]) in g, t
    # No call: the call's header and close are not written.
    g = GPTOSS.completion_grammar(request({"tool_choice": "none"}), v, format=fmt)
    assert "to=functions" not in g and ref.format(ids["<|call|>"]) not in g


def test_reasoning_effort_does_not_change_the_shape() -> None:
    v = vocab(KIND)
    grammars = {GPTOSS.completion_grammar(request({"reasoning_effort": e}), v).split("\n", 2)[2]
                for e in ("low", "medium", "high")}
    assert len(grammars) == 1


def test_a_name_the_reader_cuts_is_left_out() -> None:
    # The reader ends a recipient at a space: such a tool is not callable.
    v = vocab(KIND)
    spaced = {"type": "function", "function": {"name": "get time", "description": "d", "parameters": {
        "type": "object", "properties": {}}}}
    req = {"messages": [{"role": "user", "content": "hi"}], "tools": [spaced, request({})["tools"][0]]}
    g = GPTOSS.completion_grammar(req, v)
    assert "get time" in g.split("\n")[4] and "to=functions.get time" not in g and "to=functions.get_weather" in g
    with pytest.raises(xtml.OptionError, match="no declared tool can be called") as e:
        GPTOSS.completion_grammar({**req, "tools": [spaced], "tool_choice": "required"}, v)
    assert e.value.option == "tool_choice"


def test_a_vocabulary_that_spells_the_tokens_as_text_is_refused() -> None:
    # Where the format's tokens are added ones, a vocabulary may spell them
    # as text: the messages need each as one id.
    from xtml.vocab.vocabulary import byte_vocabulary

    d = GPTOSS.layout
    added = LayoutTemplate(replace(d, special=(), added=d.tokens))
    with pytest.raises(xtml.TokenizerError, match="needs each as one id"):
        added.completion_grammar(request({}), byte_vocabulary(("<|return|>", "<|call|>")))


def test_messages_the_reader_does_not_read_are_refused_by_name() -> None:
    # A call that is not a message of the assistant, a generation prompt
    # that is not a message's start: the grammar says so, writes nothing.
    d = GPTOSS.layout
    each = d.calls_each
    odd = LayoutTemplate(replace(d, calls_each=replace(each, items=each.items[1:])))
    with pytest.raises(xtml.OptionError, match="not yet available") as e:
        odd.completion_grammar(request({}), vocab(KIND))
    assert e.value.option == "tool_choice"
    prompt = LayoutTemplate(replace(d, prompt=replace(d.prompt, items=d.prompt.items[:1])))
    with pytest.raises(xtml.OptionError, match="generation prompt"):
        prompt.completion_grammar(request({}), vocab(KIND))


def test_requests_the_format_cannot_hold_are_refused() -> None:
    v = vocab(KIND)
    base = {"messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(xtml.OptionError, match="declares no tools"):
        GPTOSS.completion_grammar({**base, "tool_choice": "required"}, v)
    with pytest.raises(xtml.OptionError, match="names 'nope'"):
        GPTOSS.completion_grammar({**request({}), "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                                  v)
    with pytest.raises(xtml.TokenizerError, match="pass the tokenizer"):
        GPTOSS.completion_grammar(request({}), format="gbnf")
    # Without a tokenizer llguidance names the format's tokens.
    assert "<|channel|>" in GPTOSS.completion_grammar(request({}))
