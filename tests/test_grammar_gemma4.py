"""The completion grammar of Gemma 4.

An answer is, with thinking on, maybe a reasoning block ``<|channel>
thought\\n`` … ``<channel|>`` first; then content (free text) and
``<turn|>``; or maybe content, then one or more calls
``<|tool_call>call:NAME{ARGS}<tool_call|>`` with nothing between them,
then ``<|tool_response>`` (the model waits for their results). ARGS are
in Gemma's key:value syntax, written by the value syntax's own grammar
against the tool's schema, its string quotes the ``<|"|>`` token.

In every format: llguidance's Lark, GBNF, xgrammar's EBNF and its
structural tag, the arguments' rules written by the value syntax in each.

Soundness by sampling: random walks under each format's own matcher
(llguidance for its grammar and for the GBNF one, xgrammar for its EBNF
and its structural tag) read by the answer's contract (a reader written
apart from the dialect's parse) and by the dialect's strict completion
parse, the same, to calls whose arguments validate and that hold the
request (tool_choice, parallel_tool_calls, response_format,
enable_thinking). Completeness: every rendered answer the request allows
is taken, and the answers it does not allow refused.
"""

from __future__ import annotations

from typing import Any

import pytest

import xtml
from tests.helpers.gemma_grammar import (
    ANSWERS,
    KIND,
    TEMPLATE,
    answer_texts,
    check,
    drawn,
    gbnf_lark,
    gemma_read,
    llguidance_walk,
    xgrammar_takes,
    xgrammar_walks,
)
from tests.helpers.layout_grammar import bare_request, takes, token_ids, vocab
from xtml.plugins.gemma_values import GemmaValues

WALKED = 200
"""Walks per format: one per drawn request."""
REFS = {"llguidance": "<[{}]>", "gbnf": "<[{}]>", "xgrammar": "Token({})", "xgrammar-tag": "Token({})"}
"""How each format references a token by id."""


def _parser(case_tools: Any) -> Any:
    def parse(ids: list[int]) -> dict[str, Any]:
        return TEMPLATE.parse(ids, vocab(KIND), completion=True, tools=case_tools)  # type: ignore[no-any-return]
    return parse


@pytest.mark.parametrize("fmt", ["llguidance", "gbnf"])
def test_sampled_completions_read_by_the_contract_and_hold_the_request(fmt: str) -> None:
    batch = drawn(WALKED)
    for case, seed in batch:
        check(case, llguidance_walk(case, seed, fmt), _parser(case.request.get("tools")), fmt)
    assert len(batch) == WALKED


@pytest.mark.engines
def test_completions_xgrammar_samples_read_by_the_contract_and_hold_the_request() -> None:
    batch = drawn(WALKED)
    for fmt in ("xgrammar", "xgrammar-tag"):
        version, walks = xgrammar_walks(batch, fmt)
        assert len(walks) == WALKED
        for (case, _), ids in zip(batch, walks, strict=True):
            try:
                check(case, ids, _parser(case.request.get("tools")), fmt)
            except AssertionError as e:
                raise AssertionError(f"xgrammar {version}, {fmt}: {e}") from None


@pytest.mark.parametrize(("extra", "text", "good"), answer_texts())
@pytest.mark.parametrize("fmt", ["llguidance", "gbnf"])
def test_rendered_answers_are_taken_and_others_refused(extra: dict[str, Any], text: str, good: bool,
                                                       fmt: str) -> None:
    v = vocab(KIND)
    request = bare_request(extra)
    ids = token_ids(TEMPLATE, v, text)
    g = TEMPLATE.completion_grammar(request, v, format=fmt)
    assert takes(gbnf_lark(g) if fmt == "gbnf" else g, KIND, ids) == good, text
    if good:
        tools = request["tools"]
        assert _parser(tools)(ids) == gemma_read(ids, v, tools)


def test_the_rendered_answers_are_the_formats() -> None:
    texts = answer_texts()
    paris = next(t for (extra, a, _), (_, t, _) in zip(ANSWERS, texts, strict=True)
                 if not isinstance(a, str) and extra == {"tool_choice": "required"})
    assert paris == '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|><|tool_response>'


@pytest.mark.engines
def test_xgrammar_takes_the_rendered_answers_and_refuses_the_others() -> None:
    # xgrammar ends where the engine's stop ids come (both of the format's
    # stops): content that ends with <|tool_response>, which only the
    # grammars holding the stop themselves refuse, is left out.
    answers = [a for a in answer_texts() if a[1] != "It is sunny.<|tool_response>"]
    assert len(answers) == len(ANSWERS) - 1
    for fmt in ("xgrammar", "xgrammar-tag"):
        version, taken = xgrammar_takes(answers, fmt)
        wrong = [(extra, text) for (extra, text, good), got in zip(answers, taken, strict=True) if got != good]
        assert not wrong, f"xgrammar {version}, {fmt}: {wrong}"


@pytest.mark.parametrize("fmt", ["llguidance", "gbnf"])
def test_the_quote_is_the_token(fmt: str) -> None:
    # A string's delimiters are the token; text between them never spells it.
    v = vocab(KIND)
    g = TEMPLATE.completion_grammar(bare_request({"tool_choice": "required"}), v, format=fmt)
    quote = TEMPLATE.bind(v).token_ids['<|"|>']
    assert f"<[{quote}]>" in g
    lark = gbnf_lark(g) if fmt == "gbnf" else g
    spelled = '<|tool_call>call:get_weather{city:<|"|>Pa<|"|>ris<|"|>}<tool_call|><|tool_response>'
    ids = token_ids(TEMPLATE, v, spelled)
    assert not takes(lark, KIND, ids)
    inner = token_ids(TEMPLATE, v, '<|tool_call>call:get_weather{city:<|"|>')
    after = token_ids(TEMPLATE, v, "}<tool_call|><|tool_response>")
    # GBNF keeps every token of the format out by its spelling (llama.cpp
    # matches a grammar's characters against a control token's text).
    for bad in ['Pa<|"|>ris', *(["Pa<turn|>ris"] if fmt == "gbnf" else [])]:
        text = v.ids_of([bad])[0]
        assert quote not in text
        assert not takes(lark, KIND, [*inner, *text, quote, *after]), bad
    assert takes(lark, KIND, [*inner, *v.ids_of(["Pa<|ris"])[0], quote, *after])


@pytest.mark.parametrize("fmt", ["llguidance", "gbnf", "xgrammar", "xgrammar-tag"])
def test_every_format_writes_the_calls(fmt: str) -> None:
    v = vocab(KIND)
    ids = TEMPLATE.bind(v).token_ids
    g = TEMPLATE.completion_grammar(bare_request({}), v, format=fmt)
    assert "template gemma-4" in g and "call:get_weather" in g and "city:" in g
    for t in ('<|"|>', "<|tool_call>", "<tool_call|>"):
        assert REFS[fmt].format(ids[t]) in g, t


@pytest.mark.parametrize("fmt", ["gbnf", "xgrammar", "xgrammar-tag"])
def test_a_format_the_value_syntax_does_not_write_is_refused_by_name(fmt: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # A value syntax that writes only Lark: the grammars it cannot hold calls in are refused by name.
    lark_only = GemmaValues.grammar

    def grammar(self: GemmaValues, schema: Any, syntax: str = "llguidance", rule: str = "arguments",
                tokens: Any = None) -> str:
        if syntax != "llguidance":
            raise self.no_grammar(syntax, ("llguidance",))
        return lark_only(self, schema, syntax, rule, tokens)

    monkeypatch.setattr(GemmaValues, "grammar", grammar)
    v = vocab(KIND)
    with pytest.raises(xtml.OptionError, match=f"writes no {'gbnf' if fmt == 'gbnf' else 'xgrammar'} grammar") as e:
        TEMPLATE.completion_grammar(bare_request({}), v, format=fmt)
    assert e.value.option == "format" and "'gemma'" in str(e.value)
    # Without calls the format is written as for any dialect.
    g = TEMPLATE.completion_grammar(bare_request({"tool_choice": "none"}), v, format=fmt)
    assert "template gemma-4" in g


@pytest.mark.parametrize("fmt", ["llguidance", "gbnf", "xgrammar", "xgrammar-tag"])
def test_a_tool_the_value_syntax_cannot_write_is_left_out(fmt: str) -> None:
    v = vocab(KIND)
    odd = {"type": "function", "function": {"name": "find", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "pattern": "a+"}}}}}
    request = {**bare_request({}), "tools": [*bare_request({})["tools"], odd]}
    g = TEMPLATE.completion_grammar(request, v, format=fmt)
    assert "call:find" not in g and "call:get_time" in g
    assert "tool 'find'" in g and "tools[2].function.parameters.properties.q" in g
    with pytest.raises(xtml.OptionError, match="no declared tool can be called") as e:
        TEMPLATE.completion_grammar({**request, "tool_choice": {"type": "function", "function": {"name": "find"}}},
                                    v, format=fmt)
    assert e.value.option == "tool_choice"


def test_the_reasoning_block_follows_the_prompt() -> None:
    v = vocab(KIND)
    on = TEMPLATE.completion_grammar(bare_request({"enable_thinking": True}), v)
    off = TEMPLATE.completion_grammar(bare_request({}), v)
    assert 'reasoning: ' in on and '"thought\\n"' in on
    assert "reasoning" not in off.split("\n", 2)[2]


def test_a_name_that_holds_where_the_arguments_open_is_left_out() -> None:
    # A parse reads the name up to the first "{".
    odd = {"type": "function", "function": {"name": "a{b", "parameters": {"type": "object"}}}
    request = {**bare_request({}), "tools": [*bare_request({})["tools"], odd]}
    g = TEMPLATE.completion_grammar(request, vocab(KIND))
    assert "call:a{b" not in g and "tool 'a{b': its name holds '{'" in g


def test_without_a_tokenizer_the_tokens_are_named() -> None:
    v = vocab(KIND)
    g = TEMPLATE.completion_grammar(bare_request({}))
    assert '<|"|>' in g and "<|tool_call>" in g
    text = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|><|tool_response>'
    assert takes(g, KIND, token_ids(TEMPLATE, v, text))
