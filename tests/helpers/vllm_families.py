"""The answers tests/test_vllm_families.py and bench/bench_vllm_families.py
read through xtml's vLLM parsers and vLLM's own, family by family: each
family's tokenizer (the dialect's tokens added to a byte-level BPE),
generated answers (the last assistant turn of seeded requests, as the
dialect renders it), hostile ones (marker text and tokens in arguments,
cuts inside a call or the reasoning, text around calls, unknown tools,
malformed JSON) with what the model meant, and the count of what a parser
lost against it."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import xtml
from tests.helpers.families import chatml_requests
from tests.helpers.family_requests import family_requests
from tests.helpers.tokenizers import deepseek_path
from tests.helpers.vllm import as_json, parsed_message
from xtml.template import LayoutTemplate

N_GENERATED = 24


@dataclass(frozen=True)
class Family:
    """How one family's answers are spelled, for the hostile ones."""

    name: str
    vllm: str
    """vLLM's own parsers for it: ``tool+reasoning``."""
    call: Callable[[str, str, int], str]
    """One call's text: name, arguments' JSON text, its index."""
    section: str
    """The calls' section, ``%s`` the calls (``%s`` alone: none)."""
    end: str
    marker: str
    """A token of the format that is not a stop: the one a call's arguments
    are ended by, where the format has one."""
    think: tuple[str, str] | None = None
    """How an answer opens and closes its reasoning (the prompt may open it)."""
    bare: bool = False
    """A call is the whole answer, with no marker around it (Llama 3.1's
    JSON): a call between text is text (the JSON an answer shows, say)."""
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def pair(self) -> list[str | None]:
        tool, reasoning = self.vllm.split("+")
        return [tool, None if reasoning == "None" else reasoning]


def _kimi_call(name: str, args: str, k: int) -> str:
    return f"<|tool_call_begin|>functions.{name}:{k}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


def _glm_call(name: str, args: str, k: int) -> str:
    """A GLM-4.6 call: each argument a pair (a string bare, else JSON);
    arguments that are no JSON object are written as they are (malformed)."""
    try:
        value = json.loads(args)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        return f"\n<tool_call>{name}\n{args}</tool_call>"
    pairs = "".join(f"<arg_key>{key}</arg_key>\n<arg_value>{v if isinstance(v, str) else json.dumps(v)}</arg_value>\n"
                    for key, v in value.items())
    return f"\n<tool_call>{name}\n{pairs}</tool_call>"


FAMILIES = [
    Family("llama-3.1", "llama3_json+None", lambda n, a, k: f'{{"name": "{n}", "parameters": {a}}}', "%s",
           "<|eot_id|>", "<|python_tag|>", bare=True),
    Family("deepseek-v3.1", "deepseek_v31+deepseek_v3",
           lambda n, a, k: f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{a}<｜tool▁call▁end｜>",
           "<｜tool▁calls▁begin｜>%s<｜tool▁calls▁end｜>", "<｜end▁of▁sentence｜>", "<｜tool▁call▁end｜>",
           think=("", "</think>"), options={"thinking": True}),
    Family("kimi-k2", "kimi_k2+None", _kimi_call, "<|tool_calls_section_begin|>%s<|tool_calls_section_end|>",
           "<|im_end|>", "<|tool_call_end|>"),
    Family("kimi-k2-thinking", "kimi_k2+kimi_k2", _kimi_call,
           "<|tool_calls_section_begin|>%s<|tool_calls_section_end|>", "<|im_end|>", "<|tool_call_end|>",
           think=("<think>", "</think>")),
    Family("glm-4.6", "glm45+glm45", _glm_call, "%s", "<|user|>", "</arg_value>", think=("\n<think>", "</think>"),
           options={"enable_thinking": True}),
]
# Qwen3 beside vLLM's hermes and qwen3 parsers: tests/test_vllm_layout.py
# holds it on answers of its own; the bench reads it as it reads the others.
QWEN3 = Family("qwen3", "hermes+qwen3",
               lambda n, a, k: ("\n" if k else "") + f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>',
               "%s", "<|im_end|>", "</tool_call>", think=("<think>\n", "\n</think>\n\n"),
               options={"enable_thinking": True})
BY_NAME = {f.name: f for f in [*FAMILIES, QWEN3]}


def tpl(name: str) -> LayoutTemplate:
    t = xtml.load(name)
    assert isinstance(t, LayoutTemplate)
    return t


@cache
def tokenizer_json(name: str) -> str:
    """A byte-level BPE vocabulary with the dialect's tokens as its model's
    tokenizer has them: the special ones special, the added ones added (one
    id each, not special)."""
    from tokenizers import AddedToken, Tokenizer

    d = tpl(name).layout
    tok = Tokenizer.from_file(deepseek_path())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in d.special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in d.added])
    return str(tok.to_str())


@cache
def vocab(name: str) -> xtml.Vocabulary:
    from tokenizers import Tokenizer

    return xtml.Vocabulary(Tokenizer.from_str(tokenizer_json(name)))


@cache
def plain() -> xtml.Vocabulary:
    """The same ids without any format's tokens: what a model spelling a
    marker with ordinary tokens writes."""
    return xtml.load_tokenizer(deepseek_path())


def ids(name: str, text: str) -> list[int]:
    """An answer's ids: each of the format's token strings its id."""
    return tpl(name).completion_ids(text, vocab(name))


def spelled(text: str) -> list[int]:
    """Text in ordinary ids only, a marker string included: a character at
    a time, as the base vocabulary holds some formats' markers (DeepSeek's)
    as tokens of its own."""
    return [i for ch in text for i in plain().ids_of([ch])[0]]


def stops(name: str) -> list[int]:
    return list(tpl(name).bind(vocab(name)).stop_ids)


Case = dict[str, Any]


def _requests(name: str) -> list[dict[str, Any]]:
    """Seeded requests of the family, with their template options."""
    if name != QWEN3.name:
        return family_requests(name, n=120)
    return [{"request": {k: v for k, v in req.items() if k != "enable_thinking"},
             "options": {"enable_thinking": req.get("enable_thinking", True)}}
            for req in chatml_requests(5, 480, roles=("system", "user", "assistant", "tool"), thinking=True)]


@cache
def generated(name: str) -> list[Case]:
    """Answers the official template renders as an assistant turn of the
    family's seeded requests (each the last of the conversation up to it):
    the ids after the prompt of the conversation before it, up to and with
    its last stop id; half with calls where there are enough."""
    t, v = tpl(name), vocab(name)
    end = set(stops(name))
    found: list[Case] = []
    for case, k in ((c, k) for c in _requests(name) for k in range(1, len(c["request"]["messages"]))):
        opts = case["options"]
        msgs = case["request"]["messages"][:k + 1]
        req = {**case["request"], "messages": msgs}
        if msgs[-1]["role"] != "assistant" or all(m["role"] == "system" for m in msgs[:-1]):
            continue
        try:
            whole = t.encode({**req, "add_generation_prompt": False}, v, **opts)
            prompt = t.encode({**req, "messages": msgs[:-1], "add_generation_prompt": True}, v, **opts)
        except xtml.XtmlError:
            continue
        if t.layout.open_turns and whole[:len(prompt)] == prompt and not end.intersection(whole[len(prompt):]):
            # No marker closes the turn: the model ends it with the next
            # turn's token, the results' after calls.
            meaning = "tool_wait" if msgs[-1].get("tool_calls") else "end"
            whole += t.completion_ids(next(k for k, m in t.layout.stops.items() if m == meaning), v)
        if whole[:len(prompt)] != prompt or not end.intersection(whole[len(prompt):]):
            continue  # the last message changes how the history is written
        last = max(k for k, i in enumerate(whole) if i in end)
        found.append({"prompt": prompt, "completion": whole[len(prompt):last + 1], "kwargs": dict(opts)})
    # The few that hold reasoning first, then as many with calls as without.
    thought = [c for c in found if expected(name, c)["reasoning"]][:N_GENERATED // 4]
    rest = [c for c in found if c not in thought]
    with_calls = [c for c in rest if expected(name, c)["tool_calls"]]
    without = [c for c in rest if not expected(name, c)["tool_calls"]]
    half = (N_GENERATED - len(thought)) // 2
    return [*thought, *with_calls[:max(half, N_GENERATED - len(thought) - len(without))],
            *without[:max(half, N_GENERATED - len(thought) - len(with_calls))]][:N_GENERATED]


def meant(content: str = "", calls: list[Any] | tuple[Any, ...] = (), reasoning: str = "") -> dict[str, Any]:
    return {"reasoning": reasoning, "content": content, "tool_calls": list(calls)}


PARIS = ["get_weather", {"city": "Paris"}]


@cache
def hostile(name: str) -> list[tuple[str, Case, dict[str, Any]]]:
    """Answers that break a parser on text, each with what the model meant
    (reasoning, content, calls): a loss is a difference from it. A family
    whose answers open with reasoning opens each with a short one."""
    f, t, v = BY_NAME[name], tpl(name), vocab(name)
    prompt = t.encode({"messages": [{"role": "user", "content": "Weather?"}], "add_generation_prompt": True,
                       **f.options}, v)

    def case(completion: list[int]) -> Case:
        return {"prompt": prompt, "completion": completion, "kwargs": dict(f.options)}

    think = "Hmm." if f.think else ""
    opened = f"{f.think[0]}{think}{f.think[1]}" if f.think else ""

    def say(content: str = "", calls: list[Any] | tuple[Any, ...] = ()) -> dict[str, Any]:
        return meant(content, calls, think)

    def calls(*each: tuple[str, str]) -> str:
        return f.section % "".join(f.call(n, a, k) for k, (n, a) in enumerate(each))

    good = calls(("get_weather", '{"city": "Paris"}'))
    marker_args = {"city": f"a {f.marker} b"}
    head, tail = (opened + calls(("get_weather", '{"city": "a @@ b"}')) + f.end).split("@@")
    cut = opened + "Let me check." + good[:good.index("Paris") + 2]
    out = [
        ("marker text in arguments (ordinary ids)", case([*ids(name, head), *spelled(f.marker), *ids(name, tail)]),
         say(calls=[["get_weather", marker_args]])),
        ("marker token in arguments", case(ids(name, head + f.marker + tail)),
         say(calls=[["get_weather", marker_args]])),
        ("a marker in the content (ordinary ids)",
         case([*ids(name, opened + "I could use "), *spelled(f.marker), *ids(name, " here." + f.end)]),
         say(f"I could use {f.marker} here.")),
        ("truncation inside a call", case(ids(name, cut)), say("Let me check.")),
        ("a call, then text", case(ids(name, opened + good + "\nIt is sunny there." + f.end)),
         say("It is sunny there.", [PARIS])),
        ("text, a call, text", case(ids(name, opened + "Checking.\n" + good + "\nDone." + f.end)),
         say(f"Checking.\n{good}\nDone.") if f.bare else say("Checking.\nDone.", [PARIS])),
        ("an unknown tool", case(ids(name, opened + calls(("launch", '{"n": 1}')) + f.end)),
         say(calls=[["launch", {"n": 1}]])),
        ("malformed JSON", case(ids(name, opened + calls(("get_weather", "{city: Paris}")) + f.end)), say()),
        ("malformed JSON, then a good call",
         case(ids(name, opened + calls(("get_weather", "{city: Oslo}"), ("get_weather", '{"city": "Paris"}'))
                  + f.end)), say(calls=[PARIS])),
        ("two calls", case(ids(name, opened + calls(("get_weather", '{"city": "Paris"}'),
                                                    ("get_weather", '{"city": "Oslo"}')) + f.end)),
         say(calls=[PARIS, ["get_weather", {"city": "Oslo"}]])),
    ]
    if f.think is not None:
        start, close = f.think
        out += [
            ("a marker in the reasoning (ordinary ids)",
             case([*ids(name, start + "I could use "), *spelled(close),
                   *ids(name, f" here{close}It is sunny.{f.end}")]),
             meant("It is sunny.", reasoning=f"I could use {close} here")),
            ("truncation inside the reasoning", case(ids(name, start + "First, the city")),
             meant(reasoning="First, the city")),
        ]
    return out



def expected(name: str, case: Case) -> dict[str, Any]:
    return parsed_message(tpl(name), vocab(name), case["completion"], True)


def shaped(got: dict[str, Any]) -> dict[str, Any]:
    return {"reasoning": got["reasoning"] or "", "content": got["content"] or "",
            "tool_calls": [[name, as_json(args)] for name, args in got["tool_calls"]]}


def whole_answer(message: dict[str, Any]) -> dict[str, Any]:
    """As vLLM 0.33's whole path returns a message: content that is only
    white space beside tool calls is no content."""
    if message["tool_calls"] and not message["content"].strip():
        return {**message, "content": ""}
    return message


def losses(got: dict[str, Any], want: dict[str, Any]) -> int:
    """Calls missing or changed, and text changed, against what was meant."""
    n = int(got["reasoning"].strip() != want["reasoning"].strip())
    n += int(got["content"].strip() != want["content"].strip())
    have = Counter(json.dumps(c, sort_keys=True) for c in got["tool_calls"])
    meant_calls = Counter(json.dumps(c, sort_keys=True) for c in want["tool_calls"])
    return n + sum((meant_calls - have).values()) + sum((have - meant_calls).values())

