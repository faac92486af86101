"""The completion grammar's tests share these: the test vocabulary, the
real llguidance tokenizer under both end-of-sequence conventions, and
completions as segments with their ids, to say where a matcher refuses."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import llguidance

import xtml
from tests.helpers.tokenizers import deepseek_path
from xtml import testing as xt
from xtml.markup.segments import Segment

K3 = xtml.load("kimi-k3")
BASE = xtml.load("xtml-base")


@cache
def vocab() -> xtml.Vocabulary:
    """The deepseek tokenizer with the K3 and xtml-base markers as special tokens."""
    return xtml.load_tokenizer(deepseek_path(), add_special_tokens=(*K3.markers.all(), *BASE.markers.all()))


@cache
def lltok() -> llguidance.LLTokenizer:
    """llguidance's tokenizer of :func:`vocab` (built once: about two seconds),
    its end of sequence the K3 end marker, as an engine serving K3 sets it."""
    end = K3.bind(vocab()).marker_ids[K3.markers.end]
    return llguidance.LLTokenizer(vocab().tokenizer.to_str(), eos_token=end)


@cache
def lltok_own_eos() -> llguidance.LLTokenizer:
    """llguidance's tokenizer of :func:`vocab` with an end of sequence of its
    own (the xtml-base end marker, which no K3 grammar names), as an engine
    whose model stops on a token other than the end marker sets it."""
    return llguidance.LLTokenizer(vocab().tokenizer.to_str(), eos_token=own_eos())


def own_eos() -> int:
    return BASE.bind(vocab()).marker_ids[BASE.markers.end]


def matcher(grammar: str, tokenizer: llguidance.LLTokenizer | None = None) -> llguidance.LLMatcher:
    m = llguidance.LLMatcher(tokenizer or lltok(), grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def accepts(grammar: str, ids: list[int]) -> None:
    """The matcher takes every id, one at a time, and accepts at the end."""
    m = matcher(grammar)
    for k, t in enumerate(ids):
        assert m.consume_token(t), f"refused token {k} of {len(ids)} ({vocab().decode([t])!r}): {m.get_error()}"
    assert m.is_accepting(), "the grammar does not accept the end of the completion"


def refused_at(grammar: str, ids: list[int]) -> int:
    """How many ids the matcher takes before it refuses one."""
    m = matcher(grammar)
    n = m.try_consume_tokens(ids)
    assert n < len(ids), "the grammar took the whole bad completion"
    return n


# -- completions as segments -----------------------------------------------------------


@dataclass
class Piece:
    seg: Segment
    ids: list[int]


def pieces(tpl: xtml.Template, history: dict[str, Any], message: dict[str, Any]) -> list[Piece]:
    """The completion of ``message`` after ``history``'s generation prompt,
    segment by segment with each segment's ids (which xtml.testing's
    completion_case checks against the ids of a whole render)."""
    drop = ("tool_choice", "response_format", "parallel_tool_calls")
    base = {k: v for k, v in history.items() if k not in drop}
    whole = {**base, "messages": [*base["messages"], message]}
    segs = tpl.render(whole, add_generation_prompt=False).segments
    prefix = tpl.render(base, add_generation_prompt=True).segments
    assert segs[: len(prefix)] == prefix
    b = tpl.bind(vocab())
    out = [Piece(s, b.encode_segments([s])) for s in segs[len(prefix):]]
    case = xt.completion_case(tpl, whole, vocab())
    assert case is not None and [i for p in out for i in p.ids] == case[0]
    return out


def ids_of(ps: list[Piece]) -> list[int]:
    return [i for p in ps for i in p.ids]


def piece(tpl: xtml.Template, text: str, special: bool = False) -> Piece:
    s = Segment(text, special)
    return Piece(s, tpl.bind(vocab()).encode_segments([s]))


def offset(ps: list[Piece], k: int) -> int:
    return sum(len(p.ids) for p in ps[:k])


def lcp(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def departure(ps: list[Piece], k: int, alternatives: list[str]) -> int:
    """The token where the text of piece ``k`` leaves every alternative (the
    strings a good completion may have there, up to the next piece): the one
    holding the first byte past the longest common prefix, or the next
    piece's first token when the text is a prefix of an alternative."""
    text = ps[k].seg.text
    assert text not in alternatives, "the change is not a departure"
    d = len(text[: max(lcp(text, a) for a in alternatives)].encode("utf-8")) if alternatives else 0
    table = vocab().byte_table()
    n = 0
    for j, t in enumerate(ps[k].ids):
        n += len(table[t])
        if n > d:
            return offset(ps, k) + j
    return offset(ps, k + 1)


def find(ps: list[Piece], pattern: list[str | None], nth: int = 0, start: int = 0) -> int:
    """Index of the ``nth`` run of pieces (from ``start``) whose texts match
    ``pattern`` (None matches any)."""
    hits = 0
    for k in range(start, len(ps) - len(pattern) + 1):
        if all(want is None or ps[k + j].seg.text == want for j, want in enumerate(pattern)):
            if hits == nth:
                return k
            hits += 1
    raise AssertionError(f"no run {pattern} number {nth}")
