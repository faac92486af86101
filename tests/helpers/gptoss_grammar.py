"""The completion grammar of gpt-oss (harmony) under test: requests drawn at
random, random walks under each format's matcher (llguidance's for its own
grammar and for the GBNF one, xgrammar's for its EBNF and structural tag),
a reader of the answer's contract written apart from the dialect's parse,
and answers with whether the grammar takes them."""

from __future__ import annotations

import json
import random
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
from tests.helpers.layout_grammar import BUDGET, GPTOSS, MAX_STEPS, enders, lltok, numerals, vocab
from tests.helpers.layout_walks import Case, violation, walk
from tests.helpers.mistral_grammar import _loosened_case, lark_of
from tests.helpers.need import need

__all__ = ["ANSWERS", "KIND", "answer_texts", "check", "drawn", "gptoss_read", "llguidance_walk", "request",
           "xgrammar_walks"]

KIND = GPTOSS.name
DRIVER = Path(__file__).parent / "xgrammar_walk_driver.py"
_JSON_WS = " \t\n\r"


def _tool(name: str, schema: Any) -> dict[str, Any]:
    # The TypeScript namespace writes each tool's description.
    return {"type": "function", "function": {"name": name, "description": f"The tool {name}.", "parameters": schema}}


@st.composite
def _cases(draw: st.DrawFn) -> Case:
    tools = draw(st.dictionaries(st.sampled_from(["f", "g_1", "h"]), objects(), min_size=1, max_size=2))
    req: dict[str, Any] = {"messages": [{"role": "user", "content": "go"}],
                           "tools": [_tool(n, s) for n, s in tools.items()],
                           "reasoning_effort": draw(st.sampled_from(["low", "medium", "high"]))}
    choice = draw(st.sampled_from(["auto", "none", "required", "named"]))
    req["tool_choice"] = {"type": "function", "function": {"name": draw(st.sampled_from(sorted(tools)))}} \
        if choice == "named" else choice
    if draw(st.booleans()):
        req["parallel_tool_calls"] = False
    if draw(st.integers(0, 2)) == 0:
        req["response_format"] = draw(st.sampled_from([
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "r", "schema": draw(objects())}}]))
    return Case(GPTOSS, req, tools)


def drawn(examples: int) -> list[tuple[Case, int]]:
    """``examples`` requests (and walk seeds) as hypothesis draws them."""
    out: list[tuple[Case, int]] = []

    @settings(max_examples=examples, deadline=None, database=None)
    @given(_cases(), st.integers(0, 2**32))
    def draw(case: Case, seed: int) -> None:
        out.append((case, seed))

    draw()
    return out


def llguidance_walk(case: Case, seed: int, fmt: str) -> list[int]:
    """One completion llguidance's matcher admits under the case's grammar
    in ``fmt`` (``llguidance``, or ``gbnf`` converted to Lark)."""
    v = vocab(KIND)
    grammar = GPTOSS.completion_grammar(case.request, v, format=fmt)
    m = llguidance.LLMatcher(lltok(KIND), lark_of(grammar) if fmt == "gbnf" else grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    stop = v.special_id("<|return|>")
    assert stop is not None
    return walk(m, random.Random(seed), KIND, (), frozenset({stop}), _opening())


def _opening() -> frozenset[int]:
    """The tokens that open a message or its header: a walk that preferred
    them past its budget would write analysis messages without end."""
    ids = GPTOSS.bind(vocab(KIND)).token_ids
    return frozenset({ids["<|start|>"], ids["<|channel|>"]})


def xgrammar_walks(batch: list[tuple[Case, int]], fmt: str) -> tuple[str, list[list[int]]]:
    """One completion xgrammar's matcher admits for each case, under its
    grammar in ``fmt`` (``xgrammar`` or ``xgrammar-tag``), walked by
    tests/helpers/xgrammar_walk_driver.py in the engines venv."""
    python = need("engines python", "tests/run sets it up", env="XTML_ENGINES_PYTHON")
    v = vocab(KIND)
    grammars: dict[str, int] = {}
    walks = []
    for case, seed in batch:
        g = GPTOSS.completion_grammar(case.request, v, format=fmt)
        entry = json.dumps({"structural_tag": g} if fmt == "xgrammar-tag" else {"ebnf": g})
        walks.append({"grammar": grammars.setdefault(entry, len(grammars)), "seed": seed})
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tokenizer.json"
        v.tokenizer.save(str(path))
        job = {"tokenizer": str(path), "special_ids": sorted(v.special_ids()),
               "stop_ids": list(GPTOSS.bind(v).stop_ids), "grammars": [json.loads(g) for g in grammars],
               "walks": walks, "enders": sorted(enders(KIND) - _opening()), "numerals": sorted(numerals(KIND)),
               "budget": BUDGET, "max_steps": MAX_STEPS}
        run = subprocess.run([python, "-I", str(DRIVER)], input=json.dumps(job), capture_output=True, text=True,
                             timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    answer = json.loads(run.stdout)
    return answer["xgrammar"], answer["walks"]


def gptoss_read(ids: list[int], v: xtml.Vocabulary) -> dict[str, Any]:
    """A gpt-oss answer as its contract reads one, written apart from the
    dialect's parse, for the header forms the template writes: messages
    (each later one after ``<|start|>assistant``), an analysis message's
    text is reasoning (closed by ``<|end|>``), a final message's is content
    (closed by ``<|return|>``, the answer's end), a message ``
    to=functions.NAME`` on ``commentary json`` is a call whose text is a
    JSON object (closed by ``<|call|>``, the answer's end). Raises
    AssertionError on anything else."""
    names = {i: t for t, i in GPTOSS.bind(v).token_ids.items()}
    pieces: list[str] = []  # a token, or text as "~" + text
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
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    k = 0

    def text() -> str:
        nonlocal k
        if k < len(pieces) and pieces[k].startswith("~"):
            k += 1
            return pieces[k - 1][1:]
        return ""

    first = True
    while True:
        head = text()
        if not first:
            assert head.startswith("assistant"), pieces
            head = head[len("assistant"):]
        assert pieces[k] == "<|channel|>", pieces
        k += 1
        channel = text()
        assert pieces[k] == "<|message|>", pieces
        k += 1
        body = text()
        close = pieces[k]
        k += 1
        if head:
            assert head.startswith(" to=functions.") and len(head) > len(" to=functions."), head
            assert channel == "commentary json" and close == "<|call|>", pieces
            args = json.loads(body)
            assert isinstance(args, dict), body
            calls.append({"type": "function", "function": {"name": head[len(" to=functions."):],
                                                           "arguments": body.strip(_JSON_WS)}})
            break
        if channel == "analysis":
            assert close == "<|end|>", pieces
            reasoning.append(body)
            assert pieces[k] == "<|start|>", pieces
            k += 1
            first = False
            continue
        assert channel == "final" and close == "<|return|>", pieces
        content.append(body)
        break
    assert k == len(pieces), pieces
    message: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(content)}
    if reasoning:
        message["reasoning_content"] = "\n\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def check(case: Case, ids: list[int], fmt: str, parse: Callable[[list[int]], dict[str, Any]]) -> None:
    """The walk ``ids`` reads by the contract and by ``parse`` (strictly)
    to the same answer, which holds the case's request. A format whose
    syntax cannot hold some keywords of a schema (GBNF and xgrammar's
    EBNF: see their grammar's header) is held to the schema without them."""
    v = vocab(KIND)
    try:
        parsed = parse(ids)
    except xtml.ParseError as e:
        raise AssertionError(f"strict parse: {e}\ncompletion: {v.decode(ids)!r}\n"
                             f"request: {json.dumps(case.request)}") from None
    message = gptoss_read(ids, v)
    assert parsed == message, (parsed, message)
    why = violation(case if fmt == "llguidance" else _unsized(_loosened_case(case)), message)
    assert why is None, f"{why}\ncompletion: {v.decode(ids)!r}\nrequest: {json.dumps(case.request)}"


# What the EBNF writers' `limit:` lines say they do not enforce in arrays.
_SIZES = frozenset({"minItems", "maxItems", "uniqueItems"})
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _without_sizes(s: Any) -> Any:
    if isinstance(s, dict):
        return {k: {n: _without_sizes(x) for n, x in v.items()} if k in _NAMED and isinstance(v, dict)
                else _without_sizes(v) for k, v in s.items() if k not in _SIZES}
    if isinstance(s, list):
        return [_without_sizes(x) for x in s]
    return s


def _unsized(case: Case) -> Case:
    return Case(case.tpl, _without_sizes(case.request), _without_sizes(case.schemas))


WEATHER = _tool("get_weather", {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"enum": ["c", "f"]}},
    "required": ["city"], "additionalProperties": False})
TIME = _tool("get_time", {"type": "object", "properties": {}})


def request(extra: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER, TIME], **extra}


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": args}}


PARIS = _call("get_weather", {"city": "Paris", "days": 3})
NOW = _call("get_time", {})
NAMED = {"tool_choice": {"type": "function", "function": {"name": "get_time"}}}
_RF = {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
    "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
    "additionalProperties": False}}}}
_A = "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant"
_FINAL = "<|channel|>final<|message|>Sunny.<|return|>"
_NOW = " to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>"
# (request options, the answer as text with the format's tokens spelled, or
# as a message the format renders, whether the grammar takes it), after a
# user's question with WEATHER and TIME declared.
ANSWERS: list[tuple[dict[str, Any], str | dict[str, Any], bool]] = [
    ({}, {"content": "It is sunny."}, True),
    ({}, {"content": "Sunny.", "reasoning_content": "The user asks.\n\nThink."}, True),
    ({}, {"content": "", "tool_calls": [PARIS]}, True),
    ({}, {"content": "", "reasoning_content": "Call it.", "tool_calls": [PARIS]}, True),
    ({"reasoning_effort": "high"}, {"content": "", "reasoning_content": "", "tool_calls": [NOW]}, True),
    ({"tool_choice": "required"}, {"content": "", "tool_calls": [NOW]}, True),
    ({"tool_choice": "required"}, {"content": "It is sunny."}, False),
    (NAMED, {"content": "", "reasoning_content": "Time.", "tool_calls": [NOW]}, True),
    (NAMED, {"content": "", "tool_calls": [PARIS]}, False),
    ({"tool_choice": "none"}, {"content": "It is sunny."}, True),
    ({"tool_choice": "none"}, {"content": "", "tool_calls": [PARIS]}, False),
    ({"parallel_tool_calls": False}, {"content": "", "tool_calls": [PARIS]}, True),
    ({}, {"content": "", "tool_calls": [_call("get_weather", {"town": "Paris"})]}, False),
    ({}, {"content": "", "tool_calls": [_call("get_weather", {"city": 7})]}, False),
    ({}, {"content": "", "tool_calls": [_call("search", {})]}, False),
    (_RF, {"content": '{"answer": "sunny"}'}, True),
    (_RF, {"content": "sunny"}, False),
    ({**_RF, "tool_choice": "auto"}, {"content": "", "tool_calls": [NOW]}, True),
    # What the model writes: several analysis messages, empty texts.
    ({}, _A + _A + _FINAL, True),
    ({}, "<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|><|return|>", True),
    ({}, _A + _NOW, True),
    # The template's header form only, one call, the closes it writes.
    ({}, "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>", False),
    ({}, " to=functions.get_time<|channel|>commentary <|constrain|>json<|message|>{}<|call|>", False),
    ({}, " to=functions.get_time<|channel|>commentary<|message|>{}<|call|>", False),
    ({}, "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant" + _NOW, False),
    ({}, _NOW + "<|start|>assistant" + _NOW, False),
    ({}, _NOW.replace("<|call|>", "<|return|>"), False),
    ({}, _NOW.replace("<|call|>", "<|end|>"), False),
    ({}, _FINAL.replace("<|return|>", "<|call|>"), False),
    ({}, _FINAL.replace("<|return|>", "<|end|>"), False),
    ({}, "<|channel|>analysis<|message|>Hm.<|end|>", False),
    ({}, "<|start|>assistant" + _FINAL, False),
    ({}, _NOW.replace("{}", '"{}"'), False),
    ({}, "<|channel|>analysis<|message|>Hm.<|return|>", False),
]


def rendered_text(req: dict[str, Any], answer: dict[str, Any]) -> str:
    """``answer`` as the format renders it after the request's generation
    prompt (its tokens spelled), the close that ends the render included."""
    base = {k: x for k, x in req.items() if k not in ("tool_choice", "response_format", "parallel_tool_calls")}
    base["date"] = "2025-08-05"
    prompt: str = GPTOSS.render(base).text
    whole: str = GPTOSS.render({**base, "messages": [*base["messages"], {"role": "assistant", **answer}]},
                               add_generation_prompt=False).text
    assert whole.startswith(prompt), (prompt, whole)
    return whole[len(prompt):]


def answer_texts() -> list[tuple[dict[str, Any], str, bool]]:
    """:data:`ANSWERS`, each as text with the format's tokens spelled."""
    return [(extra, a if isinstance(a, str) else rendered_text(request(extra), a), good)
            for extra, a, good in ANSWERS]
