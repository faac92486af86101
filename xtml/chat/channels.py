"""The assistant's channels: think, response and tools (with its calls,
typed arguments and the json fallback block), as plugins.

A template lists its channels, in writing order, in ``[channels] order``;
each name is a plugin found through the ``xtml.plugins`` entry points like
any other. A channel extension renders its part of an assistant message,
states it in the normal form, and reads its element back into the message.
Element and attribute names come from the template's ``[names]``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import MessageError, TemplateError
from ..markup.nodes import Element, Text
from ..plugins.api import (
    CallView,
    ChannelExtension,
    MessageView,
    ReadView,
    RenderView,
    arguments_json,
    call_id,
    jsonfmt,
)

_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
    "object": dict,
    "array": list,
}


class _Plugin:
    def __init__(self, ext: ChannelExtension) -> None:
        self.name = ext.name
        self.ext = ext

    def configure(self, settings: Mapping[str, Any], where: str) -> ChannelExtension:
        if settings:
            raise TemplateError(f"the {self.name} channel takes no settings", location=where)
        return self.ext


class Think(ChannelExtension):
    name = "think"
    field_order = 1

    def render(self, m: MessageView, s: RenderView) -> None:
        if s.thinking:
            s.sink.element(s.names["think"], (), m.reasoning)

    def normal(self, m: MessageView, pos: int, s: RenderView, out: dict[str, Any]) -> None:
        if m.reasoning:
            out["reasoning_content"] = m.reasoning

    def read(self, el: Element | None, msg: dict[str, Any], r: ReadView, pos: int, path: str) -> None:
        if el is not None:
            reasoning = r.text(el, f"{path}/{el.tag}")
            if reasoning:
                msg["reasoning_content"] = reasoning


class Response(ChannelExtension):
    name = "response"
    field_order = 0

    def render(self, m: MessageView, s: RenderView) -> None:
        tag = s.names["response"]
        if len(m.parts) == 1 and type(m.parts[0]) is str:
            s.sink.element(tag, (), m.parts[0])
        else:
            s.sink.open(tag)
            s.body(m.parts)
            s.sink.close()

    def normal(self, m: MessageView, pos: int, s: RenderView, out: dict[str, Any]) -> None:
        out["content"] = s.content(m.parts)

    def read(self, el: Element | None, msg: dict[str, Any], r: ReadView, pos: int, path: str) -> None:
        msg["content"] = r.content(el, f"{path}/{r.names['response']}") if el is not None else ""


class Tools(ChannelExtension):
    """Calls with typed arguments; arguments that are not JSON go whole into
    one json block."""

    name = "tools"
    field_order = 2

    def render(self, m: MessageView, s: RenderView) -> None:
        if not m.calls:
            return
        s.sink.open(s.names["tools"])
        for k, c in enumerate(m.calls, start=1):
            self._call(c, k, m.index, s)
        s.sink.close()

    def _call(self, c: CallView, k: int, index: int, s: RenderView) -> None:
        n, sink = s.names, s.sink
        sink.open(n["call"], ((n["tool"], c.name), (n["index"], str(k))))
        if c.args is None:
            sink.element(n["json"], ((n["type"], s.json_fallback_type),), c.raw or "")
        else:
            key_, type_, arg = n["key"], n["type"], n["argument"]
            for key, value in c.args:
                if type(value) is str:
                    text = value
                else:
                    try:
                        text = jsonfmt.value(value)
                    except (TypeError, ValueError, RecursionError) as e:
                        raise MessageError(f"argument {key!r} is not JSON: {e}", index=index,
                                           path=f"tool_calls[{k - 1}].function.arguments") from None
                sink.element(arg, ((key_, key), (type_, jsonfmt.value_type(value))), text)
        sink.close()

    def normal(self, m: MessageView, pos: int, s: RenderView, out: dict[str, Any]) -> None:
        if m.calls:
            out["tool_calls"] = [
                {"id": call_id(pos, k), "type": "function",
                 "function": {"name": c.name, "arguments": arguments_json(c)}}
                for k, c in enumerate(m.calls, start=1)
            ]

    def read(self, el: Element | None, msg: dict[str, Any], r: ReadView, pos: int, path: str) -> None:
        if el is None:
            return
        calls: list[dict[str, Any]] = []
        for c in el.children:
            if isinstance(c, Element) and c.tag == r.names["call"]:
                calls.append(self._read_call(c, pos, len(calls) + 1, f"{path}/{el.tag}", r))
            elif isinstance(c, Text) and not c.text.strip() and r.lenient:
                continue
            else:
                r.problem(el, "only calls may stand in the tools channel", "stray-content", path)
        if calls:
            msg["tool_calls"] = calls

    def _read_call(self, el: Element, pos: int, k: int, path: str, r: ReadView) -> dict[str, Any]:
        n = r.names
        here = f"{path}/{n['call']}[{k}]"
        a = r.attrs(el, frozenset((n["tool"], n["index"])), here)
        name = a.get(n["tool"])
        if not name:
            r.problem(el, "a call without a tool name", "missing-attribute", here)
            name = name or ""
        got = a.get(n["index"])
        if got != str(k):
            r.problem(el, f"call index {_show(got) if got is not None else None}, expected {str(k)!r}", "bad-index",
                      here)
        blocks = [c for c in el.children if isinstance(c, Element) and c.tag == n["json"]]
        arguments: str
        if blocks:
            if len(el.children) != 1:
                r.problem(el, "a json block must be the only thing in a call", "stray-content", here)
            arguments = r.text(blocks[0], f"{here}/{n['json']}")
            why = _not_a_block(arguments)
            if why:
                # Rendered again, such text would be refused (K3's rule for
                # JSON that is not an object), so say so now.
                r.problem(blocks[0], f"a json block holds {why}, which does not render back: {_show(arguments)}",
                          "bad-argument", f"{here}/{n['json']}")
        else:
            args: dict[str, Any] = {}
            for c in el.children:
                if isinstance(c, Element) and c.tag == n["argument"]:
                    key, value = self._read_argument(c, f"{here}/{n['argument']}", r)
                    if key in args:
                        r.problem(c, f"argument {key!r} given twice", "duplicate-argument", here)
                    args[key] = value
                elif isinstance(c, Text) and not c.text.strip() and r.lenient:
                    continue
                else:
                    r.problem(el, "only arguments may stand in a call", "stray-content", here)
            arguments = jsonfmt.arguments(args)
        return {"id": call_id(pos, k), "type": "function", "function": {"name": name, "arguments": arguments}}

    def _read_argument(self, el: Element, path: str, r: ReadView) -> tuple[str, Any]:
        n = r.names
        a = r.attrs(el, frozenset((n["key"], n["type"])), path)
        key = a.get(n["key"])
        if key is None:
            r.problem(el, "an argument without a key", "missing-attribute", path)
            key = ""
        typ = a.get(n["type"], "string")
        if n["type"] not in a:
            r.problem(el, f"argument {key!r} without a type", "missing-attribute", path)
        raw = r.text(el, path)
        if typ == "string":
            return key, raw
        want = _JSON_TYPES.get(typ)
        if want is None:
            r.problem(el, f"argument {key!r} has unknown type {typ!r}", "bad-argument", path)
            return key, raw
        # Standard JSON only: Python's decoder also reads NaN, Infinity and
        # 1e999, which would make ``arguments`` text that other JSON readers,
        # and this template's render, refuse. Lenient parses keep such a
        # value as the string it is.
        try:
            value = jsonfmt.loads(raw)
        except jsonfmt.NotStandard as e:
            r.problem(el, f"argument {key!r} of type {typ} is not standard JSON ({e}): {_show(raw)}",
                      "bad-argument", path)
            return key, raw
        except (json.JSONDecodeError, RecursionError):
            r.problem(el, f"argument {key!r} of type {typ} is not JSON: {_show(raw)}", "bad-argument", path)
            return key, raw
        if not isinstance(value, want) or (typ == "number" and isinstance(value, bool)):
            r.problem(el, f"argument {key!r} is not a {typ}: {_show(raw)}", "bad-argument", path)
            return key, raw
        return key, value


def _show(text: str) -> str:
    """The start of a value, for a message (a value may be megabytes)."""
    return repr(text[:40]) + (f"… ({len(text):,} characters)" if len(text) > 40 else "")


def read_call(el: Element, pos: int, k: int, path: str, r: ReadView) -> dict[str, Any]:
    """One call element of the tools channel, read as a whole message reads
    it: the streaming parser reads each call the moment it closes."""
    return _TOOLS._read_call(el, pos, k, path, r)


_TOOLS = Tools()
think = _Plugin(Think())
response = _Plugin(Response())
tools = _Plugin(_TOOLS)


def _not_a_block(text: str) -> str:
    """Why a json block's text would not render as a json block again, or ''.

    Only text that is not JSON goes into the block; JSON that is not an
    object, and JSON only Python's decoder reads, is refused by render."""
    try:
        value = jsonfmt.loads(text)
    except jsonfmt.NotStandard:
        return "JSON that is not standard"
    except (ValueError, RecursionError):
        return ""
    return "" if type(value) is dict else "JSON that is not an object"
