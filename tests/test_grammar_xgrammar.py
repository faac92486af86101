"""The xgrammar export, compiled and matched by xgrammar itself.

xgrammar needs torch, so it lives in the engines venv tests/run makes
(``XTML_ENGINES_PYTHON``); the grammars and completions are made here and
one run of tests/helpers/xgrammar_driver.py there matches them all. Every
rendered completion is taken id by id to a terminated matcher; every
changed one is refused at the very id where llguidance refuses it under the
llguidance export of the same request (tests/test_grammar_export.py checks
those positions against the markup itself).

The driver tells xgrammar which ids are special the only way xgrammar 0.2
has: by their text, which it gives a byte no character class matches, so a
marker is matched by its ``Token(id)`` only.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.grammar import K3, Piece, find, ids_of, piece, pieces, refused_at, vocab
from tests.helpers.need import need

pytestmark = pytest.mark.engines

DRIVER = Path(__file__).parent / "helpers" / "xgrammar_driver.py"

TOOLS = [
    {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object",
        "properties": {
            "q": {"type": "string"},
            "n": {"type": "integer"},
            "exact": {"type": "boolean"},
            "unit": {"enum": ["c", "f"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}, "name": {"type": "string"}},
                      "required": ["lat"], "additionalProperties": False},
        },
        # Closed: xgrammar's EBNF tells an unlisted key from a listed one
        # only when no unlisted key is allowed (the export's header says so).
        "required": ["q", "n"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "log", "parameters": {
        "type": "object", "properties": {"msg": {"type": "string"}}, "required": ["msg"],
        "additionalProperties": False}}},
]
LOOKUP = {"q": "rain in Paris", "n": 3, "exact": True, "unit": "c", "tags": ["zzz", "b"],
          "where": {"lat": 48.85, "name": "zzz"}}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
          "required": ["answer", "score"], "additionalProperties": False}


def request(**over: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "go"}], "tools": TOOLS, "thinking": False, **over}


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"function": {"name": name, "arguments": args}}


def reply(content: str = "", *calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **({"tool_calls": list(calls)} if calls else {})}


@dataclass
class Check:
    history: dict[str, Any]
    ids: list[int]
    good: bool
    tell_specials: bool = True

    def grammar(self, fmt: str) -> str:
        return K3.completion_grammar(self.history, vocab(), format=fmt, max_calls=4)


def good(history: dict[str, Any], message: dict[str, Any]) -> Check:
    return Check(history, ids_of(pieces(K3, history, message)), True)


def bad(history: dict[str, Any], message: dict[str, Any],
        change: Callable[[list[Piece]], list[Piece]] = lambda ps: ps) -> Check:
    """A completion the request does not allow: ``message`` as rendered
    (when the request itself forbids it), or changed."""
    return Check(history, ids_of(change(pieces(K3, history, message))), False)


def marker_in(text: str) -> Callable[[list[Piece]], list[Piece]]:
    """The close marker's id in place of the first token of ``text``'s
    piece that lies inside ``text``."""
    def change(ps: list[Piece]) -> list[Piece]:
        k = next(j for j, p in enumerate(ps) if text in p.seg.text)
        tokens = ps[k].ids
        start = len(ps[k].seg.text.split(text)[0].encode("utf-8"))
        table = vocab().byte_table()
        at = n = 0
        while n < start:
            n += len(table[tokens[at]])
            at += 1
        close = K3.bind(vocab()).marker_ids[K3.markers.close]
        whole = Piece(ps[k].seg, [*tokens[:at], close, *tokens[at + 1:]])
        return [*ps[:k], whole, *ps[k + 1:]]
    return change


def respell(pattern: list[str], at: int, text: str) -> Callable[[list[Piece]], list[Piece]]:
    def change(ps: list[Piece]) -> list[Piece]:
        k = find(ps, pattern) + at
        return [*ps[:k], piece(K3, text), *ps[k + 1:]]
    return change


def json_format() -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}


CHECKS: dict[str, Callable[[], Check]] = {
    "auto: text and calls": lambda: good(
        request(), reply("Looking.", call("lookup", LOOKUP), call("log", {"msg": "x"}))),
    "auto: text only": lambda: good(request(), reply("Nothing to look up.")),
    "auto: thinking": lambda: good(
        request(thinking=True), {**reply("ok", call("log", {"msg": "y"})), "reasoning_content": "hm"}),
    "required: a call": lambda: good(request(tool_choice="required"), reply("", call("lookup", {"q": "a", "n": 1}))),
    "required: no call": lambda: bad(request(tool_choice="required"), reply("plain text")),
    "named: that tool": lambda: good(
        request(tool_choice={"type": "function", "function": {"name": "log"}}), reply("", call("log", {"msg": "m"}))),
    "named: another tool": lambda: bad(
        request(tool_choice={"type": "function", "function": {"name": "log"}}),
        reply("", call("lookup", {"q": "a", "n": 1}))),
    "none: text": lambda: good(request(tool_choice="none"), reply("only text")),
    "none: a call": lambda: bad(request(tool_choice="none"), reply("", call("log", {"msg": "m"}))),
    "undeclared tool": lambda: bad(
        request(), reply("", call("log", {"msg": "m"})), respell([" tool", '="'], 2, "logs")),
    "integer argument given a string": lambda: bad(
        request(), reply("", call("lookup", {"q": "a", "n": "three"}))),
    "boolean argument given a number": lambda: bad(
        request(), reply("", call("lookup", {"q": "a", "n": 1, "exact": 1}))),
    "value outside the enum": lambda: bad(
        request(), reply("", call("lookup", {"q": "a", "n": 1, "unit": "k"}))),
    "undeclared argument": lambda: bad(
        request(), reply("", call("log", {"msg": "m", "level": 2}))),
    "marker in a string argument": lambda: bad(
        request(), reply("", call("log", {"msg": "zzz"})), marker_in("zzz")),
    "marker in a JSON string of an argument": lambda: bad(
        request(), reply("", call("lookup", {"q": "a", "n": 1, "tags": ["zzz"]})), marker_in("zzz")),
    "response_format: JSON": lambda: good(
        request(response_format=json_format()), reply(json.dumps({"answer": "fine", "score": 2}))),
    "response_format: a string for an integer": lambda: bad(
        request(response_format=json_format()), reply(json.dumps({"answer": "fine", "score": "2"}))),
    "response_format: marker in a JSON string": lambda: bad(
        request(response_format=json_format()), reply(json.dumps({"answer": "zzz", "score": 2})), marker_in("zzz")),
    "response_format: text": lambda: bad(request(response_format=json_format()), reply("plain")),
    "response_format and tools: a call instead": lambda: good(
        request(response_format=json_format()), reply("", call("log", {"msg": "m"}))),
    "response_format and tools: JSON and a call": lambda: good(
        request(response_format=json_format()),
        reply(json.dumps({"answer": "a", "score": 1}), call("log", {"msg": "m"}))),
    "one call at most: two": lambda: bad(
        request(parallel_tool_calls=False), reply("", call("log", {"msg": "a"}), call("log", {"msg": "b"}))),
}

# Markers left spelled in xgrammar's vocabulary (as TokenizerInfo.from_huggingface
# builds it) are text to its character classes: inside a JSON string the
# marker's text is a run of characters a string may hold.
SPELLED = {"response_format: marker in a JSON string", "marker in a JSON string of an argument"}


@cache
def checks() -> dict[str, Check]:
    out = {name: make() for name, make in CHECKS.items()}
    for name in SPELLED:
        out[f"{name}, markers spelled"] = replace(out[name], tell_specials=False)
    return out


FORMATS = ("xgrammar", "xgrammar-tag")
"""The EBNF export and the structural tag, each matched by xgrammar."""


@cache
def outcomes() -> tuple[str, dict[tuple[str, str], dict[str, Any]]]:
    python = need("engines python", "tests/run sets it up", env="XTML_ENGINES_PYTHON")
    cs = checks()
    grammars: dict[tuple[str, str], int] = {}
    job_cases, keys = [], []
    for fmt in FORMATS:
        for name, c in cs.items():
            g = grammars.setdefault((fmt, c.grammar(fmt)), len(grammars))
            job_cases.append({"grammar": g, "ids": c.ids, "tell_specials": c.tell_specials})
            keys.append((fmt, name))
    tokenizer = Path(os.environ.get("TMPDIR", "/tmp")) / f"xtml-xgrammar-{os.getpid()}.json"
    tokenizer.write_text(vocab().tokenizer.to_str(), encoding="utf-8")
    end = K3.bind(vocab()).marker_ids[K3.markers.end]
    job = {"tokenizer": str(tokenizer), "special_ids": sorted(vocab().special_ids()), "stop_ids": [end],
           "grammars": [{"ebnf" if fmt == "xgrammar" else "structural_tag": text} for fmt, text in grammars],
           "cases": job_cases}
    try:
        # -I: the script's folder (tests/helpers, with its tokenizers.py) must
        # not shadow the tokenizers package.
        run = subprocess.run([python, "-I", str(DRIVER)], input=json.dumps(job), capture_output=True, text=True,
                             timeout=300)
    finally:
        tokenizer.unlink()
    assert run.returncode == 0, run.stderr[-4000:]
    answer = json.loads(run.stdout)
    return answer["xgrammar"], dict(zip(keys, answer["results"], strict=True))


def test_the_driver_reports_its_xgrammar() -> None:
    version, _ = outcomes()
    assert version.startswith("0.2."), version


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(CHECKS))
def test_xgrammar_matches_as_llguidance_does(name: str, fmt: str) -> None:
    c = checks()[name]
    got = outcomes()[1][fmt, name]
    if c.good:
        assert got == {"taken": len(c.ids), "terminated": True, "refused": None}
        return
    want = refused_at(c.grammar("llguidance"), c.ids)
    assert (got["taken"], got["refused"]) == (want, c.ids[want]), vocab().decode(c.ids[max(0, want - 3):want + 1])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", sorted(SPELLED))
def test_markers_left_spelled_pass_as_json_text(name: str, fmt: str) -> None:
    """Why the driver tells xgrammar the special ids: without that, the
    marker inside a JSON string is taken as the characters of its text."""
    c = checks()[f"{name}, markers spelled"]
    assert outcomes()[1][fmt, f"{name}, markers spelled"] == {"taken": len(c.ids), "terminated": True,
                                                               "refused": None}


def test_a_literal_with_a_control_character_before_a_hex_letter_is_that_text() -> None:
    """A literal is written with escapes xgrammar reads as written: a
    control character followed by a hex letter is two characters, not one
    (xgrammar reads ``\\x`` greedily)."""
    from xtml.plugins.api import ebnf_literal

    python = need("engines python", "tests/run sets it up", env="XTML_ENGINES_PYTHON")
    texts = ["\x01a", "\x1fF", "a\x7fbc", "\x00" + "0" * 3, "tab\there\nnew\x02e"]
    cases = [(ebnf_literal(t), t, True) for t in texts] + [(ebnf_literal(t), t[:-1], False) for t in texts]
    script = ("import json, sys, xgrammar as x\n"
              "out = [x.testing._is_grammar_accept_string(x.Grammar.from_ebnf('root ::= ' + g), t)"
              " for g, t, _ in json.load(sys.stdin)]\n"
              "json.dump(out, sys.stdout)")
    run = subprocess.run([python, "-I", "-c", script], input=json.dumps(cases), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert json.loads(run.stdout) == [want for _, _, want in cases]
