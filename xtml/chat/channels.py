"""The assistant's channels: what each kind renders, means and reads back.

A template declares its channels as data (:class:`~.dialect.Channel`): their
writing order, element names and the kind each holds. The kinds are fixed
here, one message field each:

``reasoning``
    ``reasoning_content``, as the channel's text; written only when the
    request thinks.
``content``
    ``content``: text and content plugins' parts.
``tool_calls``
    ``tool_calls``: one call element per call, typed arguments, and one
    json block for arguments that are not a JSON object.

Element and attribute names inside a channel (calls, arguments) come from
the template's ``[names]``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from ..errors import MessageError, shown
from ..markup.nodes import Element, Text
from ..markup.sink import MarkupSink
from ..plugins.api import call_id, jsonfmt
from .dialect import Channel
from .request import Call, Msg, Part

_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
    "object": dict,
    "array": list,
}

# The order of the fields in a message of the normal form, whatever the
# order the channels are written in.
FIELD_ORDER = ("content", "reasoning", "tool_calls")


class RenderView(Protocol):
    """What a channel renders with (render's state)."""

    @property
    def names(self) -> Mapping[str, str]: ...

    @property
    def thinking(self) -> bool:
        """Whether the request renders thinking."""

    @property
    def json_fallback_type(self) -> str:
        """The ``type`` attribute of a json block."""

    @property
    def sink(self) -> MarkupSink: ...

    def body(self, parts: list[Part]) -> None:
        """Render text and plugin parts, in order, into the sink."""

    def content(self, parts: list[Part]) -> str | list[dict[str, Any]]:
        """Parts in normal form."""


class ReadView(Protocol):
    """What a channel reads its element back with (parse's reader)."""

    @property
    def names(self) -> Mapping[str, str]: ...

    @property
    def lenient(self) -> bool: ...

    def problem(self, el: Element | None, msg: str, kind: str, path: str = "") -> None:
        """Report a problem: strict parses raise, lenient ones record it."""

    def attrs(self, el: Element, allowed: frozenset[str], path: str) -> dict[str, str]:
        """The element's attributes, reporting unknown and repeated ones."""

    def text(self, el: Element, path: str) -> str:
        """Body text of an element that may hold only text."""

    def content(self, el: Element, path: str) -> str | list[dict[str, Any]]:
        """Text and plugin parts, in normal form."""


def in_field_order(channels: Iterable[Channel]) -> tuple[Channel, ...]:
    """``channels`` in the order their fields stand in a message dict."""
    return tuple(sorted(channels, key=lambda ch: FIELD_ORDER.index(ch.holds)))


# -- render ----------------------------------------------------------------------------


def render(ch: Channel, m: Msg, s: RenderView) -> None:
    """Emit channel ``ch`` of assistant message ``m`` (or nothing)."""
    _RENDER[ch.holds](ch.tag, m, s)


def _render_reasoning(tag: str, m: Msg, s: RenderView) -> None:
    if s.thinking:
        s.sink.element(tag, (), m.reasoning)


def _render_content(tag: str, m: Msg, s: RenderView) -> None:
    if len(m.parts) == 1 and type(m.parts[0]) is str:
        s.sink.element(tag, (), m.parts[0])
    else:
        s.sink.open(tag)
        s.body(m.parts)
        s.sink.close()


def _render_calls(tag: str, m: Msg, s: RenderView) -> None:
    if not m.calls:
        return
    s.sink.open(tag)
    for k, c in enumerate(m.calls, start=1):
        _render_call(c, k, m.index, s)
    s.sink.close()


def _render_call(c: Call, k: int, index: int, s: RenderView) -> None:
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
                except (TypeError, ValueError) as e:
                    raise MessageError(f"argument {key!r} is not JSON: {e}", index=index,
                                       path=f"tool_calls[{k - 1}].function.arguments") from None
            sink.element(arg, ((key_, key), (type_, jsonfmt.value_type(value))), text)
    sink.close()


_RENDER: dict[str, Callable[[str, Msg, RenderView], None]] = {
    "reasoning": _render_reasoning, "content": _render_content, "tool_calls": _render_calls}


# -- normal form -----------------------------------------------------------------------


def normal(holds: str, m: Msg, pos: int, s: RenderView, out: dict[str, Any]) -> None:
    """Add what the channel holding ``holds`` means to ``out``, message
    ``m``'s normal form (``pos``: its position among the request's
    messages)."""
    if holds == "content":
        out["content"] = s.content(m.parts)
    elif holds == "reasoning":
        if m.reasoning:
            out["reasoning_content"] = m.reasoning
    elif m.calls:
        out["tool_calls"] = [
            {"id": call_id(pos, k), "type": "function",
             "function": {"name": c.name, "arguments": _arguments_json(c)}}
            for k, c in enumerate(m.calls, start=1)
        ]


def _arguments_json(c: Call) -> str:
    """A call's ``arguments`` string, as parse gives it back."""
    if c.args is None:
        return c.raw or ""
    return jsonfmt.arguments(dict(c.args))


# -- read ------------------------------------------------------------------------------


def read(ch: Channel, el: Element | None, msg: dict[str, Any], r: ReadView, pos: int, path: str) -> None:
    """Read channel ``ch``'s element (None when absent) into ``msg``."""
    if ch.holds == "content":
        msg["content"] = r.content(el, f"{path}/{ch.tag}") if el is not None else ""
    elif el is None:
        return
    elif ch.holds == "reasoning":
        reasoning = r.text(el, f"{path}/{el.tag}")
        if reasoning:
            msg["reasoning_content"] = reasoning
    else:
        _read_calls(el, msg, r, pos, path)


def _read_calls(el: Element, msg: dict[str, Any], r: ReadView, pos: int, path: str) -> None:
    calls: list[dict[str, Any]] = []
    for c in el.children:
        if isinstance(c, Element) and c.tag == r.names["call"]:
            calls.append(read_call(c, pos, len(calls) + 1, f"{path}/{el.tag}", r))
        elif isinstance(c, Text) and not c.text.strip() and r.lenient:
            continue
        else:
            r.problem(el, "only calls may stand in the tools channel", "stray-content", path)
    if calls:
        msg["tool_calls"] = calls


def read_call(el: Element, pos: int, k: int, path: str, r: ReadView) -> dict[str, Any]:
    """One call element of the tools channel, read as a whole message reads
    it: the streaming parser reads each call the moment it closes."""
    n = r.names
    here = f"{path}/{n['call']}[{k}]"
    a = r.attrs(el, frozenset((n["tool"], n["index"])), here)
    name = a.get(n["tool"])
    if not name:
        r.problem(el, "a call without a tool name", "missing-attribute", here)
        name = name or ""
    got = a.get(n["index"])
    if got != str(k):
        r.problem(el, f"call index {shown(got) if got is not None else None}, expected {str(k)!r}", "bad-index",
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
            r.problem(blocks[0], f"a json block holds {why}, which does not render back: {shown(arguments)}",
                      "bad-argument", f"{here}/{n['json']}")
    else:
        args: dict[str, Any] = {}
        for c in el.children:
            if isinstance(c, Element) and c.tag == n["argument"]:
                key, value = _read_argument(c, f"{here}/{n['argument']}", r)
                if key in args:
                    r.problem(c, f"argument {key!r} given twice", "duplicate-argument", here)
                args[key] = value
            elif isinstance(c, Text) and not c.text.strip() and r.lenient:
                continue
            else:
                r.problem(el, "only arguments may stand in a call", "stray-content", here)
        arguments = jsonfmt.arguments(args)
    return {"id": call_id(pos, k), "type": "function", "function": {"name": name, "arguments": arguments}}


def _read_argument(el: Element, path: str, r: ReadView) -> tuple[str, Any]:
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
        r.problem(el, f"argument {key!r} of type {typ} is not standard JSON ({e}): {shown(raw)}",
                  "bad-argument", path)
        return key, raw
    except json.JSONDecodeError:
        r.problem(el, f"argument {key!r} of type {typ} is not JSON: {shown(raw)}", "bad-argument", path)
        return key, raw
    if not isinstance(value, want) or (typ == "number" and isinstance(value, bool)):
        r.problem(el, f"argument {key!r} is not a {typ}: {shown(raw)}", "bad-argument", path)
        return key, raw
    return key, value


def _not_a_block(text: str) -> str:
    """Why a json block's text would not render as a json block again, or ''.

    Only text that is not JSON goes into the block; JSON that is not an
    object, and JSON only Python's decoder reads, is refused by render."""
    try:
        value = jsonfmt.loads(text)
    except jsonfmt.NotStandard:
        return "JSON that is not standard"
    except ValueError:
        return ""
    return "" if type(value) is dict else "JSON that is not an object"
