"""The probe the Jinja export's tests render through each engine: a
template that writes, with the engine's own ``tojson``, every variable the
engine hands it; and the request shapes and numbers each engine takes as
xtml does (the list of what each changes is in tests/helpers/jinja_engines.py
and docs/exports.md)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import jinja2

import xtml
from tests.helpers.jinja_engines import Rendered

OPTIONS = ("thinking", "enable_thinking", "thinking_effort", "reasoning_effort", "tool_choice", "response_format",
           "response_schema", "image_prompts", "continue_final_message")
UNDEFINED = "__xtml_undefined__"

# Every variable the template reads, as the engine hands it over.
PROBE = "{{- {" + ", ".join(
    f"'{v}': ({v} if {v} is defined else '{UNDEFINED}')"
    for v in ("messages", "tools", "add_generation_prompt", *OPTIONS)) + "} | tojson -}}"

# llama-server refuses at start-up a template it cannot derive an output
# parser from (the probe's JSON is none); the K3 markers in a comment route
# it to llama.cpp's hand-written K3 parser (common/chat.cpp matches them in
# the template's source), which takes any template.
LLAMACPP_PROBE = "{#- <|open|> <|close|> <|end_of_msg|> -#}" + PROBE


ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def in_range(engine: str, x: float) -> bool:
    """Whether the engine prints float ``x`` as Python does (docs/exports.md):
    JavaScript switches to an exponent below 1e-6 and from 1e21, Python
    below 1e-4 and from 1e16; llama.cpp prints six significant digits, with
    an exponent from 1e6."""
    a = abs(x)
    if engine == "transformers":
        return True
    if a == 0:
        # llama.cpp prints -0.0 as "-0", which reads back as the integer 0.
        return engine != "llamacpp" or math.copysign(1.0, x) > 0
    if engine == "hfjs":
        return 1e-4 <= a < 1e16
    return 1e-4 <= a < 1e6 and float(f"{x:.6g}") == x


def numbers_in_range(engine: str, v: Any) -> Any:
    """``v`` with each number the engine cannot print as xtml does replaced
    by one it can (integers: JavaScript keeps 53 bits, llama.cpp 64), and,
    for JavaScript, object keys without characters past U+FFFF: it sorts
    strings by UTF-16 code unit, so such a key sorts before one with a
    character from U+E000 to U+FFFF, where Python's code-point order puts it
    after (docs/exports.md)."""
    if isinstance(v, dict):
        if engine == "hfjs":
            v = {ASTRAL.sub("x", k): x for k, x in v.items()}
        return {k: numbers_in_range(engine, x) for k, x in v.items()}
    if isinstance(v, list):
        return [numbers_in_range(engine, x) for x in v]
    if isinstance(v, bool) or not isinstance(v, int | float):
        return v
    if isinstance(v, int):
        bits = {"transformers": None, "hfjs": 53, "llamacpp": 63}[engine]
        return v if bits is None or abs(v) < 2**bits else (1 if v > 0 else -1)
    return v if in_range(engine, v) else (0.5 if v > 0 else -0.5)


def llamacpp_shape(request: dict[str, Any]) -> dict[str, Any]:
    """A request in the shapes llama-server's OpenAI reader takes
    (tools/server/server-common.cpp, common/chat.cpp): text parts typed
    "text" (no bare strings, no "input_text"), content present on every
    message but an assistant's with calls, calls and tools in the chat form
    ({"type": "function", "function": {...}}), no image or media parts (the
    tiny model has no projector). The same request, as a client of
    llama-server writes it; other engines take the generated shapes as they
    are."""
    def part(p: Any) -> Any:
        if isinstance(p, str):
            return {"type": "text", "text": p}
        if isinstance(p, dict) and p.get("type") == "input_text":
            return {**p, "type": "text"}
        return p

    msgs = []
    for m in request["messages"]:
        m = dict(m)
        c = m.get("content")
        if isinstance(c, list):
            c = [part(p) for p in c if not (isinstance(p, dict) and p.get("type") not in ("text", "input_text"))]
            m["content"] = c
        if m.get("content") is None and not m.get("tool_calls"):
            m["content"] = ""
        if m.get("tool_calls"):
            m["tool_calls"] = [c if "function" in c else {"type": "function", "function": {
                k: v for k, v in c.items() if k in ("name", "arguments")}, **({"id": c["id"]} if "id" in c else {})}
                for c in m["tool_calls"]]
            m["tool_calls"] = [{**c, "type": "function"} for c in m["tool_calls"]]
        if isinstance(m.get("tools"), list):
            m["tools"] = [chat_tool(t) for t in m["tools"]]
        msgs.append(m)
    out = {**request, "messages": msgs}
    if isinstance(out.get("tools"), list):
        out["tools"] = [chat_tool(t) for t in out["tools"]]
    out.pop("image_prompts", None)
    return out


def chat_tool(t: Any) -> Any:
    if isinstance(t, dict) and "function" not in t:
        return {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
    return t


def handed(got: Rendered) -> dict[str, Any] | None:
    """The request the engine handed the template (read by :data:`PROBE`),
    or None when the engine refused it before any template ran."""
    if got.text is None:
        return None
    seen = json.loads(got.text)
    return {k: v for k, v in seen.items() if v != UNDEFINED}


def xtml_render(tpl: xtml.Template, request: dict[str, Any]) -> tuple[str | None, str | None]:
    try:
        return tpl.render(request).text, None
    except xtml.XtmlError as e:
        return None, str(e)


SPLIT = "@@xtml-probe@@"


def probed(template: str) -> str:
    """``template``, then (only when the request sets ``xtml_probe``) the
    probe's JSON: one render gives the text and what the engine handed that
    very template. llama.cpp hands a template what it has found the template
    can take (parts or joined text, arguments as objects or strings), by
    rendering test conversations, which do not set ``xtml_probe``."""
    return (template + "{%- if xtml_probe is defined and xtml_probe -%}{{ '" + SPLIT + "' }}" + PROBE
            + "{%- endif -%}")


# The engines that pass raise_exception's message through unchanged
# (llama.cpp wraps it in a parser-generation error).
SAYS = ("transformers", "hfjs")


def toml(value: Any) -> str:
    """A string, a list of them or a table of them in TOML (a JSON string is
    a TOML basic string)."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml(k)} = {toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def strings(source: str) -> list[str]:
    return [value for _, kind, value in jinja2.Environment().lex(source) if kind == "string"]
