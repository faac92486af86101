"""The Jinja and Hugging Face exports of the built-in GLM-4.6 layout dialect
(xtml/dialects/glm-4.6.toml), rendered by transformers,
``@huggingface/jinja`` and llama.cpp's server: xtml's text, or a raise with
xtml's message where xtml refuses. What the format asks of the exporter
beyond the other dialects: a head, tools declared one by one in a turn of
their own, ``/nothink`` added to user text, an answer's text written where
it holds more than white space, reasoning shown after the last user
message, and arguments as ``<arg_key>``/``<arg_value>`` pairs (a string as
it is, anything else as ``json.dumps`` writes it, which the engines'
``tojson`` filters do not all write alike for floats)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.family_requests import family_requests
from tests.helpers.jinja_engines import ENGINES, need_engine, render_all
from tests.helpers.jinja_probe import SAYS, toml, xtml_render
from tests.helpers.layout_export import (
    HOSTILE_TEXT,
    INJECT_SQ,
    braced,
    hf_export,
    hf_renders,
    hostile_requests,
    outcomes,
)
from xtml.chat.template_file import builtin_files
from xtml.exports.jinja import jinja_template

pytestmark = pytest.mark.engines

FILE = builtin_files(layout=True)["glm-4.6"]
N = 60
NUMBER_REFUSAL = "this engine's tojson writes the number "


@pytest.fixture(scope="module")
def tpl() -> xtml.Template:
    return xtml.load("glm-4.6")


def corpus() -> list[dict[str, Any]]:
    return [{**c["request"], **c["options"]} for c in family_requests("glm-4.6", N)]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_template_renders_what_xtml_renders(engine: str, tpl: xtml.Template) -> None:
    """The family's generated requests (tools, parallel calls, runs of
    results, reasoning under its names, enable_thinking, content parts and
    none, marker spellings): xtml's text from what the engine handed over,
    or both refuse."""
    need_engine(engine)
    got = outcomes(engine, tpl, corpus())
    counts = got["counts"]
    print(f"glm-4.6 {engine}: {dict(counts)}")
    assert not got["bad"], f"{len(got['bad'])} differ ({dict(counts)}); the first:\n{got['bad'][0]}"
    assert sum(counts[k] for k in ("equal", "both refuse", "both refuse content as parts",
                                   "the engine refuses the request")) == N, dict(counts)
    assert counts["equal"] >= N * 9 // 10, dict(counts)
    for feature in ("tools", "calls", "grouped results", "enable_thinking", "reasoning cut before the last query"):
        assert counts[feature] >= 5, (feature, dict(counts))


# -- pairs, and the spellings the format adds ----------------------------------------------------

ARGUMENTS: list[Any] = [
    {"s": "plain", "q": "with \"quotes\" and \\ backslash", "nl": "a\nb\r\n", "u": "é日本🙂", "tag": "</arg_value>",
     "ctl": "\x01\x1f\x7f", "sp": " padded "},
    {"i": 0, "neg": -17, "big": 2**52, "t": True, "f": False, "n": None},
    {"list": [1, "two", None, [True], {"k": "v\"\n"}], "obj": {"a": {"b": []}, "é": "x\ty\x01"}, "eo": {}, "el": []},
    {"x": 1.5, "y": 0.1, "z": -2.25, "w": 3.0, "m0": -0.0, "zero": 0.0},
    {"a": 1e-5, "b": 1.5e-7, "c": 1e16, "d": 1.2345e20, "f": 0.0001, "g": 1234567.5, "h": 2.5e-300},
    {"p": 0.1234567891}, {"p": 3.141592653589793}, {"p": [0.5, {"k": 123456.789}]}, {"p": 1.234567891e22},
    {"nested": {"deep": [[[{"x": 1e-9}]]], "s": "v"}},
    None, {}, "",
]
"""Argument objects (and what reads as no pairs) across the JSON values:
strings with what JSON escapes, integers, floats in each of Python's
spellings, nested objects and lists."""


def pairs_requests(engine: str = "transformers") -> list[dict[str, Any]]:
    user = {"role": "user", "content": "q"}
    out: list[dict[str, Any]] = []
    for k, args in enumerate(ARGUMENTS):
        if engine == "llamacpp" and args == "":
            continue  # llama-server refuses it before the template (it parses arguments as JSON)
        call = {"id": f"call_{k}", "type": "function", "function": {"name": "f", "arguments": args}}
        out.append({"messages": [user, {"role": "assistant", "content": "", "tool_calls": [call, call]},
                                 {"role": "tool", "content": "r"}],
                    "add_generation_prompt": True, "enable_thinking": k % 2 == 0})
    tools = [{"type": "function", "function": {"name": "f", "description": "é \"x\"", "parameters": {
        "type": "object", "properties": {"a": {"type": "number", "default": 0.5}}}}},
             {"type": "function", "function": {"name": "g", "description": "", "parameters": {}}}]
    conversations: list[tuple[list[dict[str, Any]], bool]] = [
        # /nothink once: not added to content that already ends with it.
        ([{"role": "user", "content": "stop/nothink"}, {"role": "assistant", "content": "a"},
          {"role": "user", "content": "go /nothink "}], False),
        ([{"role": "system", "content": "s"}, {"role": "user", "content": ""}], False),
        # An answer's text only where it holds more than white space
        # (Python's, which is not JavaScript's: U+0085, U+001C).
        ([user, {"role": "assistant", "content": " \u3000\n\u0085\x1c"}, user,
          {"role": "assistant", "content": "\u200bx "}], True),
        # Reasoning after the last user message; with none, on every answer.
        ([{"role": "system", "content": "s"}, {"role": "assistant", "content": "a", "reasoning_content": "r1"},
          {"role": "assistant", "content": "b", "reasoning_content": " r2 "}], True),
        ([user, {"role": "assistant", "content": "a", "reasoning_content": "hidden"}, user,
          {"role": "assistant", "content": "b", "reasoning_content": "shown"},
          {"role": "assistant", "content": "c"}], True),
    ]
    for msgs, thinking in conversations:
        for agp in (True, False):
            out.append({"messages": msgs, "add_generation_prompt": agp, "enable_thinking": thinking, "tools": tools})
    return out


def handed_as(engine: str, v: Any) -> Any:
    """``v`` as the engine hands it to a template: JavaScript has one number
    type, so @huggingface/jinja reads a float with no fraction as an integer
    (and one past 2**53 loses digits, which is no part of this claim)."""
    if isinstance(v, dict):
        return {k: handed_as(engine, x) for k, x in v.items()}
    if isinstance(v, list):
        return [handed_as(engine, x) for x in v]
    if engine == "hfjs" and isinstance(v, float) and v.is_integer():
        return int(v) if abs(v) < 2**53 else 0.5
    return v


def unwritable(engine: str, v: Any) -> bool:
    """Whether ``v`` holds a float the engine's tojson cannot give Python's
    digits of: llama.cpp's writes six significant digits."""
    if isinstance(v, dict):
        return any(unwritable(engine, x) for x in v.values())
    if isinstance(v, list):
        return any(unwritable(engine, x) for x in v)
    return engine == "llamacpp" and isinstance(v, float) and math.isfinite(v) and float(f"{v:.6g}") != v


@pytest.mark.parametrize("engine", ENGINES)
def test_pairs_and_spellings_render_as_xtml_or_refuse_a_number(engine: str, tpl: xtml.Template) -> None:
    """Each argument value as xtml writes it (strings as they are, floats in
    Python's spelling whatever the engine's tojson writes), and the format's
    suffix, text test and reasoning policy; where the engine's tojson loses
    a float's digits (llama.cpp), the template raises rather than write
    another number."""
    need_engine(engine)
    requests = [handed_as(engine, r) for r in pairs_requests(engine)]
    got = render_all(engine, jinja_template(tpl.dialect), requests)
    refused = equal = 0
    for request, out in zip(requests, got, strict=True):
        if unwritable(engine, request):
            assert out.text is None and NUMBER_REFUSAL in (out.error or ""), (engine, request, out)
            refused += 1
            continue
        if engine == "llamacpp" and not request["add_generation_prompt"]:
            # llama-server hands add_generation_prompt only when true: a
            # template reads it absent, as true.
            request = {k: v for k, v in request.items() if k != "add_generation_prompt"}
        want = tpl.render(request).text
        assert out.text == want, (engine, request, out)
        equal += 1
    print(f"glm-4.6 pairs {engine}: {equal} equal, {refused} refused (a float's digits)")
    assert refused == (5 if engine == "llamacpp" else 0)
    assert equal == len(requests) - refused
    text = "".join(tpl.render(r).text for r in pairs_requests())
    for spelt in ("<arg_value>1e-05</arg_value>", "<arg_value>1.5e-07</arg_value>", "<arg_value>1e+16</arg_value>",
                  "<arg_value>1234567.5</arg_value>", "<arg_value>-0.0</arg_value>", "<arg_value>3.0</arg_value>",
                  '<arg_value>[1, "two", null, [true], {"k": "v\\"\\n"}]</arg_value>',
                  "<arg_value>a\nb\r\n</arg_value>",
                  "<|user|>\nstop/nothink<|assistant|>", "<|user|>\ngo /nothink /nothink<|assistant|>",
                  "<|user|>\n/nothink<|assistant|>", "<tool_call>f\n</tool_call>", "[gMASK]<sop><|system|>\n# Tools",
                  '"default": 0.5}}}}}\n{"type": "function", "function": {"name": "g"', "<think>r1</think>",
                  "<think>r2</think>", "<think></think>\nc"):
        assert spelt in text, spelt


def test_arguments_that_are_no_object_are_refused_with_xtml_s_message(tpl: xtml.Template) -> None:
    """Arguments as JSON text (the OpenAI shape), a list, a number, true:
    the template raises xtml's message; llama-server parses JSON text into
    an object before the template sees it, so only the engines that pass
    the message through are asked."""
    user = {"role": "user", "content": "q"}
    requests = [{"messages": [user, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"ok": 1}}},
        {"type": "function", "function": {"name": "f", "arguments": args}}]}]}
        for args in ('{"a": 1}', [1], 5, True, 2.5)]
    for engine in SAYS:
        need_engine(engine)
        got = render_all(engine, jinja_template(tpl.dialect), requests)
        for request, out in zip(requests, got, strict=True):
            want, why = xtml_render(tpl, request)
            assert want is None and why is not None and "give them as an object, not " in why
            assert out.text is None and (out.error or "").endswith(why), (engine, request, out, why)


def test_what_the_writer_cannot_write_is_still_refused(tpl: xtml.Template) -> None:
    """A readers' gate (what a dialect says no reader reads back) does not
    stop the export; what the export itself does not write does: pairs
    without their pattern, tools one by one outside a turn of their own, a
    condition it does not know."""
    import dataclasses

    from xtml.chat.layout import SYSTEM
    from xtml.chat.layout_pattern import Cond, Pattern

    d: Any = tpl.dialect
    assert d.render_only == ()
    gated = dataclasses.replace(d, render_only=("a head", "tools declared one by one in their own turn",
                                                "a suffix added to content", "arguments as key/value pairs",
                                                "content written where it holds more than whitespace"))
    assert jinja_template(gated) == jinja_template(d)
    odd = Pattern(source="{?odd}x{/}", items=(Cond(name="odd", negate=False, body=()),))
    for bad, says in ((dataclasses.replace(d, call_pair=None), "arguments as pairs"),
                      (dataclasses.replace(d, tools=SYSTEM), "tools one by one"),
                      (dataclasses.replace(d, head=odd), "no condition 'odd'")):
        with pytest.raises(xtml.TemplateError, match=says) as info:
            jinja_template(bad)
        assert str(info.value).endswith(f"(at {FILE.name})"), info.value


def test_export_jinja_and_the_hf_folder(tpl: xtml.Template, tmp_path: Path) -> None:
    """``xtml export jinja`` prints the template; the folder of ``xtml
    export hf``, loaded by transformers alone, renders xtml's text."""
    config, hf = hf_export(tpl, "glm-4.6", tmp_path / "glm")
    assert config["eos_token"] == "<|endoftext|>"
    texts = hf_renders(tpl, hf, corpus())
    assert texts >= N * 9 // 10, texts


def _hostile_glm() -> str:
    """The built-in GLM-4.6 file with what would close a comment, a string or a
    block in the text it adds to the other dialects': its head, the pattern
    of each tool, the suffix and the pair pattern."""
    text = FILE.read_text(encoding="utf-8")
    swaps = {'head = "[gMASK]<sop>"': "head = " + toml("[gMASK]<sop>" + braced(INJECT_SQ)),
             'each = "{tool}\\n"': "each = " + toml("{tool}" + braced(HOSTILE_TEXT) + "\n"),
             'text = "/nothink"': "text = " + toml("/nothink" + HOSTILE_TEXT),
             'pair = "<arg_key>{key}</arg_key>\\n': "pair = " + toml("<arg_key>{key}" + braced(HOSTILE_TEXT))[:-1]
             + '</arg_key>\\n'}
    for old, new in swaps.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize("engine", ENGINES)
def test_hostile_text_in_what_glm_adds_stays_text(engine: str, tmp_path: Path) -> None:
    """Each engine renders xtml's text from the exported template of a
    GLM-4.6 file whose head, tool pattern, suffix and pair pattern hold
    Jinja's delimiters, quotes and backslashes."""
    need_engine(engine)
    path = tmp_path / "hostile.toml"
    path.write_text(_hostile_glm(), encoding="utf-8")
    hostile = xtml.load(str(path))
    requests = hostile_requests(hostile)
    text = "".join(hostile.render(r).text for r in requests)
    for spelt in ("[gMASK]<sop>" + INJECT_SQ, '"string"}}}}}' + HOSTILE_TEXT, "/nothink" + HOSTILE_TEXT,
                  "<arg_key>a" + HOSTILE_TEXT):
        assert spelt in text, spelt
    got = outcomes(engine, hostile, requests, route=True)
    assert not got["bad"], got["bad"][0]
    assert got["counts"]["equal"] == len(requests), dict(got["counts"])

