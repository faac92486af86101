"""Random walks under llguidance's real matcher over the completion grammar
of a layout dialect (the property of tests/test_grammar_sampling.py): each
walk is a completion the grammar admits, which must parse strictly as a
completion and hold the request it was made for (:func:`violation`)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import llguidance
from hypothesis import given, settings
from hypothesis import strategies as st

import xtml
from tests.helpers.json_schemas import objects
from tests.helpers.layout_grammar import (
    BARE,
    BUDGET,
    GLM,
    KIMI,
    MAX_STEPS,
    QWEN3,
    enders,
    lltok,
    numerals,
    texts,
    vocab,
)
from xtml.chat.layout_request import name_of_id, spelled_id
from xtml.codec.completion.layout_plan import may_spell_call

__all__ = ["WALKED", "WALKS", "Case", "cases", "glm_read", "run_walks", "sample", "violation", "walk"]

WALKS = 2
BUILTIN = ["brave_search", "wolfram_alpha"]


@dataclass
class Case:
    tpl: xtml.Template
    request: dict[str, Any]
    schemas: dict[str, Any]


@st.composite
def cases(draw: st.DrawFn, tpl: xtml.Template) -> Case:
    request: dict[str, Any] = {"messages": [{"role": "user", "content": "go"}]}
    tools: dict[str, Any] = {}
    if tpl is QWEN3 or tpl is GLM or tpl.name in KIMI or tpl.name in BARE:
        tools = draw(st.dictionaries(st.sampled_from(["f", "g_1", "h"]), objects(), min_size=1, max_size=2))
        request["tools"] = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in tools.items()]
        if tpl is QWEN3 or tpl is GLM:
            request["enable_thinking"] = draw(st.booleans())
        choice = draw(st.sampled_from(["auto", "none", "required", "named"]))
        request["tool_choice"] = {"type": "function", "function": {"name": draw(st.sampled_from(sorted(tools)))}} \
            if choice == "named" else choice
        if draw(st.booleans()):
            request["parallel_tool_calls"] = False
    if tpl.name == "llama-3.1" and draw(st.booleans()):
        request["builtin_tools"] = draw(st.lists(st.sampled_from(BUILTIN), min_size=1, max_size=2, unique=True))
    if tpl.name == "deepseek-v3.1":
        request["thinking"] = draw(st.booleans())
        if draw(st.booleans()):
            # After a tool result the format writes no generation prompt:
            # the answer goes on from there, without a reasoning block.
            name = sorted(tools)[0]
            request["messages"] += [
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": name, "arguments": "{}"}}]},
                {"role": "tool", "content": "done"}]
    if draw(st.integers(0, 2)) == 0:
        request["response_format"] = draw(st.sampled_from([
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "r", "schema": draw(objects())}}]))
    return Case(tpl, request, tools)


def _reasoning_closed(case: Case) -> bool:
    """The prompt leaves no reasoning block to the model."""
    req = case.request
    if req.get("enable_thinking") is False:
        return True
    return case.tpl.name == "deepseek-v3.1" and (req["thinking"] is False or req["messages"][-1]["role"] == "tool")


def violation(case: Case, message: dict[str, Any]) -> str | None:
    """What of the request the parsed answer does not hold; None when it
    holds all of it."""
    req = case.request
    calls = message.get("tool_calls") or []
    choice = req.get("tool_choice", "auto")
    if choice == "none" and calls:
        return "a call under tool_choice none"
    if choice != "auto" and choice != "none":
        if not calls:
            return f"no call under tool_choice {choice}"
        if message["content"]:
            return "content beside the calls of a required call"
        if isinstance(choice, dict) and {c["function"]["name"] for c in calls} != {choice["function"]["name"]}:
            return "a call to another tool than the named one"
    if req.get("parallel_tool_calls") is False and len(calls) > 1:
        return f"{len(calls)} calls under parallel_tool_calls false"
    if _reasoning_closed(case) and "reasoning_content" in message:
        return "a reasoning block where the prompt closed it"
    tpl: Any = case.tpl
    d = tpl.layout
    for j, c in enumerate(calls):
        fn = c["function"]
        if d.call_ids == "generated" and c.get("id") != spelled_id(d, fn["name"], j):
            return f"call {j} has id {c.get('id')!r}, not the one the format generates"
        if d.call_ids == "given" and d.call_id is not None and name_of_id(d, c.get("id", "")) != fn["name"]:
            return f"call {j} has id {c.get('id')!r}, not of the format's spelling"
        if fn["name"] in req.get("builtin_tools", ()) and fn["name"] not in case.schemas:
            if choice != "auto":
                return f"a built-in call under tool_choice {choice}"
            args = json.loads(fn["arguments"])
            if not isinstance(args, dict) or len(args) > 1 or any(not isinstance(x, str) for x in args.values()):
                return f"arguments of built-in {fn['name']!r}: {fn['arguments']}"
            continue
        if fn["name"] not in case.schemas:
            return f"a call to undeclared {fn['name']!r}"
        try:
            jsonschema.validate(json.loads(fn["arguments"]), case.schemas[fn["name"]])
        except jsonschema.ValidationError as e:
            return f"arguments of {fn['name']!r}: {e.message}"
    rf = req.get("response_format")
    if rf is not None and not (calls and not message["content"]):
        try:
            value = json.loads(message["content"])
        except ValueError:
            return f"content that is not JSON: {message['content']!r}"
        schema = rf["json_schema"]["schema"] if rf["type"] == "json_schema" else {"type": "object"}
        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError as e:
            return f"content: {e.message}"
    return None


def _glm_value(text: str, prop: Any) -> Any:
    """A pair's value as the contract reads it (see :func:`glm_read`)."""
    t = prop.get("type") if isinstance(prop, dict) else None
    enum = prop.get("enum") if isinstance(prop, dict) else None
    if t == "string" or (isinstance(t, list) and "string" in t) or \
            (t is None and isinstance(enum, list) and enum and all(isinstance(x, str) for x in enum)):
        return text
    if t is not None or isinstance(enum, list):
        return json.loads(text)
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return text if isinstance(value, str) else value


def glm_read(ids: list[int], v: xtml.Vocabulary, tools: Any) -> dict[str, Any]:
    """A GLM-4.6 answer as its contract reads one, written apart from the
    dialect's parse: ``\\n<think>`` reasoning ``</think>`` (stripped), then
    content up to the first call (stripped), then calls, each
    ``<tool_call>NAME\\n`` and pairs ``<arg_key>K</arg_key>\\n<arg_value>V
    </arg_value>\\n`` to ``</tool_call>``, whitespace between them, then one
    stop. Raises AssertionError on anything else."""
    names = {i: t for t, i in GLM.bind(v).token_ids.items()}
    pieces: list[str] = []  # a token's name, or text (tokens start with "<" or "[", text as "~" + text)
    run: list[int] = []
    for i in [*ids, -1]:
        if i in names or i == -1:
            if run:
                pieces.append("~" + v.decode(run))
                run = []
            if i != -1:
                pieces.append(names[i])
        else:
            run.append(i)
    assert pieces and pieces[-1] in GLM.layout.stops and all(p not in GLM.layout.stops for p in pieces[:-1]), pieces
    pieces.pop()
    out: dict[str, Any] = {"role": "assistant"}

    def text_at(k: int) -> tuple[str, int]:
        return (pieces[k][1:], k + 1) if k < len(pieces) and pieces[k].startswith("~") else ("", k)

    lead, k = text_at(0)
    if k < len(pieces) and pieces[k] == "<think>" and not lead.strip():
        reasoning, k = text_at(k + 1)
        assert pieces[k] == "</think>", pieces
        if reasoning.strip():
            out["reasoning_content"] = reasoning.strip()
        content, k = text_at(k + 1)
    else:
        content = lead
    out["content"] = content.strip()
    props = {t["function"]["name"]: (t["function"].get("parameters") or {}).get("properties") or {}
             for t in tools or ()}
    calls = []
    while k < len(pieces):
        assert pieces[k] == "<tool_call>", pieces
        head, k = text_at(k + 1)
        assert head.endswith("\n"), head
        name, args = head[:-1], {}
        while pieces[k] == "<arg_key>":
            key, k = text_at(k + 1)
            nl, k = text_at(k + 1)
            assert pieces[k - 2] == "</arg_key>" and nl == "\n" and pieces[k] == "<arg_value>", pieces
            value, k = text_at(k + 1)
            assert pieces[k] == "</arg_value>" and key not in args, pieces
            args[key] = _glm_value(value, props.get(name, {}).get(key))
            nl, k = text_at(k + 1)
            assert nl == "\n", pieces
        assert pieces[k] == "</tool_call>", pieces
        arguments = json.dumps(args, ensure_ascii=False)
        calls.append({"type": "function", "function": {"name": name, "arguments": arguments}})
        gap, k = text_at(k + 1)
        assert not gap.strip(), gap
    if calls:
        out["tool_calls"] = calls
    return out


def walk(m: llguidance.LLMatcher, rng: random.Random, kind: str, spelled: tuple[str, ...],
         stops: frozenset[int], opening: frozenset[int] = frozenset()) -> list[int]:
    """A completion the matcher admits, token by token (as the walk of
    tests/test_grammar_sampling.py goes); past the budget it also prefers
    the tokens that go on spelling a token the vocabulary writes as text
    (the close of a reasoning block that is text), so that walks end. The
    ``opening`` tokens (which open a part, as a header's channel opens a
    message) are not preferred with the ones that end."""
    v = vocab(kind)
    ending, numeric = (enders(kind) | stops) - opening, numerals(kind)
    ids: list[int] = []
    tail = ""
    for step in range(MAX_STEPS):
        bias = m.compute_logit_bias()
        allowed = [i for i, b in enumerate(bias) if b]
        assert allowed, f"nothing allowed after {ids}: {m.get_error()}"
        r = rng.random()
        if step >= BUDGET or r < 0.2:
            closing = [i for i in allowed if i in ending]
            if step >= BUDGET and spelled and rng.random() < 0.9:
                closing = _going_on(v, allowed, tail, spelled) or closing
            allowed = closing or allowed
        elif r < 0.5:
            digits = [i for i in allowed if i in numeric]
            allowed = digits or allowed
        t = rng.choice(allowed)
        if t in stops and m.is_accepting():
            return [*ids, t]
        assert m.consume_token(t), f"the matcher refused the token it allowed, {t}, after {ids}: {m.get_error()}"
        ids.append(t)
        tail = (tail + v.decode([t]))[-40:]
        if m.is_stopped():
            return ids
    raise AssertionError(f"a walk did not end within {MAX_STEPS} steps: {v.decode(ids[-60:])!r}")


def _going_on(v: xtml.Vocabulary, allowed: list[int], tail: str, spelled: tuple[str, ...]) -> list[int]:
    """The allowed ids that go on with the longest spelling of a token the
    text ends with (from its first character)."""
    table = texts(v)
    for k in range(max(map(len, spelled)) - 1, -1, -1):
        rests = {t[k:] for t in spelled if k < len(t) and tail.endswith(t[:k])}
        going = [i for i in allowed if table[i] and any(r.startswith(table[i]) or table[i].startswith(r)
                                                         for r in rests)]
        if going:
            return going
    return []


def _grammar(case: Case, v: xtml.Vocabulary) -> str:
    """The case's grammar; where the format reads a JSON object of a call's
    keys as a call, a response_format whose JSON may hold one is refused
    (then the walk goes on without it); where no tool the request must call
    can be written, the request is refused (then the walk goes on under
    ``auto``)."""
    rf = case.request.get("response_format")
    if case.tpl.name == "llama-3.1" and rf is not None:
        schema = rf["json_schema"]["schema"] if rf["type"] == "json_schema" else {"type": "object"}
        if may_spell_call(schema):
            try:
                case.tpl.completion_grammar(case.request, v)
            except xtml.OptionError as e:
                assert e.option == "response_format", e
            else:
                raise AssertionError("a response_format that may spell a call was taken")
            del case.request["response_format"]
    if case.tpl is GLM and case.request.get("tool_choice") not in (None, "auto", "none"):
        # A required argument whose schema gives no type, holding strings
        # only: text that reads as JSON would read as JSON, so no pair holds
        # it, and a request that must call such tools is refused by name.
        try:
            case.tpl.completion_grammar(case.request, v)
        except xtml.OptionError as e:
            assert e.option == "tool_choice" and "no declared tool can be called" in str(e), e
            case.request["tool_choice"] = "auto"
    return case.tpl.completion_grammar(case.request, v)


def run_walks(case: Case, seed: int, kind: str, walks: int = WALKS) -> int:
    v = vocab(kind)
    grammar = _grammar(case, v)
    spelled = tuple(getattr(case.tpl.bind(v), "text_tokens", ()))
    stops = frozenset(i for t in case.tpl.layout.stops if (i := v.special_id(t)) is not None)  # type: ignore[attr-defined]
    for k in range(walks):
        m = llguidance.LLMatcher(lltok(kind), grammar, log_level=0)
        assert not m.is_error(), m.get_error()
        ids = walk(m, random.Random(seed * walks + k), kind, spelled, stops)
        try:
            if case.tpl is GLM:
                message = case.tpl.parse(ids, v, completion=True, tools=case.request.get("tools"))
            else:
                message = case.tpl.parse(ids, v, completion=True)
        except xtml.ParseError as e:
            raise AssertionError(f"strict parse: {e}\ncompletion: {v.decode(ids)!r}\n"
                                 f"request: {json.dumps(case.request)}") from None
        if case.tpl is GLM:
            # The dialect's parse and the contract's reader read the same.
            assert glm_read(ids, v, case.request.get("tools")) == message, v.decode(ids)
        why = violation(case, message)
        assert why is None, f"{why}\ncompletion: {v.decode(ids)!r}\nrequest: {json.dumps(case.request)}"
    return walks


WALKED: dict[str, int] = {}


def sample(tpl: xtml.Template, kind: str, examples: int, walks: int = WALKS) -> None:
    done = 0

    @settings(max_examples=examples, deadline=None)
    @given(cases(tpl), st.integers(0, 2**32))
    def run(case: Case, seed: int) -> None:
        nonlocal done
        done += run_walks(case, seed, kind, walks)

    run()
    WALKED[f"{tpl.name}/{kind}"] = done
    assert done >= walks * examples, f"only {done} walks"
