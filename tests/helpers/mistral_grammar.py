"""The completion grammar of Mistral Small 3.1 under test: requests drawn at
random, random walks under each format's matcher (llguidance's for its own
grammar and for the GBNF one, xgrammar's for its EBNF and structural tag),
a reader of the answer's contract written apart from the dialect's parse,
and answers with whether the grammar takes them."""

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
from llguidance.gbnf_to_lark import gbnf_to_lark

import xtml
from tests.helpers.json_schemas import objects
from tests.helpers.layout_grammar import BUDGET, MAX_STEPS, MISTRAL, bare_request, enders, lltok, numerals, vocab
from tests.helpers.layout_walks import Case, violation, walk
from tests.helpers.need import need

__all__ = ["ANSWERS", "FORMATS", "KIND", "answer_texts", "check", "drawn", "lark_of", "llguidance_walk",
           "mistral_read", "rendered_text", "xgrammar_walks"]

KIND = MISTRAL.name
FORMATS = ("llguidance", "gbnf", "xgrammar", "xgrammar-tag")
ID = re.compile(r"[A-Za-z0-9]{9}\Z")
DRIVER = Path(__file__).parent / "xgrammar_walk_driver.py"
_JSON_WS = " \t\n\r"


@st.composite
def _cases(draw: st.DrawFn) -> Case:
    tools = draw(st.dictionaries(st.sampled_from(["f", "g_1", "h"]), objects(), min_size=1, max_size=2))
    request: dict[str, Any] = {
        "messages": [{"role": "user", "content": "go"}],
        "tools": [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in tools.items()]}
    choice = draw(st.sampled_from(["auto", "none", "required", "named"]))
    request["tool_choice"] = {"type": "function", "function": {"name": draw(st.sampled_from(sorted(tools)))}} \
        if choice == "named" else choice
    if draw(st.booleans()):
        request["parallel_tool_calls"] = False
    if draw(st.integers(0, 2)) == 0:
        request["response_format"] = draw(st.sampled_from([
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "r", "schema": draw(objects())}}]))
    return Case(MISTRAL, request, tools)


def drawn(examples: int) -> list[tuple[Case, int]]:
    """``examples`` requests (and walk seeds) as hypothesis draws them, for
    a matcher that takes them in one batch."""
    out: list[tuple[Case, int]] = []

    @settings(max_examples=examples, deadline=None, database=None)
    @given(_cases(), st.integers(0, 2**32))
    def draw(case: Case, seed: int) -> None:
        out.append((case, seed))

    draw()
    return out


def lark_of(gbnf: str) -> str:
    """A GBNF grammar as llguidance's Lark, for llguidance's matcher:
    llguidance's converter reads no token reference, so each goes through
    as a rule of its own and comes back as the reference."""
    refs = sorted(set(re.findall(r"<\[(\d+)\]>", gbnf)))
    text = re.sub(r"<\[(\d+)\]>", r"tokref\1", gbnf) + "".join(f'tokref{i} ::= "@"\n' for i in refs)
    # A definition on one line: the converter breaks long ones before a "|".
    lark = re.sub(r"\n[ \t]+\|", " |", gbnf_to_lark(text))
    lark = re.sub(r"(?im)^tokref\d+\s*:.*\n", "", lark)
    lark = re.sub(r"(?i)\btokref(\d+)\b", r"<[\1]>", lark)
    # The converter made terminals of rules that hold a reference, which
    # Lark's terminals cannot: they (and the terminals using them) are rules.
    while True:
        bodies = dict(re.findall(r"(?m)^([A-Z][A-Z0-9_]*)\s*:(.*)$", lark))
        rules = {n for n in bodies if "<[" in bodies[n] or re.search(r"\b[a-z][a-z0-9_]*\b", _bare(bodies[n]))}
        if not rules:
            return lark
        lark = re.sub(r"\b(" + "|".join(sorted(rules)) + r")\b", lambda m: "r_" + m.group().lower(), lark)


def _bare(body: str) -> str:
    """A Lark body without its strings and regular expressions."""
    return re.sub(r'"(?:[^"\\]|\\.)*"|/(?:[^/\\]|\\.)*/', "", body)


def llguidance_walk(case: Case, seed: int, fmt: str) -> list[int]:
    """One completion llguidance's matcher admits under the case's grammar
    in ``fmt`` (``llguidance``, or ``gbnf`` converted to Lark)."""
    v = vocab(KIND)
    grammar = MISTRAL.completion_grammar(case.request, v, format=fmt)
    m = llguidance.LLMatcher(lltok(KIND), lark_of(grammar) if fmt == "gbnf" else grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    stop = v.special_id("</s>")
    assert stop is not None
    return walk(m, random.Random(seed), KIND, (), frozenset({stop}))


def xgrammar_walks(batch: list[tuple[Case, int]], fmt: str) -> tuple[str, list[list[int]]]:
    """One completion xgrammar's matcher admits for each case, under its
    grammar in ``fmt`` (``xgrammar`` or ``xgrammar-tag``), walked by
    tests/helpers/xgrammar_walk_driver.py in the engines venv."""
    python = need("engines python", "tests/run sets it up", env="XTML_ENGINES_PYTHON")
    v = vocab(KIND)
    grammars: dict[str, int] = {}
    walks = []
    for case, seed in batch:
        g = MISTRAL.completion_grammar(case.request, v, format=fmt)
        entry = json.dumps({"structural_tag": g} if fmt == "xgrammar-tag" else {"ebnf": g})
        walks.append({"grammar": grammars.setdefault(entry, len(grammars)), "seed": seed})
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tokenizer.json"
        v.tokenizer.save(str(path))
        job = {"tokenizer": str(path), "special_ids": sorted(v.special_ids()),
               "stop_ids": list(MISTRAL.bind(v).stop_ids), "grammars": [json.loads(g) for g in grammars],
               "walks": walks, "enders": sorted(enders(KIND)), "numerals": sorted(numerals(KIND)),
               "budget": BUDGET, "max_steps": MAX_STEPS}
        run = subprocess.run([python, "-I", str(DRIVER)], input=json.dumps(job), capture_output=True, text=True,
                             timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    answer = json.loads(run.stdout)
    return answer["xgrammar"], answer["walks"]


def mistral_read(ids: list[int], v: xtml.Vocabulary) -> dict[str, Any]:
    """A Mistral Small 3.1 answer as its contract reads one, written apart
    from the dialect's parse: content up to ``[TOOL_CALLS]`` (as is), then
    JSON whitespace and one JSON array of calls, each an object of
    ``name`` (a string), ``arguments`` (an object, or a string holding
    one) and maybe ``id`` (a string), then JSON whitespace, then ``</s>``.
    Raises AssertionError on anything else."""
    names = {i: t for t, i in MISTRAL.bind(v).token_ids.items()}
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
    assert pieces and pieces[-1] == "</s>", pieces
    pieces.pop()
    content = pieces.pop(0)[1:] if pieces and pieces[0].startswith("~") else ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if not pieces:
        return message
    assert pieces[0] == "[TOOL_CALLS]" and len(pieces) == 2 and pieces[1].startswith("~"), pieces
    text = pieces[1][1:]
    start = len(text) - len(text.lstrip(_JSON_WS))
    calls, end = json.JSONDecoder().raw_decode(text, start)
    assert not text[end:].strip(_JSON_WS), text[end:]
    assert isinstance(calls, list) and calls, calls
    out = []
    for c in calls:
        assert isinstance(c, dict) and {"name", "arguments"} <= set(c) <= {"name", "arguments", "id"}, c
        name, args = c["name"], c["arguments"]
        assert isinstance(name, str), c
        if isinstance(args, str):
            assert isinstance(json.loads(args), dict), c
            arguments = args
        else:
            assert isinstance(args, dict), c
            arguments = json.dumps(args, ensure_ascii=False)
        call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
        if "id" in c:
            assert isinstance(c["id"], str), c
            call["id"] = c["id"]
        out.append(call)
    message["tool_calls"] = out
    return message


def check(case: Case, ids: list[int], fmt: str,
          parse: Callable[[list[int]], dict[str, Any]] | None = None) -> None:
    """The walk ``ids`` reads by the contract (and by ``parse``, the same)
    to an answer that holds the case's request, each id of the format's
    nine letters and digits where the model gives one. A format whose
    syntax cannot hold some keywords of a schema (GBNF and xgrammar's EBNF:
    see their grammar's header) is held to the schema without them."""
    v = vocab(KIND)
    message = mistral_read(ids, v)
    if parse is not None:
        try:
            parsed = parse(ids)
        except xtml.ParseError as e:
            raise AssertionError(f"strict parse: {e}\ncompletion: {v.decode(ids)!r}\n"
                                 f"request: {json.dumps(case.request)}") from None
        assert parsed == message, (parsed, message)
    why = violation(case if fmt == "llguidance" else _loosened_case(case), message)
    for c in message.get("tool_calls", ()):
        if "id" in c and not ID.match(c["id"]):
            why = f"id {c['id']!r}, not nine letters and digits"
    assert why is None, f"{why}\ncompletion: {v.decode(ids)!r}\nrequest: {json.dumps(case.request)}"


# What the grammars' headers say GBNF and xgrammar's EBNF cannot express
# (their `limit:` lines: array sizes among them).
_UNHELD = frozenset({"minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                     "exclusiveMaximum", "multipleOf", "not", "if", "then", "else", "minItems", "maxItems",
                     "uniqueItems"})


_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _loosened(s: Any) -> Any:
    if isinstance(s, dict):
        return {k: {n: _loosened(x) for n, x in v.items()} if k in _NAMED and isinstance(v, dict) else _loosened(v)
                for k, v in s.items() if k not in _UNHELD}
    if isinstance(s, list):
        return [_loosened(x) for x in s]
    return s


def _loosened_case(case: Case) -> Case:
    return Case(case.tpl, _loosened(case.request), _loosened(case.schemas))


def _call(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


PARIS = _call("get_weather", {"city": "Paris", "days": 3}, "a1B2c3D4e")
NOW = _call("get_time", {}, "Zz9Yy8Xx7")
NAMED = {"tool_choice": {"type": "function", "function": {"name": "get_time"}}}
_RF = {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
    "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
    "additionalProperties": False}}}}


def rendered_text(request: dict[str, Any], answer: dict[str, Any]) -> str:
    """``answer`` as the format renders it after the request's messages
    (its tokens spelled), ``</s>`` included."""
    base = {k: x for k, x in request.items() if k not in ("tool_choice", "response_format", "parallel_tool_calls")}
    base["date"] = "2025-03-17"
    prompt: str = MISTRAL.render(base).text
    whole: str = MISTRAL.render({**base, "messages": [*base["messages"], {"role": "assistant", **answer}]}).text
    assert whole.startswith(prompt), (prompt, whole)
    return whole[len(prompt):]


_PARIS = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}, "id": "a1B2c3D4e"}'
_NOW = '{"name": "get_time", "arguments": {}}'
# (request options, the answer as text with the format's tokens spelled, or
# as a message the format renders, whether the grammar takes it), after a
# user's question with WEATHER and TIME declared.
ANSWERS: list[tuple[dict[str, Any], str | dict[str, Any], bool]] = [
    ({}, {"content": "It is sunny."}, True),
    ({}, {"content": "", "tool_calls": [PARIS]}, True),
    ({}, {"content": "", "tool_calls": [PARIS, NOW]}, True),
    # The render leaves out the content beside calls.
    ({"tool_choice": "required"}, {"content": "Let me look.", "tool_calls": [PARIS]}, True),
    ({"tool_choice": "required"}, {"content": "", "tool_calls": [NOW, PARIS]}, True),
    (NAMED, {"content": "", "tool_calls": [NOW]}, True),
    (NAMED, {"content": "", "tool_calls": [PARIS]}, False),
    ({"tool_choice": "none"}, {"content": "", "tool_calls": [PARIS]}, False),
    ({"parallel_tool_calls": False}, {"content": "", "tool_calls": [PARIS]}, True),
    ({"parallel_tool_calls": False}, {"content": "", "tool_calls": [PARIS, NOW]}, False),
    ({}, {"content": "", "tool_calls": [_call("get_weather", {"town": "Paris"}, "a1B2c3D4e")]}, False),
    ({}, {"content": "", "tool_calls": [_call("get_weather", {"city": 7}, "a1B2c3D4e")]}, False),
    ({}, {"content": "", "tool_calls": [_call("search", {}, "a1B2c3D4e")]}, False),
    (_RF, {"content": '{"answer": "sunny"}'}, True),
    (_RF, {"content": "sunny"}, False),
    # What the model writes: content then calls, no space before the
    # array, calls with no id, "," then any JSON whitespace between them.
    ({}, f"Let me look.[TOOL_CALLS] [{_PARIS}]</s>", True),
    ({}, f"[TOOL_CALLS][{_NOW}]</s>", True),
    ({}, f"[TOOL_CALLS] [{_NOW}, {_PARIS}]</s>", True),
    ({}, f"[TOOL_CALLS]  [{_NOW}]</s>", False),
    ({}, "[TOOL_CALLS] []</s>", False),
    ({}, f"[TOOL_CALLS] [{_NOW}] </s>", False),
    ({}, f"[TOOL_CALLS] [{_NOW}]Done.</s>", False),
    ({}, "[TOOL_CALLS] [" + _NOW.replace("}}", '}, "id": "abc"}') + "]</s>", False),
    ({}, "[TOOL_CALLS] [" + _NOW.replace("}}", '}, "id": "abc_defgh"}') + "]</s>", False),
    ({}, "[TOOL_CALLS] [" + _NOW.replace("{}", '"{}"') + "]</s>", False),
    ({}, "[TOOL_CALLS] [" + _NOW.replace("}}", '}, "type": "function"}') + "]</s>", False),
    ({"tool_choice": "required"}, f"Let me look.[TOOL_CALLS] [{_NOW}]</s>", False),
    ({"tool_choice": "none"}, "Hi [TOOL_CALLS] there.</s>", False),
    ({**_RF, "tool_choice": "auto"}, '{"answer": "sunny"}' + f"[TOOL_CALLS] [{_NOW}]</s>", True),
]


def answer_texts() -> list[tuple[dict[str, Any], str, bool]]:
    """:data:`ANSWERS`, each as text with the format's tokens spelled."""
    return [(extra, a if isinstance(a, str) else rendered_text(bare_request(extra), a), good)
            for extra, a, good in ANSWERS]
