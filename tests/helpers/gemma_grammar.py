"""The completion grammar of Gemma 4 under test: requests drawn at random,
random walks under llguidance's matcher (of its grammar and of the GBNF
one) and xgrammar's (of its EBNF and structural tag, in the engines venv),
a reader of the answer's contract
written apart from the dialect's parse (its arguments read by the value
syntax's own ``read``), and answers with whether the grammar takes them."""

from __future__ import annotations

import json
import random
import re
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llguidance
from hypothesis import given, settings
from hypothesis import strategies as st

import xtml
from tests.helpers.json_schemas import objects
from tests.helpers.layout_grammar import (
    BUDGET,
    GEMMA,
    MAX_STEPS,
    bare_request,
    enders,
    lltok,
    numerals,
    token_ids,
    vocab,
)
from tests.helpers.layout_walks import Case, violation
from tests.helpers.mistral_grammar import _bare, _loosened, lark_of
from tests.helpers.need import need
from xtml.plugins.values import load_value_syntax

__all__ = ["ANSWERS", "KIND", "NO_CALLS", "TEMPLATE", "answer_texts", "check", "drawn", "gbnf_lark", "gemma_read",
           "llguidance_walk", "rendered_text", "xgrammar_takes", "xgrammar_walks"]

KIND = GEMMA.name
TEMPLATE: Any = GEMMA
QUOTE = '<|"|>'
STOPS = ("<turn|>", "<|tool_response>")
_SYNTAX = load_value_syntax("gemma")
_KEY_ENDS = frozenset(vocab(KIND).ids_of([":"])[0])
_CLOSERS = frozenset(vocab(KIND).ids_of(["}]"])[0])
_HELPERS = Path(__file__).parent


@st.composite
def _cases(draw: st.DrawFn) -> Case:
    tools = draw(st.dictionaries(st.sampled_from(["f", "g_1", "h"]), objects(), min_size=1, max_size=2))
    request: dict[str, Any] = {
        "messages": [{"role": "user", "content": "go"}],
        "tools": [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in tools.items()],
        "enable_thinking": draw(st.booleans())}
    if draw(st.integers(0, 3)) == 0:
        # After results the format writes no prompt: the answer goes on.
        name = sorted(tools)[0]
        request["messages"] += [
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": name, "arguments": {}}}]},
            {"role": "tool", "content": "done"}]
    choice = draw(st.sampled_from(["auto", "none", "required", "named"]))
    request["tool_choice"] = {"type": "function", "function": {"name": draw(st.sampled_from(sorted(tools)))}} \
        if choice == "named" else choice
    if draw(st.booleans()):
        request["parallel_tool_calls"] = False
    if draw(st.integers(0, 2)) == 0:
        request["response_format"] = draw(st.sampled_from([
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "r", "schema": draw(objects())}}]))
    return Case(TEMPLATE, request, tools)


def drawn(examples: int) -> list[tuple[Case, int]]:
    """``examples`` requests (and walk seeds) as hypothesis draws them."""
    out: list[tuple[Case, int]] = []

    @settings(max_examples=examples, deadline=None, database=None)
    @given(_cases(), st.integers(0, 2**32))
    def draw(case: Case, seed: int) -> None:
        out.append((case, seed))

    draw()
    return out


def gbnf_lark(gbnf: str) -> str:
    """A GBNF grammar as llguidance's Lark, as :func:`lark_of` converts it,
    each terminal made of other terminals then a rule: llguidance's lexer
    takes a terminal's longest match and never gives it back (a pair of
    the arguments as one terminal would take the comma after it), where
    GBNF, matched character by character, has no lexer."""
    lark = lark_of(gbnf)
    while True:
        bodies = dict(re.findall(r"(?m)^([A-Z][A-Z0-9_]*)\s*:(.*)$", lark))
        made = {n for n, b in bodies.items() if re.search(r"\b[A-Z][A-Z0-9_]*\b", _bare(b))}
        if not made:
            return lark
        lark = re.sub(r"\b(" + "|".join(sorted(made)) + r")\b", lambda m: "r_" + m.group().lower(), lark)


def llguidance_walk(case: Case, seed: int, fmt: str = "llguidance") -> list[int]:
    """One completion llguidance's matcher admits under the case's grammar
    in ``fmt`` (``llguidance``, or ``gbnf`` converted to Lark)."""
    v = vocab(KIND)
    grammar = TEMPLATE.completion_grammar(case.request, v, format=fmt)
    m = llguidance.LLMatcher(lltok(KIND), gbnf_lark(grammar) if fmt == "gbnf" else grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    stops = frozenset(i for s in STOPS if (i := v.special_id(s)) is not None)
    keys = sorted({k for s in case.schemas.values() for k in _keys(s)})
    return _walk(m, random.Random(seed), stops, [v.ids_of([k + ":"])[0] for k in keys])


def _engines(driver: str, job: dict[str, Any]) -> dict[str, Any]:
    """``job`` (its tokenizer and the format's ids added) run by ``driver``
    in the engines venv."""
    python = need("engines python", "tests/run sets it up", env="XTML_ENGINES_PYTHON")
    v = vocab(KIND)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tokenizer.json"
        v.tokenizer.save(str(path))
        job = {"tokenizer": str(path), "special_ids": sorted(v.special_ids()),
               "stop_ids": list(TEMPLATE.bind(v).stop_ids), **job}
        run = subprocess.run([python, "-I", str(_HELPERS / driver)], input=json.dumps(job), capture_output=True,
                             text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-4000:]
    answer: dict[str, Any] = json.loads(run.stdout)
    return answer


def _entry(request: dict[str, Any], fmt: str) -> str:
    g = TEMPLATE.completion_grammar(request, vocab(KIND), format=fmt)
    return json.dumps({"structural_tag": g} if fmt == "xgrammar-tag" else {"ebnf": g})


def xgrammar_walks(batch: list[tuple[Case, int]], fmt: str) -> tuple[str, list[list[int]]]:
    """One completion xgrammar's matcher admits for each case, under its
    grammar in ``fmt`` (``xgrammar`` or ``xgrammar-tag``), walked as
    :func:`llguidance_walk` walks (tests/helpers/gemma_xgrammar_walk_driver.py)."""
    v = vocab(KIND)
    grammars: dict[str, int] = {}
    walks = []
    for case, seed in batch:
        keys = sorted({k for s in case.schemas.values() for k in _keys(s)})
        walks.append({"grammar": grammars.setdefault(_entry(case.request, fmt), len(grammars)), "seed": seed,
                      "keys": [v.ids_of([k + ":"])[0] for k in keys]})
    answer = _engines("gemma_xgrammar_walk_driver.py", {
        "grammars": [json.loads(g) for g in grammars], "walks": walks,
        "special": sorted(v.special_ids()), "closers": sorted(_CLOSERS), "closing": sorted(enders(KIND) | _KEY_ENDS),
        "numerals": sorted(numerals(KIND)), "budget": BUDGET, "max_steps": MAX_STEPS})
    return answer["xgrammar"], answer["walks"]


def xgrammar_takes(answers: list[tuple[dict[str, Any], str, bool]], fmt: str) -> tuple[str, list[bool]]:
    """Whether xgrammar's matcher takes each answer (text with the format's
    tokens spelled), id by id to its end, under the grammar of its request
    in ``fmt`` (tests/helpers/xgrammar_driver.py)."""
    v = vocab(KIND)
    grammars: dict[str, int] = {}
    cases = [{"grammar": grammars.setdefault(_entry(bare_request(extra), fmt), len(grammars)),
              "ids": token_ids(TEMPLATE, v, text)} for extra, text, _ in answers]
    answer = _engines("xgrammar_driver.py", {"grammars": [json.loads(g) for g in grammars], "cases": cases})
    return answer["xgrammar"], [r["refused"] is None and r["terminated"] for r in answer["results"]]


def _keys(s: Any) -> set[str]:
    """The keys a schema's objects declare, at any depth."""
    out: set[str] = set()
    if isinstance(s, dict):
        props = s.get("properties")
        if isinstance(props, dict):
            out.update(props)
        for x in s.values():
            out |= _keys(x)
        if isinstance(props, dict):
            for x in props.values():
                out |= _keys(x)
    elif isinstance(s, list):
        for x in s:
            out |= _keys(x)
    return out


def _walk(m: llguidance.LLMatcher, rng: random.Random, stops: frozenset[int], keys: list[list[int]]) -> list[int]:
    """A completion the matcher admits, token by token, as
    :func:`tests.helpers.layout_walks.walk` goes; past the budget it
    prefers the format's tokens (which close strings, calls, blocks and
    answers), then a declared key (an object whose required key is yet to
    come, beside keys of its own choosing), then what closes JSON or ends
    a bare key (``"}]:``), so that walks through values of any kind end."""
    v = vocab(KIND)
    special, numeric = v.special_ids() | stops, numerals(KIND)
    closing = enders(KIND) | _KEY_ENDS
    ids: list[int] = []
    for step in range(MAX_STEPS):
        bias = m.compute_logit_bias()
        allowed = [i for i, b in enumerate(bias) if b]
        assert allowed, f"nothing allowed after {ids}: {m.get_error()}"
        r = rng.random()
        if step >= BUDGET or r < 0.2:
            if step >= BUDGET and not any(i in special or i in _CLOSERS for i in allowed):
                key = next((k for k in rng.sample(keys, len(keys)) if m.deep_copy().try_consume_tokens(k) == len(k)),
                           None)
                if key is not None:
                    assert m.consume_tokens(key), m.get_error()
                    ids += key
                    continue
            allowed = [i for i in allowed if i in special] or [i for i in allowed if i in closing] or allowed
        elif r < 0.5:
            allowed = [i for i in allowed if i in numeric] or allowed
        t = rng.choice(allowed)
        if t in stops and m.is_accepting():
            return [*ids, t]
        assert m.consume_token(t), f"the matcher refused the token it allowed, {t}, after {ids}: {m.get_error()}"
        ids.append(t)
        if m.is_stopped():
            return ids
    raise AssertionError(f"a walk did not end within {MAX_STEPS} steps: {v.decode(ids[-60:])!r}")


def gemma_read(ids: list[int], v: xtml.Vocabulary, tools: Any) -> dict[str, Any]:
    """A Gemma 4 answer as its contract reads one, written apart from the
    dialect's parse: maybe ``<|channel>`` reasoning ``<channel|>`` first
    (its ``thought\\n`` label and one newline before the close taken off),
    content up to the first call (stripped), calls
    ``<|tool_call>call:NAME{ARGS}<tool_call|>`` with nothing but
    whitespace between them, ARGS read by the value syntax against the
    tool's schema (``<|"|>`` its quotes, as the token only), then one stop.
    Raises AssertionError on anything else."""
    names = {i: t for t, i in TEMPLATE.bind(v).token_ids.items()}
    pieces: list[str] = []  # a token's text, or text as "~" + text
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
    assert pieces and pieces[-1] in STOPS and all(p not in STOPS for p in pieces[:-1]), pieces
    pieces.pop()
    out: dict[str, Any] = {"role": "assistant"}
    k = 0

    def text_at(k: int) -> tuple[str, int]:
        return (pieces[k][1:], k + 1) if k < len(pieces) and pieces[k].startswith("~") else ("", k)

    if pieces and pieces[0] == "<|channel>":
        reasoning, k = text_at(1)
        assert k < len(pieces) and pieces[k] == "<channel|>", pieces
        k += 1
        reasoning = reasoning.removeprefix("thought\n")
        reasoning = reasoning[:-1] if reasoning.endswith("\n") else reasoning
        if reasoning:
            out["reasoning_content"] = reasoning
    content, k = text_at(k)
    out["content"] = content.strip()
    schemas = {t["function"]["name"]: t["function"].get("parameters") for t in tools or ()}
    calls = []
    while k < len(pieces):
        assert pieces[k] == "<|tool_call>", pieces
        k += 1
        inside = []
        while k < len(pieces) and pieces[k] != "<tool_call|>":
            assert pieces[k] == QUOTE or (pieces[k].startswith("~") and QUOTE not in pieces[k]), pieces
            inside.append(pieces[k].removeprefix("~"))
            k += 1
        assert k < len(pieces), pieces
        k += 1
        text = "".join(inside)
        assert text.startswith("call:") and "{" in text, text
        name, args = text[5:].split("{", 1)
        assert name, text
        value = _SYNTAX.read("{" + args, schemas.get(name) or {})
        calls.append({"type": "function", "function": {"name": name,
                                                       "arguments": json.dumps(value, ensure_ascii=False)}})
        gap, k = text_at(k)
        assert not gap.strip(), gap
    if calls:
        out["tool_calls"] = calls
    return out


def check(case: Case, ids: list[int], parse: Callable[[list[int]], dict[str, Any]] | None = None,
          fmt: str = "llguidance") -> None:
    """The walk ``ids`` reads by the contract (and by ``parse``, the same)
    to an answer that holds the case's request. The calls' arguments are
    held to their schemas in every format (the value syntax writes each);
    a JSON answer in GBNF and xgrammar's EBNF to its schema without the
    keywords their headers say they cannot express."""
    v = vocab(KIND)
    tools = case.request.get("tools")
    try:
        message = gemma_read(ids, v, tools)
    except xtml.ParseError as e:
        raise AssertionError(f"contract read: {e}\ncompletion: {v.decode(ids)!r}\n"
                             f"request: {json.dumps(case.request)}") from None
    if parse is not None:
        try:
            parsed = parse(ids)
        except xtml.ParseError as e:
            raise AssertionError(f"strict parse: {e}\ncompletion: {v.decode(ids)!r}\n"
                                 f"request: {json.dumps(case.request)}") from None
        assert _message(parsed) == message, (parsed, message, v.decode(ids))
    if fmt != "llguidance" and "response_format" in case.request:
        case = Case(case.tpl, {**case.request, "response_format": _loosened(case.request["response_format"])},
                    case.schemas)
    why = violation(case, message)
    assert why is None, f"{why}\ncompletion: {v.decode(ids)!r}\nrequest: {json.dumps(case.request)}"


def _message(parsed: dict[str, Any]) -> dict[str, Any]:
    """A parse's message, without what the contract's reader does not give."""
    return {k: x for k, x in parsed.items() if k in ("role", "content", "reasoning_content", "tool_calls")}


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": args}}


PARIS = _call("get_weather", {"city": "Paris", "days": 3})
NOW = _call("get_time", {})
NAMED = {"tool_choice": {"type": "function", "function": {"name": "get_time"}}}
ON = {"enable_thinking": True}
_RF = {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
    "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
    "additionalProperties": False}}}}
AFTER = [{"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": "", "tool_calls": [PARIS]},
         {"role": "tool", "content": "sunny"}]


def rendered_text(request: dict[str, Any], answer: dict[str, Any]) -> str:
    """``answer`` as the format renders it after the request's messages
    (its tokens spelled), then the stop the model writes: ``<|tool_response>``
    where the render leaves the turn waiting for results, else ``<turn|>``."""
    base = {k: x for k, x in request.items() if k not in ("tool_choice", "response_format", "parallel_tool_calls")}
    prompt: str = TEMPLATE.render(base).text
    whole: str = TEMPLATE.render({**base, "messages": [*base["messages"], {"role": "assistant", **answer}],
                                  "add_generation_prompt": False}).text
    # The prompt's closed reasoning block (thinking off) is the prompt's.
    opening = prompt
    if not whole.startswith(opening):
        opening = prompt.removesuffix("<|channel>thought\n<channel|>")
    assert whole.startswith(opening), (prompt, whole)
    out = whole[len(opening):]
    return out if out.endswith("<|tool_response>") else out.removesuffix("\n").removesuffix("<turn|>") + "<turn|>"


_PARIS = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>'
_NOW = "<|tool_call>call:get_time{}<tool_call|>"
_WAIT = "<|tool_response>"
# (request options, the answer as text with the format's tokens spelled, or
# as a message the format renders, whether the grammar takes it), after a
# user's question with WEATHER and TIME declared.
ANSWERS: list[tuple[dict[str, Any], str | dict[str, Any], bool]] = [
    ({}, {"content": "It is sunny."}, True),
    ({}, {"content": "", "tool_calls": [PARIS]}, True),
    ({}, {"content": "", "tool_calls": [PARIS, NOW]}, True),
    (ON, {"content": "", "reasoning_content": "Call it.", "tool_calls": [PARIS]}, True),
    ({"tool_choice": "required"}, {"content": "", "tool_calls": [PARIS]}, True),
    ({"tool_choice": "required", **ON}, {"content": "", "reasoning_content": "Call.", "tool_calls": [NOW, PARIS]},
     True),
    (NAMED, {"content": "", "tool_calls": [NOW]}, True),
    (NAMED, {"content": "", "tool_calls": [PARIS]}, False),
    ({"tool_choice": "none"}, {"content": "It is sunny."}, True),
    ({"tool_choice": "none"}, {"content": "", "tool_calls": [PARIS]}, False),
    ({"parallel_tool_calls": False}, {"content": "", "tool_calls": [PARIS]}, True),
    ({"parallel_tool_calls": False}, {"content": "", "tool_calls": [PARIS, NOW]}, False),
    ({}, {"content": "", "tool_calls": [_call("get_weather", {"town": "Paris"})]}, False),
    ({}, {"content": "", "tool_calls": [_call("get_weather", {"city": 7})]}, False),
    ({}, {"content": "", "tool_calls": [_call("get_weather", {"city": "Paris", "units": "c"})]}, True),
    ({}, {"content": "", "tool_calls": [_call("get_weather", {"city": "Paris", "units": "k"})]}, False),
    ({}, {"content": "", "tool_calls": [_call("search", {})]}, False),
    (_RF, {"content": '{"answer": "sunny"}'}, True),
    (_RF, {"content": "sunny"}, False),
    # What the model writes besides: reasoning with thinking on, content
    # before its calls, and what it may not.
    (ON, "<|channel>thought\nThe user asks.\n<channel|>It is sunny.<turn|>", True),
    (ON, "<|channel>thought\n<channel|>" + _NOW + _WAIT, True),
    (ON, "<|channel>The user asks.<channel|>It is sunny.<turn|>", False),
    ({}, "<|channel>thought\nThe user asks.\n<channel|>It is sunny.<turn|>", False),
    ({}, "Let me look." + _PARIS + _WAIT, True),
    ({}, _PARIS + _NOW + _WAIT, True),
    ({}, _PARIS + "\n" + _NOW + _WAIT, False),
    ({}, _PARIS + "Done." + _WAIT, False),
    ({}, "It is sunny." + _WAIT, False),
    ({}, "<|tool_call>call:get_time{}" + _WAIT, False),
    # The quote is the token, never its spelling.
    ({}, _PARIS.replace('<|"|>', '"'), False),
    ({}, "<|tool_call>call:get_weather{city:Paris}<tool_call|>" + _WAIT, False),
    ({"tool_choice": "required"}, "Let me look." + _NOW + _WAIT, False),
    ({"tool_choice": "none"}, "Hi " + _NOW + _WAIT, False),
    ({**_RF, "tool_choice": "auto"}, '{"answer": "sunny"}' + _NOW + _WAIT, True),
    # After results the turn goes on: no prompt, content then the end.
    ({"messages": AFTER}, "It is sunny.<turn|>", True),
    ({"messages": AFTER}, _NOW + _WAIT, True),
    ({"messages": AFTER}, "<|channel>thought\nHm.\n<channel|>It is sunny.<turn|>", False),
    ({"messages": AFTER, **ON}, "<|channel>thought\nHm.\n<channel|>It is sunny.<turn|>", True),
]


NONE = {"tool_choice": "none"}
# Answers without calls, for the formats the value syntax writes no grammar
# in (their grammar is refused where the answer may call a tool): none
# ends with <|tool_response>, which xgrammar takes for the engine's stop.
NO_CALLS: list[tuple[dict[str, Any], str | dict[str, Any], bool]] = [
    *[a for a in ANSWERS if a[0].get("tool_choice") == "none"],
    ({**NONE, **ON}, "<|channel>thought\nHm.\n<channel|>It is sunny.<turn|>", True),
    (NONE, "<|channel>thought\nHm.\n<channel|>It is sunny.<turn|>", False),
    ({**NONE, **_RF}, '{"answer": "sunny"}<turn|>', True),
    ({**NONE, **_RF}, "sunny<turn|>", False),
    ({**NONE, "messages": AFTER}, "It is sunny.<turn|>", True),
]


def answer_texts(answers: list[tuple[dict[str, Any], str | dict[str, Any], bool]] | None = None) -> list[
        tuple[dict[str, Any], str, bool]]:
    """:data:`ANSWERS` (or ``answers``), each as text with the format's
    tokens spelled."""
    return [(extra, a if isinstance(a, str) else rendered_text(bare_request(extra), a), good)
            for extra, a, good in (ANSWERS if answers is None else answers)]
