"""The answers tests/test_vllm_families.py and bench/bench_vllm_families.py
read through xtml's vLLM parsers and vLLM's own, family by family: each
family's tokenizer (the dialect's tokens added to a byte-level BPE),
generated answers (the last assistant turn of seeded requests, as the
dialect renders it), hostile ones (marker text and tokens in arguments,
cuts inside a call or the reasoning, text around calls, unknown tools,
malformed JSON, a JSON array of calls left unclosed; for harmony the
headers models write slightly malformed) with what the model meant, and the
count of what a parser lost against it. gpt-oss's answers are ids of the
o200k vocabulary with harmony's tokens at their ids, as openai-harmony (which
vLLM reads them with) has them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import xtml
from tests.helpers.families import chatml_requests
from tests.helpers.family_requests import family_requests
from tests.helpers.tokenizers import deepseek_path
from tests.helpers.vllm import as_json, parsed_message
from xtml.template import LayoutTemplate

N_GENERATED = 24
K3 = "kimi-k3"
MISTRAL = "mistral-small-3.1"
GEMMA = "gemma-4"
GPTOSS = "gpt-oss"
_HELD = Path(__file__).resolve().parent.parent / "data" / "families"
# Where xtml.load finds a family's dialect when it is not built in: its
# file, also what XTML_TEMPLATE names to vLLM.
SOURCES = {name: str(_HELD / f"{name}.toml") for name in (MISTRAL, GEMMA, GPTOSS)
           if (_HELD / f"{name}.toml").is_file()}
# harmony's tokens at openai-harmony's ids in the o200k vocabulary; the
# other ids from the first past o200k's ranks up to the last are reserved.
HARMONY_SPECIAL = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>",
                   200003: "<|constrain|>", 200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>",
                   200008: "<|message|>", 200012: "<|call|>", 200018: "<|endofprompt|>"}
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


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
    array: bool = False
    """The calls are one JSON array after the marker (Mistral's): the
    hostile answers add text then calls, and the array left unclosed."""
    options: dict[str, Any] = field(default_factory=dict)
    typed: bool = False
    """Arguments are read against the request's tools (Gemma's values are
    untyped text): a generated answer's request carries its tools."""
    objects: bool = False
    """Generated requests hand the template a call's JSON-text arguments as
    the object they spell, as vLLM's chat path does before the template
    (where the format writes a string otherwise than the object: Gemma's
    ``{S}``, harmony's JSON string)."""
    between: str = "\n"
    """What a reader that loses nothing shows between text written before
    a call and text written after it (the hostile "text, a call, text")."""
    harmony: bool = False
    """vLLM reads the family with openai-harmony (its server chooses the
    HarmonyParser for a gpt-oss model), on o200k ids."""
    markup: bool = False
    """The family is XTML markup (K3): its text lies in channels, so its
    hostile answers are its own (_k3_hostile)."""

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


def _mistral_call(name: str, args: str, k: int) -> str:
    """A Mistral Small 3.1 call: an object of the array, with the id of nine
    characters the template writes."""
    return f'{", " if k else ""}{{"name": "{name}", "arguments": {args}, "id": "call{k:05d}"}}'


def _gemma_value(v: Any) -> str:
    if isinstance(v, str):
        return f'<|"|>{v}<|"|>'
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_gemma_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(map(_gemma_value, v)) + "]"
    return json.dumps(v)


def _gemma_call(name: str, args: str, k: int) -> str:
    """A Gemma 4 call, its arguments in Gemma's key:value syntax; arguments
    that are no JSON object are written with their string never closed
    (a bare word would read as text against a string parameter)."""
    try:
        value = json.loads(args)
    except ValueError:
        value = None
    body = _gemma_value(value) if isinstance(value, dict) else args.replace(": ", ':<|"|>')
    return f"<|tool_call>call:{name}{body}<tool_call|>"


def _harmony_call(name: str, args: str, k: int) -> str:
    """A gpt-oss call as the template writes it (after the prompt's
    ``<|start|>assistant``: its header starts right away)."""
    return f" to=functions.{name}<|channel|>commentary json<|message|>{args}<|call|>"


def _k3_argument(key: str, value: Any) -> str:
    kind = {str: "string", bool: "boolean", int: "number", float: "number", dict: "object",
            list: "array", type(None): "null"}[type(value)]
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return f'<|open|>argument key="{key}" type="{kind}"<|sep|>{text}<|close|>argument<|sep|>'


def _k3_call(name: str, args: str, k: int) -> str:
    """A K3 call as the reference writes it: each argument a typed block,
    arguments that are no JSON object one fallback ``json`` block."""
    try:
        value = json.loads(args)
    except ValueError:
        value = None
    body = ("".join(_k3_argument(key, v) for key, v in value.items()) if isinstance(value, dict)
            else f'<|open|>json type="object"<|sep|>{args}<|close|>json<|sep|>')
    return f'<|open|>call tool="{name}" index="{k + 1}"<|sep|>{body}<|close|>call<|sep|>'


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
    # The template reads the clock: a date keeps the prompt the same.
    Family(MISTRAL, "mistral+None", _mistral_call, "[TOOL_CALLS] [%s]", "</s>", "[TOOL_CALLS]",
           array=True, options={"date": "2025-03-17"}),
    # With thinking on the model opens its reasoning block itself.
    # Content is the text outside the calls, joined: both newlines stay.
    Family(GEMMA, "gemma4+gemma4", _gemma_call, "%s", "<turn|>", "<tool_call|>",
           think=("<|channel>thought\n", "<channel|>"), options={"enable_thinking": True}, typed=True,
           objects=True, between="\n\n"),
    # A call ends the answer (<|call|> is a stop): harmony's hostile answers
    # are its own (_harmony_hostile).
    Family(GPTOSS, "openai+openai_gptoss", _harmony_call, "%s", "<|return|>", "<|call|>",
           options={"date": "2025-03-17"}, harmony=True, objects=True),
]
# Qwen3 beside vLLM's hermes and qwen3 parsers: tests/test_vllm_layout.py
# holds it on answers of its own; the bench reads it as it reads the others.
QWEN3 = Family("qwen3", "hermes+qwen3",
               lambda n, a, k: ("\n" if k else "") + f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>',
               "%s", "<|im_end|>", "</tool_call>", think=("<think>\n", "\n</think>\n\n"),
               options={"enable_thinking": True})
# K3 beside vLLM's kimi_k3 parsers: bench/bench_vllm.py times them; the
# loss count reads its answers as it reads the families'.
KIMI_K3 = Family(K3, "kimi_k3+kimi_k3", _k3_call, "<|open|>tools<|sep|>%s<|close|>tools<|sep|>",
                 "<|close|>message<|sep|><|end_of_msg|>", "<|close|>", think=("", "<|close|>think<|sep|>"),
                 markup=True)
BY_NAME = {f.name: f for f in [*FAMILIES, QWEN3, KIMI_K3]}


def source(name: str) -> str:
    """What ``xtml.load`` (and ``XTML_TEMPLATE``) takes for family ``name``."""
    return SOURCES.get(name, name)


def tpl(name: str) -> LayoutTemplate:
    t = xtml.load(source(name))
    assert isinstance(t, LayoutTemplate)
    return t


def template(name: str) -> xtml.Template:
    """The family's template, K3's included."""
    return xtml.load(source(name))


def o200k_dir() -> Path:
    """The folder holding o200k_base.tiktoken (``XTML_O200K_DIR``; tests/run
    sets it up): the ranks of gpt-oss's vocabulary, which openai-harmony
    reads through ``TIKTOKEN_ENCODINGS_BASE`` (it would download them)."""
    folder = os.environ.get("XTML_O200K_DIR")
    path = Path(folder or ".") / "o200k_base.tiktoken"
    if not folder or not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != O200K_SHA256:
        raise FileNotFoundError(f"no o200k_base.tiktoken of sha256 {O200K_SHA256} in XTML_O200K_DIR={folder}")
    return Path(folder)


@cache
def _o200k() -> Any:
    """o200k as a Hugging Face tokenizer: tiktoken's ranks and split pattern
    (tiktoken reads the ranks from a cache folder it is given)."""
    import tiktoken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = o200k_dir() / "o200k_base.tiktoken"
    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    cached = Path(tempfile.mkdtemp(prefix="xtml-tiktoken-"))
    shutil.copy(ranks, cached / hashlib.sha1(url.encode()).hexdigest())
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cached)
    pattern = tiktoken.get_encoding("o200k_base")._pat_str
    return TikTokenConverter(vocab_file=str(ranks), pattern=pattern).converted()  # type: ignore[no-untyped-call]


@cache
def tokenizer_json(name: str) -> str:
    """A byte-level BPE vocabulary with the dialect's tokens as its model's
    tokenizer has them: the special ones special, the added ones added (one
    id each, not special). gpt-oss's is o200k with harmony's tokens at
    their ids (what openai-harmony decodes)."""
    from tokenizers import AddedToken, Tokenizer

    if BY_NAME[name].harmony:
        tok = Tokenizer.from_str(_o200k().to_str())
        assert tok.get_vocab_size() == min(HARMONY_SPECIAL)
        tok.add_special_tokens([AddedToken(HARMONY_SPECIAL.get(i, f"<|reserved_{i}|>"), special=True,
                                           normalized=False) for i in range(min(HARMONY_SPECIAL), 200019)])
        assert all(tok.token_to_id(t) == i for i, t in HARMONY_SPECIAL.items())
        return str(tok.to_str())
    if BY_NAME[name].markup:
        k3 = xtml.load(K3)
        tok = Tokenizer.from_file(deepseek_path())
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in k3.markers.all()])
        return str(tok.to_str())
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
def plain(name: str = "") -> xtml.Vocabulary:
    """The same ids without any format's tokens: what a model spelling a
    marker with ordinary tokens writes."""
    if name and BY_NAME[name].harmony:
        from tokenizers import Tokenizer

        return xtml.Vocabulary(Tokenizer.from_str(_o200k().to_str()))
    return xtml.load_tokenizer(deepseek_path())


def ids(name: str, text: str) -> list[int]:
    """An answer's ids: each of the format's token strings its id."""
    return template(name).completion_ids(text, vocab(name))


def spelled(text: str, name: str = "") -> list[int]:
    """Text in ordinary ids only, a marker string included: a character at
    a time, as the base vocabulary holds some formats' markers (DeepSeek's)
    as tokens of its own."""
    return [i for ch in text for i in plain(name).ids_of([ch])[0]]


def stops(name: str) -> list[int]:
    return list(template(name).bind(vocab(name)).stop_ids)


Case = dict[str, Any]


def _as_object(call: Any) -> Any:
    """A call whose arguments are JSON text of an object, with the object."""
    args = call.get("function", {}).get("arguments") if isinstance(call, dict) else None
    try:
        value = json.loads(args) if isinstance(args, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        return call
    return {**call, "function": {**call["function"], "arguments": value}}


def _objects(case: dict[str, Any]) -> dict[str, Any]:
    msgs = [{**m, "tool_calls": [_as_object(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m
            for m in case["request"]["messages"]]
    return {**case, "request": {**case["request"], "messages": msgs}}


def _requests(name: str) -> list[dict[str, Any]]:
    """Seeded requests of the family, with their template options (K3's:
    Kimi K2 Thinking's requests, which hold reasoning, calls and results,
    with K3's default options)."""
    if name == K3:
        return [{**c, "options": {}} for c in family_requests("kimi-k2-thinking", n=120)]
    if name != QWEN3.name:
        found = family_requests(name, n=120)
        return [_objects(c) for c in found] if BY_NAME[name].objects else found
    return [{"request": {k: v for k, v in req.items() if k != "enable_thinking"},
             "options": {"enable_thinking": req.get("enable_thinking", True)}}
            for req in chatml_requests(5, 480, roles=("system", "user", "assistant", "tool"), thinking=True)]


@cache
def generated(name: str) -> list[Case]:
    """Answers the official template renders as an assistant turn of the
    family's seeded requests (each the last of the conversation up to it):
    the ids after the prompt of the conversation before it, up to and with
    its last stop id; half with calls where there are enough."""
    t, v = template(name), vocab(name)
    end = set(stops(name))
    open_turns = isinstance(t, LayoutTemplate) and t.layout.open_turns
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
        if open_turns and whole[:len(prompt)] == prompt and not end.intersection(whole[len(prompt):]):
            # No marker closes the turn: the model ends it with the next
            # turn's token, the results' after calls.
            meaning = "tool_wait" if msgs[-1].get("tool_calls") else "end"
            assert isinstance(t, LayoutTemplate)
            whole += t.completion_ids(next(k for k, m in t.layout.stops.items() if m == meaning), v)
        if whole[:len(prompt)] != prompt or not end.intersection(whole[len(prompt):]):
            continue  # the last message changes how the history is written
        last = max(k for k, i in enumerate(whole) if i in end)
        found.append({"prompt": prompt, "completion": whole[len(prompt):last + 1], "kwargs": dict(opts),
                      **({"tools": req["tools"]} if BY_NAME[name].typed and req.get("tools") else {})})
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
    f, t, v = BY_NAME[name], template(name), vocab(name)
    prompt = t.encode({"messages": [{"role": "user", "content": "Weather?"}], "add_generation_prompt": True,
                       **f.options}, v)
    if f.harmony:
        return _harmony_hostile(name, prompt)
    if f.markup:
        return _k3_hostile(name, prompt)

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
        ("marker text in arguments (ordinary ids)",
         case([*ids(name, head), *spelled(f.marker, name), *ids(name, tail)]),
         say(calls=[["get_weather", marker_args]])),
        ("marker token in arguments", case(ids(name, head + f.marker + tail)),
         say(calls=[["get_weather", marker_args]])),
        ("a marker in the content (ordinary ids)",
         case([*ids(name, opened + "I could use "), *spelled(f.marker, name), *ids(name, " here." + f.end)]),
         say(f"I could use {f.marker} here.")),
        ("truncation inside a call", case(ids(name, cut)), say("Let me check.")),
        ("a call, then text", case(ids(name, opened + good + "\nIt is sunny there." + f.end)),
         say("It is sunny there.", [PARIS])),
        ("text, a call, text", case(ids(name, opened + "Checking.\n" + good + "\nDone." + f.end)),
         say(f"Checking.\n{good}\nDone.") if f.bare else say(f"Checking.{f.between}Done.", [PARIS])),
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
    if f.array:
        unclosed = good[:good.rindex("]")]
        out += [
            ("text, then a call", case(ids(name, "Checking." + good + f.end)), say("Checking.", [PARIS])),
            ("the array left unclosed", case(ids(name, unclosed + f.end)), say(calls=[PARIS])),
            ("two calls, the array left unclosed",
             case(ids(name, calls(("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Oslo"}'))[:-1]
                      + f.end)), say(calls=[PARIS, ["get_weather", {"city": "Oslo"}]])),
        ]
    if f.think is not None:
        start, close = f.think
        out += [
            ("a marker in the reasoning (ordinary ids)",
             case([*ids(name, start + "I could use "), *spelled(close, name),
                   *ids(name, f" here{close}It is sunny.{f.end}")]),
             meant("It is sunny.", reasoning=f"I could use {close} here")),
            ("truncation inside the reasoning", case(ids(name, start + "First, the city")),
             meant(reasoning="First, the city")),
        ]
    return out


def _harmony_hostile(name: str, prompt: list[int]) -> list[tuple[str, Case, dict[str, Any]]]:
    """gpt-oss's hostile answers: a call ends an answer (``<|call|>`` is a
    stop), so each holds one; each opens with a short analysis message, as
    gpt-oss answers do; and the headers models write slightly malformed."""
    start, analysis = "<|start|>assistant", "<|channel|>analysis<|message|>Hmm.<|end|>"
    weather = "get_weather"

    def case(completion: list[int]) -> Case:
        return {"prompt": prompt, "completion": completion, "kwargs": dict(BY_NAME[name].options)}

    def say(content: str = "", calls: list[Any] | tuple[Any, ...] = ()) -> dict[str, Any]:
        return meant(content, calls, "Hmm.")

    def called(header: str, args: str = '{"city": "Paris"}') -> Case:
        return case(ids(name, f"{analysis}{start}{header}<|message|>{args}<|call|>"))

    canonical = f" to=functions.{weather}<|channel|>commentary json"
    head = f'{analysis}{start}{canonical}<|message|>{{"city": "a '
    marker_args = {"city": "a <|call|> b"}
    return [
        ("marker text in arguments (ordinary ids)",
         case([*ids(name, head), *spelled("<|call|>", name), *ids(name, ' b"}<|call|>')]),
         say(calls=[[weather, marker_args]])),
        ("marker token in arguments", case(ids(name, head + '<|call|> b"}<|call|>')),
         say(calls=[[weather, marker_args]])),
        ("a marker in the content (ordinary ids)",
         case([*ids(name, f"{analysis}{start}<|channel|>final<|message|>I could use "),
               *spelled("<|return|>", name), *ids(name, " here.<|return|>")]),
         say("I could use <|return|> here.")),
        ("truncation inside a call",
         case(ids(name, f'{analysis}{start}<|channel|>commentary<|message|>Let me check.<|end|>{start}{canonical}'
                        '<|message|>{"city": "Pa')), say("Let me check.")),
        ("a call after a preamble",
         case(ids(name, f'{analysis}{start}<|channel|>commentary<|message|>Checking.<|end|>{start}{canonical}'
                        '<|message|>{"city": "Paris"}<|call|>')), say("Checking.", [PARIS])),
        ("a call after final text",
         case(ids(name, f'{analysis}{start}<|channel|>final<|message|>Checking.<|end|>{start}{canonical}'
                        '<|message|>{"city": "Paris"}<|call|>')), say("Checking.", [PARIS])),
        ("an unknown tool", called(" to=functions.launch<|channel|>commentary json", '{"n": 1}'),
         say(calls=[["launch", {"n": 1}]])),
        ("malformed JSON", called(canonical, "{city: Paris}"), say()),
        ("arguments that are no object", called(canonical, '["Paris"]'), say()),
        ("the recipient after the channel",
         called(f"<|channel|>commentary to=functions.{weather} <|constrain|>json"), say(calls=[PARIS])),
        ("the recipient after the channel, no <|constrain|>",
         called(f"<|channel|>commentary to=functions.{weather} json"), say(calls=[PARIS])),
        ("<|constrain|> with no type", called(f" to=functions.{weather}<|channel|>commentary <|constrain|>"),
         say(calls=[PARIS])),
        ("a call's channel without a type", called(f" to=functions.{weather}<|channel|>commentary"),
         say(calls=[PARIS])),
        ("a message with no channel", case(ids(name, f"{analysis}{start}<|message|>It is sunny.<|return|>")),
         say("It is sunny.")),
        ("a marker in the reasoning (ordinary ids)",
         case([*ids(name, "<|channel|>analysis<|message|>I could use "), *spelled("<|end|>", name),
               *ids(name, f" here<|end|>{start}<|channel|>final<|message|>It is sunny.<|return|>")]),
         meant("It is sunny.", reasoning="I could use <|end|> here")),
        ("truncation inside the reasoning", case(ids(name, "<|channel|>analysis<|message|>First, the city")),
         meant(reasoning="First, the city")),
    ]


def _k3_hostile(name: str, prompt: list[int]) -> list[tuple[str, Case, dict[str, Any]]]:
    """K3's hostile answers, after a generation prompt that opens the
    reasoning: each a short reasoning, then its channels (``response``,
    ``tools``) as the reference writes them, broken as models break them."""
    f = BY_NAME[name]

    def case(completion: list[int]) -> Case:
        return {"prompt": prompt, "completion": completion, "kwargs": {}}

    def say(content: str = "", calls: list[Any] | tuple[Any, ...] = ()) -> dict[str, Any]:
        return meant(content, calls, "Hmm.")

    def response(text: str) -> str:
        return f"<|open|>response<|sep|>{text}<|close|>response<|sep|>"

    def calls(*each: tuple[str, str]) -> str:
        return f.section % "".join(f.call(n, a, k) for k, (n, a) in enumerate(each))

    opened, end = "Hmm.<|close|>think<|sep|>", f.end
    good = calls(("get_weather", '{"city": "Paris"}'))
    head, tail = (opened + response("") + calls(("get_weather", '{"city": "a @@ b"}')) + end).split("@@")
    cut = opened + response("Let me check.") + good[:good.index("Paris") + 2]
    close_arg, close_think = "<|close|>argument<|sep|>", "<|close|>think<|sep|>"
    return [
        ("marker text in arguments (ordinary ids)",
         case([*ids(name, head), *spelled(close_arg, name), *ids(name, tail)]),
         say(calls=[["get_weather", {"city": f"a {close_arg} b"}]])),
        ("marker token in arguments", case(ids(name, head + f.marker + tail)),
         say(calls=[["get_weather", {"city": f"a {f.marker} b"}]])),
        ("a marker in the content (ordinary ids)",
         case([*ids(name, opened + "<|open|>response<|sep|>I could use "), *spelled("<|close|>response<|sep|>", name),
               *ids(name, " here.<|close|>response<|sep|>" + end)]),
         say("I could use <|close|>response<|sep|> here.")),
        ("truncation inside a call", case(ids(name, cut)), say("Let me check.")),
        ("a call, then text", case(ids(name, opened + good + response("It is sunny there.") + end)),
         say("It is sunny there.", [PARIS])),
        ("text, a call, text",
         case(ids(name, opened + response("Checking.") + good + response("Done.") + end)),
         say("Checking.Done.", [PARIS])),
        ("an unknown tool", case(ids(name, opened + response("") + calls(("launch", '{"n": 1}')) + end)),
         say(calls=[["launch", {"n": 1}]])),
        # Arguments that are no JSON are the reference's fallback block: the
        # call meant is the one rendered, its arguments that text.
        ("malformed JSON", case(ids(name, opened + response("") + calls(("get_weather", "{city: Paris}")) + end)),
         say(calls=[["get_weather", "{city: Paris}"]])),
        ("malformed JSON, then a good call",
         case(ids(name, opened + response("") + calls(("get_weather", "{city: Oslo}"),
                                                      ("get_weather", '{"city": "Paris"}')) + end)),
         say(calls=[["get_weather", "{city: Oslo}"], PARIS])),
        ("two calls", case(ids(name, opened + response("") + calls(("get_weather", '{"city": "Paris"}'),
                                                                   ("get_weather", '{"city": "Oslo"}')) + end)),
         say(calls=[PARIS, ["get_weather", {"city": "Oslo"}]])),
        ("a marker in the reasoning (ordinary ids)",
         case([*ids(name, "I could use "), *spelled(close_think, name),
               *ids(name, f" here{close_think}{response('It is sunny.')}{end}")]),
         meant("It is sunny.", reasoning=f"I could use {close_think} here")),
        ("truncation inside the reasoning", case(ids(name, "First, the city")), meant(reasoning="First, the city")),
    ]


def expected(name: str, case: Case) -> dict[str, Any]:
    """``Template.parse``'s message of a case's ids, its arguments read
    against the request's tools where the case has them."""
    if "tools" not in case:
        return parsed_message(template(name), vocab(name), case["completion"], True)
    msg = tpl(name).parse(case["completion"], vocab(name), completion=True, lenient=True, thinking=True,
                          tools=case["tools"])
    return {"reasoning": msg.get("reasoning_content") or "", "content": msg.get("content") or "",
            "tool_calls": [[c["function"]["name"], as_json(c["function"]["arguments"])]
                           for c in msg.get("tool_calls") or ()]}


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

