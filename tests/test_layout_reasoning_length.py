"""How many of an answer's ids a layout dialect counts as reasoning
(``Template.reasoning_tokens``, usage's ``reasoning_tokens``): the ids of
the reasoning block the parse reads, and none where the parse reads none."""

from __future__ import annotations

import random

import pytest

import xtml
from xtml.template import LayoutTemplate
from xtml.vocab.vocabulary import byte_vocabulary

# Each dialect: its reasoning block's tokens, its stop token, and whether the
# generation prompt opens the block (text before the close is reasoning).
DIALECTS = {
    "qwen3": ("<think>", "</think>", "<|im_end|>", False),
    "kimi-k2-thinking": ("<think>", "</think>", "<|im_end|>", False),
    "deepseek-v3.1": ("<think>", "</think>", "<｜end▁of▁sentence｜>", True),
    "glm-4.6": ("<think>", "</think>", "<|user|>", False),
}
LEADS = {"glm-4.6"}
"""Dialects that write whitespace before the reasoning block."""


@pytest.mark.parametrize("name", list(DIALECTS))
def test_reasoning_is_counted_where_the_parse_reads_it(name: str) -> None:
    tpl = xtml.load(name)
    assert isinstance(tpl, LayoutTemplate)
    vocab = byte_vocabulary(tpl.layout.tokens)
    opening, closing, stop, opened = DIALECTS[name]

    def count(*pieces: str) -> int:
        return tpl.reasoning_tokens(tpl.completion_ids("".join(pieces), vocab), vocab)

    def n(*pieces: str) -> int:
        return len(tpl.completion_ids("".join(pieces), vocab))

    if opened:
        assert count("a", closing, "b", stop) == n("a", closing)
        # A close after the stop token is not read: no reasoning.
        assert count("a", stop, closing) == 0
        assert count("a", stop) == 0
        assert count("a") == 0
    else:
        assert count(opening, "a", closing, "b", stop) == n(opening, "a", closing)
        # The block does not open the answer: no reasoning, whatever closes it.
        assert count("a", closing, "b", closing, "c", stop) == 0
        assert count("a", opening, "b", closing, stop) == 0
        # Never closed: what comes before the stop token, or all of it.
        assert count(opening, "a", stop, closing) == n(opening, "a")
        assert count(opening, "a") == n(opening, "a")


@pytest.mark.parametrize("name", list(DIALECTS))
def test_any_answer_counts_what_its_parse_reads(name: str) -> None:
    """Random answers: the count is the ids of the block the lenient parse
    reads; reasoning text in the parse means a count, and the ids after the
    count hold none of it."""
    tpl = xtml.load(name)
    assert isinstance(tpl, LayoutTemplate)
    vocab = byte_vocabulary(tpl.layout.tokens)
    opening, closing, stop, opened = DIALECTS[name]
    rng = random.Random(5)
    pieces = [opening, closing, stop, "a", "bc ", "\n", "é"]
    for _ in range(300):
        chosen = [rng.choice(pieces) for _ in range(rng.randint(0, 8))]
        ids = tpl.completion_ids("".join(chosen), vocab)
        got = tpl.reasoning_tokens(ids, vocab)
        # The reference, piece by piece: the text before the first stop; a
        # block opened by the prompt or by the answer's first piece; its
        # close, the first one in that text.
        body = chosen[:chosen.index(stop)] if stop in chosen else chosen
        # Where the format writes whitespace before the block, it opens after it.
        lead = next((k for k, p in enumerate(body) if p.strip()), len(body)) if name in LEADS else 0
        if not opened and body[lead:lead + 1] != [opening]:
            want = 0
        elif closing in body:
            want = n_ids(tpl, vocab, body[:body.index(closing) + 1])
        elif opened:
            want = 0
        else:
            want = n_ids(tpl, vocab, body) if stop in chosen else len(ids)
        assert got == want, chosen
        if tpl.parse(ids, vocab, completion=True, lenient=True).get("reasoning_content"):
            assert got > 0, chosen


def n_ids(tpl: LayoutTemplate, vocab: xtml.Vocabulary, pieces: list[str]) -> int:
    return len(tpl.completion_ids("".join(pieces), vocab))
