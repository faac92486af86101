"""What the layout dialects' completion grammar tests share: the
vocabularies (byte-level ones with the format's tokens, and SmolLM2's own),
llguidance's tokenizers of them, the tables a random walk reads, and
assistant answers to a request with whether its grammar takes them."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import llguidance

import xtml
from tests.helpers.families import smollm2_gguf
from xtml.vocab.vocabulary import byte_vocabulary

__all__ = ["ANSWER", "ANSWERS", "BUDGET", "KIMI", "MAX_STEPS", "QWEN3", "SMOLLM2", "TIME", "WEATHER", "answer_ids",
           "enders", "kimi_answers", "lltok", "numerals", "takes", "texts", "vocab"]

QWEN3: Any = xtml.load("qwen3")
SMOLLM2: Any = xtml.load("smollm2")
KIMI: dict[str, Any] = {name: xtml.load(name) for name in ("kimi-k2", "kimi-k2-thinking")}
"""The formats with calls in a section and ids of their own spelling."""
BUDGET = 120
"""Steps a walk takes at random before it prefers ending tokens."""
MAX_STEPS = 3000
ENDING = set('"}]')
NUMERIC = re.compile(r"[0-9eE+.-]+")


@cache
def vocab(kind: str) -> xtml.Vocabulary:
    """``qwen3``: every token of Qwen3's format one id; ``chatml``: only the
    ChatML tokens (SmolLM2's), so Qwen3's added tokens are text; ``gguf``:
    SmolLM2's own vocabulary; a Kimi format's name: every token of that
    format one id."""
    if kind == "gguf":
        return xtml.load_tokenizer(smollm2_gguf())
    if kind in KIMI:
        return byte_vocabulary(KIMI[kind].layout.tokens)
    return byte_vocabulary(QWEN3.layout.tokens if kind == "qwen3" else SMOLLM2.layout.tokens)


@cache
def lltok(kind: str) -> llguidance.LLTokenizer:
    v = vocab(kind)
    return llguidance.LLTokenizer(v.tokenizer.to_str(), eos_token=v.special_id("<|im_end|>"))


@cache
def enders(kind: str) -> frozenset[int]:
    v = vocab(kind)
    out = set(v.special_ids())
    for i in range(v.tokenizer.get_vocab_size()):
        s = v.decode([i])
        if len(s) == 1 and s in ENDING:
            out.add(i)
    return frozenset(out)


@cache
def numerals(kind: str) -> frozenset[int]:
    v = vocab(kind)
    special = v.special_ids()
    return frozenset(i for i in range(v.tokenizer.get_vocab_size())
                     if i not in special and NUMERIC.fullmatch(v.decode([i])))


@cache
def texts(v: xtml.Vocabulary) -> list[str]:
    """Each id's text."""
    return [v.decode([i]) for i in range(v.tokenizer.get_vocab_size())]


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "units": {"enum": ["c", "f"]}},
    "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "number"}},
          "required": ["answer"], "additionalProperties": False}


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": args}}


PARIS = _call("get_weather", {"city": "Paris", "days": 3})
NOW = _call("get_time", {})
# (request options, the assistant's answer, whether the grammar takes it)
ANSWERS: list[tuple[dict[str, Any], dict[str, Any], bool]] = [
    ({}, {"content": "It is sunny."}, True),
    ({}, {"content": "Let me look.", "tool_calls": [PARIS]}, True),
    ({}, {"content": "", "tool_calls": [PARIS, NOW]}, True),
    ({}, {"content": "Sunny.", "reasoning_content": "The user asks.\nThink."}, True),
    ({}, {"content": "", "reasoning_content": "Call it.", "tool_calls": [PARIS]}, True),
    ({"enable_thinking": False}, {"content": "Sunny."}, True),
    ({"enable_thinking": False}, {"content": "Sunny.", "reasoning_content": "no block here"}, False),
    ({"tool_choice": "required"}, {"content": "", "tool_calls": [PARIS]}, True),
    ({"tool_choice": "required"}, {"content": "", "reasoning_content": "Call.", "tool_calls": [NOW, PARIS]}, True),
    ({"tool_choice": "required"}, {"content": "It is sunny."}, False),
    ({"tool_choice": "required"}, {"content": "Let me look.", "tool_calls": [PARIS]}, False),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     {"content": "", "tool_calls": [NOW]}, True),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     {"content": "", "tool_calls": [PARIS]}, False),
    ({"tool_choice": "none"}, {"content": "It is sunny."}, True),
    ({"tool_choice": "none"}, {"content": "", "tool_calls": [PARIS]}, False),
    ({"parallel_tool_calls": False}, {"content": "", "tool_calls": [PARIS]}, True),
    ({"parallel_tool_calls": False}, {"content": "", "tool_calls": [PARIS, NOW]}, False),
    ({}, {"content": "", "tool_calls": [_call("get_weather", {"town": "Paris"})]}, False),
    ({}, {"content": "", "tool_calls": [_call("get_weather", {"city": 7})]}, False),
    ({}, {"content": "", "tool_calls": [_call("search", {})]}, False),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}},
     {"content": '{"answer": "sunny", "score": 0.5}'}, True),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}},
     {"content": '{"score": 0.5}'}, False),
    ({"response_format": {"type": "json_object"}}, {"content": "sunny"}, False),
    ({"response_format": {"type": "json_object"}, "tool_choice": "none"}, {"content": '{"a": [1, 2]}'}, True),
]


def _with_ids(answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` with each call's id spelled as the Kimi formats spell one
    (Kimi K2 Thinking writes the ids the request gives)."""
    calls = answer.get("tool_calls")
    if not calls:
        return answer
    return {**answer, "tool_calls": [{**c, "id": f"functions.{c['function']['name']}:{j}"}
                                     for j, c in enumerate(calls)]}


def kimi_answers() -> list[tuple[dict[str, Any], dict[str, Any], bool]]:
    """:data:`ANSWERS` as the Kimi formats hold them: no ``enable_thinking``
    option (the block is on every answer), calls with ids."""
    return [(extra, _with_ids(answer), good) for extra, answer, good in ANSWERS if "enable_thinking" not in extra]


def answer_ids(tpl: xtml.Template, request: dict[str, Any], answer: dict[str, Any],
                v: xtml.Vocabulary) -> list[int]:
    """The ids of ``answer`` as the format renders it after the request's
    generation prompt, its stop token included."""
    base = {k: x for k, x in request.items() if k not in ("tool_choice", "response_format", "parallel_tool_calls")}
    whole = tpl.encode({**base, "messages": [*base["messages"], {"role": "assistant", **answer}]}, v,
                       add_generation_prompt=False)
    prompt = tpl.encode(base, v)
    # The frame's opening, then what the prompt adds to it (a closed
    # reasoning block): an answer that writes another block keeps it.
    opening = tpl.encode({**base, "enable_thinking": True}, v) if "enable_thinking" in base else prompt
    assert whole[:len(opening)] == opening
    out = whole[len(opening):]
    extra = prompt[len(opening):]
    if out[:len(extra)] == extra:
        out = out[len(extra):]
    # The frame's close ends with a newline after the stop token.
    stop = v.special_id("<|im_end|>")
    assert stop is not None
    return out[:out.index(stop) + 1]


def takes(grammar: str, kind: str, ids: list[int]) -> bool:
    m = llguidance.LLMatcher(lltok(kind), grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m.try_consume_tokens(ids) == len(ids) and (m.is_accepting() or m.is_stopped())
