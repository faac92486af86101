"""What the layout dialects' completion grammar tests share: the
vocabularies (byte-level ones with the format's tokens, and SmolLM2's own),
llguidance's tokenizers of them, the tables a random walk reads, and
assistant answers to a request with whether its grammar takes them."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import llguidance

import xtml
from tests.helpers.families import smollm2_gguf
from tests.helpers.tokenizers import deepseek_path
from xtml.vocab.vocabulary import byte_vocabulary

__all__ = [
    "AFTER_TOOL",
    "ANSWER",
    "ANSWERS",
    "BARE",
    "BARE_ANSWERS",
    "BUDGET",
    "GEMMA",
    "GLM",
    "GLM_ANSWERS",
    "GPTOSS",
    "KIMI",
    "MAX_STEPS",
    "MISTRAL",
    "QWEN3",
    "SMOLLM2",
    "STOP",
    "TIME",
    "WEATHER",
    "answer_ids",
    "bare_request",
    "enders",
    "glm_answer_ids",
    "kimi_answers",
    "lltok",
    "numerals",
    "takes",
    "texts",
    "token_ids",
    "vocab",
]

QWEN3: Any = xtml.load("qwen3")
SMOLLM2: Any = xtml.load("smollm2")
KIMI: dict[str, Any] = {name: xtml.load(name) for name in ("kimi-k2", "kimi-k2-thinking")}
"""The formats with calls in a section and ids of their own spelling."""
BARE: dict[str, Any] = {name: xtml.load(name) for name in ("llama-3.1", "deepseek-v3.1")}
"""Llama 3.1 (bare JSON calls, built-in calls, a stop that waits for
results) and DeepSeek V3.1 (reasoning the prompt opens, string arguments)."""
GLM: Any = xtml.load("glm-4.6")
"""GLM-4.6: calls of key/value pairs, a reasoning block the model opens
after a newline, content after one, ``<|observation|>`` after calls."""
MISTRAL_FILE = Path(xtml.__file__).resolve().parent / "dialects" / "mistral-small-3.1.toml"
MISTRAL: Any = xtml.load(str(MISTRAL_FILE))
"""Mistral Small 3.1: calls as one JSON array after ``[TOOL_CALLS]``, no
token closing a call."""
GEMMA_FILE = Path(xtml.__file__).resolve().parent / "dialects" / "gemma-4.toml"
GEMMA: Any = xtml.load(str(GEMMA_FILE))
"""Gemma 4: calls ``<|tool_call>call:NAME{ARGS}<tool_call|>`` with ARGS in
its key:value syntax, ``<|tool_response>`` after them."""
GPTOSS_FILE = Path(xtml.__file__).resolve().parent / "dialects" / "gpt-oss.toml"
GPTOSS: Any = xtml.load(str(GPTOSS_FILE))
"""gpt-oss (harmony): an answer as several messages, each closed by its own
token; one call a message."""
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
    if kind == "deepseek":
        return xtml.load_tokenizer(deepseek_path())
    if kind in KIMI:
        return byte_vocabulary(KIMI[kind].layout.tokens)
    if kind in BARE:
        return byte_vocabulary(BARE[kind].layout.tokens)
    if kind == "glm-4.6":
        return byte_vocabulary(GLM.layout.tokens)
    if kind == MISTRAL.name:
        return byte_vocabulary(MISTRAL.layout.tokens)
    if kind == GEMMA.name:
        return byte_vocabulary(GEMMA.layout.tokens)
    if kind == GPTOSS.name:
        return byte_vocabulary(GPTOSS.layout.tokens)
    return byte_vocabulary(QWEN3.layout.tokens if kind == "qwen3" else SMOLLM2.layout.tokens)


STOP = {"llama-3.1": "<|eot_id|>", "deepseek-v3.1": "<｜end▁of▁sentence｜>", "deepseek": "<｜end▁of▁sentence｜>",
        "glm-4.6": "<|endoftext|>", MISTRAL.name: "</s>",
        GEMMA.name: "<turn|>", GPTOSS.name: "<|return|>"}
"""The end-of-answer token of a vocabulary kind (ChatML's, but where named)."""


@cache
def lltok(kind: str) -> llguidance.LLTokenizer:
    v = vocab(kind)
    return llguidance.LLTokenizer(v.tokenizer.to_str(), eos_token=v.special_id(STOP.get(kind, "<|im_end|>")))


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


def glm_answer_ids(request: dict[str, Any], answer: dict[str, Any], v: xtml.Vocabulary) -> list[int]:
    """The ids of ``answer`` as GLM-4.6 renders it after the request's
    generation prompt (from the model's first id: the prompt's closed
    reasoning block taken off where the answer starts with it), then the
    stop the model writes: ``<|observation|>`` after calls, else
    ``<|user|>``."""
    base = {k: x for k, x in request.items() if k not in ("tool_choice", "response_format", "parallel_tool_calls")}
    whole = GLM.encode({**base, "messages": [*base["messages"], {"role": "assistant", **answer}]}, v,
                       add_generation_prompt=False)
    prompt = GLM.encode(base, v)
    opened = GLM.bind(v).token_ids["<|assistant|>"]
    opening = prompt[:len(prompt) - prompt[::-1].index(opened)]
    assert whole[:len(opening)] == opening
    out = whole[len(opening):]
    extra = prompt[len(opening):]
    if out[:len(extra)] == extra:
        out = out[len(extra):]
    stop = v.special_id("<|observation|>" if answer.get("tool_calls") else "<|user|>")
    assert stop is not None
    return [*out, stop]


def takes(grammar: str, kind: str, ids: list[int]) -> bool:
    m = llguidance.LLMatcher(lltok(kind), grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m.try_consume_tokens(ids) == len(ids) and (m.is_accepting() or m.is_stopped())


def token_ids(tpl: Any, v: xtml.Vocabulary, text: str) -> list[int]:
    """``text`` with each token of the format spelled in it as its id."""
    ids = tpl.bind(v).token_ids
    out: list[int] = []
    pos = 0
    for m in tpl.layout.finder().finditer(text):
        out += v.ids_of([text[pos:m.start()]])[0] if m.start() > pos else []
        out.append(ids[m.group()])
        pos = m.end()
    return out + (v.ids_of([text[pos:]])[0] if pos < len(text) else [])


_EOS = "<｜end▁of▁sentence｜>"
_SECTION = "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>"
_PARIS_DS = '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 3}<｜tool▁call▁end｜>'
_NOW_DS = "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
AFTER_TOOL = [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
              {"role": "tool", "content": "sunny"}]
_RF = {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}}
# (request options, the answer as text with the format's tokens spelled,
# whether the grammar takes it), after a user's question with WEATHER and
# TIME declared.
BARE_ANSWERS: dict[str, list[tuple[dict[str, Any], str, bool]]] = {
    "llama-3.1": [
        ({}, "It is sunny.<|eot_id|>", True),
        # A stop that waits for tool results ends calls only.
        ({}, "It is sunny.<|eom_id|>", False),
        ({}, '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}<|eom_id|>', True),
        ({}, '{"name": "get_time", "parameters": {}}<|eot_id|>', True),
        ({}, '{"name": "get_time", "parameters": {}}\n<|eom_id|>', False),
        ({}, '{"name": "search", "parameters": {}}<|eom_id|>', False),
        ({}, '{"name": "get_weather", "parameters": {"town": "Paris"}}<|eom_id|>', False),
        # Text that a parse would read as a call.
        ({"tool_choice": "none"}, '{"name": "get_time", "parameters": {}}<|eot_id|>', False),
        ({"tool_choice": "none"}, 'Say {"name": "get_time", "parameters": {}}<|eot_id|>', False),
        ({}, ' {"a": 1}\n<|eot_id|>', False),
        ({"tool_choice": "required"}, "It is sunny.<|eot_id|>", False),
        ({"tool_choice": "required"}, '{"name": "get_time", "parameters": {}}<|eot_id|>', True),
        ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
         '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>', False),
        ({"builtin_tools": ["brave_search"]}, '<|python_tag|>brave_search.call(query="weather in Paris")<|eom_id|>',
         True),
        ({"builtin_tools": ["brave_search", "wolfram_alpha"]}, "<|python_tag|>wolfram_alpha.call()<|eom_id|>", True),
        ({}, '<|python_tag|>brave_search.call(query="x")<|eom_id|>', False),
        ({"builtin_tools": ["brave_search"]}, '<|python_tag|>brave_search.call(query="a", n="2")<|eom_id|>', False),
        ({"builtin_tools": ["brave_search"], "tool_choice": "none"},
         '<|python_tag|>brave_search.call(query="x")<|eom_id|>', False),
        (_RF, '{"answer": "sunny", "score": 0.5}<|eot_id|>', True),
        (_RF, '{"score": 0.5}<|eot_id|>', False),
    ],
    "deepseek-v3.1": [
        ({"thinking": True}, f"The user asks.</think>It is sunny.{_EOS}", True),
        # The prompt opened the block: the answer closes it.
        ({"thinking": True}, f"It is sunny.{_EOS}", False),
        ({}, f"It is sunny.{_EOS}", True),
        ({}, f"Hm.</think>It is sunny.{_EOS}", False),
        ({}, _SECTION.format(_PARIS_DS) + _EOS, True),
        ({}, "Let me look." + _SECTION.format(_PARIS_DS + _NOW_DS) + _EOS, True),
        ({"parallel_tool_calls": False}, _SECTION.format(_PARIS_DS + _NOW_DS) + _EOS, False),
        ({"tool_choice": "required"}, "Let me look." + _SECTION.format(_PARIS_DS) + _EOS, False),
        ({"tool_choice": "required", "thinking": True}, "Call it.</think>" + _SECTION.format(_NOW_DS) + _EOS, True),
        ({"tool_choice": "none"}, _SECTION.format(_NOW_DS) + _EOS, False),
        ({}, _SECTION.format(_NOW_DS.replace("get_time", "search")) + _EOS, False),
        ({}, _SECTION.format(_PARIS_DS) + "Done." + _EOS, False),
        # After a tool result the format writes no prompt: no block.
        ({"messages": AFTER_TOOL, "thinking": True}, f"It is sunny.{_EOS}", True),
        ({"messages": AFTER_TOOL, "thinking": True}, f"Sunny.</think>It is sunny.{_EOS}", False),
        (_RF, '{"answer": "sunny", "score": 0.5}' + _EOS, True),
        (_RF, "sunny" + _EOS, False),
    ],
}


_CITY = "<arg_key>city</arg_key>\n<arg_value>{}</arg_value>\n"
_DAYS = "<arg_key>days</arg_key>\n<arg_value>{}</arg_value>\n"
_PARIS_GLM = "\n<tool_call>get_weather\n" + _CITY.format("Paris") + _DAYS.format(3) + "</tool_call>"
_NOW_GLM = "\n<tool_call>get_time\n</tool_call>"
_OFF = {"enable_thinking": False}
# (request options, the answer as text with the format's tokens spelled,
# whether the grammar takes it), after a user's question with WEATHER and
# TIME declared.
GLM_ANSWERS: list[tuple[dict[str, Any], str, bool]] = [
    ({}, "\n<think>Easy.</think>\nIt is sunny.<|user|>", True),
    ({}, "\n<think></think>\nIt is sunny.<|endoftext|>", True),
    # The model opens the block, after its newline, on every answer.
    ({}, "\nIt is sunny.<|user|>", False),
    ({}, "<think></think>\nIt is sunny.<|user|>", False),
    # Thinking off: the prompt closed it.
    (_OFF, "\nIt is sunny.<|user|>", True),
    (_OFF, "\n<think>Hm.</think>\nIt is sunny.<|user|>", False),
    (_OFF, "It is sunny.<|user|>", False),
    # Calls wait for their results; content ends the answer.
    (_OFF, _PARIS_GLM + "<|observation|>", True),
    (_OFF, _PARIS_GLM + "<|user|>", False),
    (_OFF, "\nIt is sunny.<|observation|>", False),
    (_OFF, "\nLet me look.\n" + _PARIS_GLM[1:] + _NOW_GLM + "<|observation|>", True),
    (_OFF, "\nLet me look." + _PARIS_GLM[1:] + "<|observation|>", False),
    ({}, "\n<think>Call.</think>" + _NOW_GLM + "<|observation|>", True),
    # Keys in any order, each once, the required ones present.
    (_OFF, "\n<tool_call>get_weather\n" + _DAYS.format(3) + _CITY.format("Paris") + "</tool_call><|observation|>",
     True),
    (_OFF, "\n<tool_call>get_weather\n" + _CITY.format("a") + _CITY.format("b") + "</tool_call><|observation|>",
     False),
    (_OFF, "\n<tool_call>get_weather\n" + _DAYS.format(3) + "</tool_call><|observation|>", False),
    (_OFF, "\n<tool_call>get_weather\n<arg_key>town</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
     "<|observation|>", False),
    (_OFF, "\n<tool_call>get_weather\n" + _CITY.format("Paris") + _DAYS.format("three") + "</tool_call>"
     "<|observation|>", False),
    (_OFF, "\n<tool_call>get_weather\n" + _CITY.format(" Paris, \"FR\"\n") + "<arg_key>units</arg_key>\n"
     "<arg_value>f</arg_value>\n</tool_call><|observation|>", True),
    (_OFF, "\n<tool_call>get_weather\n" + _CITY.format("Paris") + "<arg_key>units</arg_key>\n"
     "<arg_value>k</arg_value>\n</tool_call><|observation|>", False),
    (_OFF, "\n<tool_call>search\n</tool_call><|observation|>", False),
    ({**_OFF, "tool_choice": "required"}, "\nLet me look." + _NOW_GLM + "<|observation|>", False),
    ({**_OFF, "tool_choice": "required"}, _NOW_GLM + "<|observation|>", True),
    ({**_OFF, "tool_choice": "none"}, _NOW_GLM + "<|observation|>", False),
    ({**_OFF, "parallel_tool_calls": False}, _NOW_GLM + _NOW_GLM + "<|observation|>", False),
    ({**_OFF, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, _PARIS_GLM + "<|observation|>",
     False),
    ({**_OFF, **_RF}, '\n{"answer": "sunny", "score": 0.5}<|user|>', True),
    ({**_OFF, **_RF}, '\n{"answer": "sunny"}' + _NOW_GLM + "<|observation|>", True),
    ({**_OFF, **_RF}, "\nsunny<|user|>", False),
]


def bare_request(extra: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER, TIME], **extra}
