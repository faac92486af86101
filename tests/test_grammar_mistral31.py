"""The completion grammar of Mistral Small 3.1, in every format.

An answer is content (free text, no token of the format) then ``</s>``;
or content, ``[TOOL_CALLS]``, maybe the space the format writes, then one
JSON array of calls, each ``{"name": …, "arguments": …}`` with maybe an
``"id"`` of nine letters and digits, then ``</s>``. No token closes a call:
the array's ``]`` ends the calls.

Soundness by sampling: random walks under each format's own matcher
(llguidance for its grammar and for the GBNF one, xgrammar for its EBNF
and its structural tag) read by the answer's contract (a reader written
apart from the dialect's parse) to calls whose arguments validate and that
hold the request (tool_choice, parallel_tool_calls, response_format).
Completeness: every rendered answer the request allows is taken, and the
answers it does not allow refused.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import xtml
from tests.helpers.layout_grammar import MISTRAL, bare_request, takes, token_ids, vocab
from tests.helpers.mistral_grammar import (
    ANSWERS,
    KIND,
    answer_texts,
    check,
    drawn,
    lark_of,
    llguidance_walk,
    mistral_read,
    xgrammar_walks,
)

WALKED = 200
"""Walks per format: one per drawn request."""


def _parse(ids: list[int]) -> dict[str, Any]:
    return MISTRAL.parse(ids, vocab(KIND), completion=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize("fmt", ["llguidance", "gbnf"])
def test_sampled_completions_read_by_the_contract_and_hold_the_request(fmt: str) -> None:
    batch = drawn(WALKED)
    for case, seed in batch:
        check(case, llguidance_walk(case, seed, fmt), fmt, _parse)
    assert len(batch) == WALKED


@pytest.mark.engines
def test_completions_xgrammar_samples_read_by_the_contract_and_hold_the_request() -> None:
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
    request = bare_request(extra)
    ids = token_ids(MISTRAL, v, text)
    g = MISTRAL.completion_grammar(request, v, format=fmt)
    assert takes(lark_of(g) if fmt == "gbnf" else g, KIND, ids) == good, text
    if good:
        assert _parse(ids) == mistral_read(ids, v)


def test_the_rendered_answers_are_the_formats() -> None:
    # The rendered answers of the table are what the format writes: the
    # calls' array after "[TOOL_CALLS] ", the content beside calls left out.
    texts = answer_texts()
    paris = next(t for (extra, a, _), (_, t, _) in zip(ANSWERS, texts, strict=True)
                 if not isinstance(a, str) and extra.get("tool_choice") == "required" and a["content"])
    assert paris == ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}, '
                     '"id": "a1B2c3D4e"}]</s>')


@pytest.mark.parametrize("fmt", ["llguidance", "gbnf", "xgrammar", "xgrammar-tag"])
def test_every_format_writes_the_array(fmt: str) -> None:
    v = vocab(KIND)
    g = MISTRAL.completion_grammar(bare_request({"parallel_tool_calls": False}), v, format=fmt)
    ref = {"llguidance": "<[{}]>", "gbnf": "<[{}]>"}.get(fmt, "Token({})")
    calls = MISTRAL.bind(v).token_ids["[TOOL_CALLS]"]
    assert "template mistral-small-3.1" in g and "get_weather" in g and "one call at most" in g
    assert ref.format(calls) in g


def test_the_id_is_the_formats_length() -> None:
    # The format writes the last nine characters of an id; where it wrote
    # ids as given, any number of them.
    v = vocab(KIND)
    req = bare_request({"tool_choice": "required"})
    nine = '[TOOL_CALLS] [{"name": "get_time", "arguments": {}, "id": "%s"}]</s>'
    g = MISTRAL.completion_grammar(req, v)
    assert takes(g, KIND, token_ids(MISTRAL, v, nine % "abcdefghi"))
    assert not takes(g, KIND, token_ids(MISTRAL, v, nine % "abcdefghij"))
    from dataclasses import replace

    from xtml.template import LayoutTemplate

    free = LayoutTemplate(replace(MISTRAL.layout, id_tail=0))
    g = free.completion_grammar(req, v)
    assert takes(g, KIND, token_ids(free, v, nine % "abcdefghij"))
    assert not takes(g, KIND, token_ids(free, v, nine % ""))


def test_a_call_the_grammar_cannot_write_is_refused_by_name() -> None:
    # A call's object of keys this grammar does not write (a token inside
    # it, a key whose value is neither the name, the arguments nor an id).
    from dataclasses import replace

    from xtml.chat.layout_pattern import Lit, Slot
    from xtml.template import LayoutTemplate

    each = MISTRAL.layout.calls_each
    odd = replace(each, items=(*each.items[:-1], Lit('", "type": "function"}')))
    t = LayoutTemplate(replace(MISTRAL.layout, calls_each=odd))
    with pytest.raises(xtml.OptionError, match="an array's call is read as a JSON object") as e:
        t.completion_grammar(bare_request({}), vocab(KIND))
    assert e.value.option == "tool_choice"
    quoted = replace(each, items=tuple(Lit(i.text.replace('"arguments": ', '"arguments": "')
                                           .replace(', "id"', '", "id"')) if isinstance(i, Lit) else i
                                       for i in each.items))
    assert Slot("arguments") in quoted.items
    t = LayoutTemplate(replace(MISTRAL.layout, calls_each=quoted))
    with pytest.raises(xtml.OptionError, match="an array's call is read as a JSON object"):
        t.completion_grammar(bare_request({}), vocab(KIND))


def test_requests_the_format_cannot_hold_are_refused() -> None:
    v = vocab(KIND)
    base = {"messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(xtml.OptionError, match="declares no tools"):
        MISTRAL.completion_grammar({**base, "tool_choice": "required"}, v)
    with pytest.raises(xtml.OptionError, match="names 'nope'"):
        MISTRAL.completion_grammar({**base, "tools": [json.loads(json.dumps(bare_request({})["tools"][0]))],
                                    "tool_choice": {"type": "function", "function": {"name": "nope"}}}, v)
    with pytest.raises(xtml.TokenizerError, match="pass the tokenizer"):
        MISTRAL.completion_grammar({**base, "tools": bare_request({})["tools"]}, format="gbnf")
    # Without a tokenizer llguidance names the tokens it can: "</s>", not
    # "[TOOL_CALLS]", which an answer with calls holds.
    with pytest.raises(xtml.TokenizerError, match=r"'\[TOOL_CALLS\]' cannot be referenced by name"):
        MISTRAL.completion_grammar({**base, "tools": bare_request({})["tools"]})
    assert "</s>" in MISTRAL.completion_grammar({**base, "tools": bare_request({})["tools"], "tool_choice": "none"})
