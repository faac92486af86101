"""A layout format that folds tool results into the turn that called for
them (spec.md §12), and the values a value syntax writes for it.

Such a format writes an assistant's calls, then each tool result of the run
that follows (``[calls] result``), then its content, in one turn; a turn
with calls and no results ends with ``[calls] pending`` instead of its close,
one with results and no content may stay open, and the next message of a
role in ``[roles] continue`` goes on in it. Tool declarations and call
arguments may be written by a value syntax (an ``xtml.value_syntaxes``
entry point the dialect names): its text is lexed on the dialect's tokens,
and a request string that spells one of them there is refused, so every
token written is the syntax's own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import MessageError, RequestError
from ..lru import Lru
from ..plugins.values import load_value_syntax
from .layout import HISTORY, LayoutDialect
from .layout_pattern import Builder, Pattern, Value
from .layout_request import Dropped, Msg

__all__ = ["declaration", "declared_by_syntax", "fold"]

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def declared_by_syntax(d: LayoutDialect, tools: list[Any], dropped: list[Dropped]) -> Value:
    """The tools as the dialect's value syntax declares them, lexed on the
    dialect's tokens; each keyword of a parameter's schema the declaration
    does not write reported as a drop of ``tools``."""
    finder = d.finder()
    for i, t in enumerate(tools):
        at = _spelled(t, finder)
        if at is not None:
            raise RequestError(f"a tool's text spells one of the {d.name} format's tokens, which its declaration "
                               "writes as tokens", location=f"tools[{i}]{at}")
    text = declaration(d, tools)
    if d.tools_keywords:
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, Mapping) else None
            params = fn.get("parameters") if isinstance(fn, Mapping) else None
            props = params.get("properties") if isinstance(params, Mapping) else None
            for name, schema in props.items() if isinstance(props, Mapping) else ():
                for k in schema if isinstance(schema, Mapping) else ():
                    if k not in d.tools_keywords:
                        dropped.append(Dropped(-1, "tools", f"tools[{i}]: the declaration does not write {k!r} of "
                                                            f"the parameter {name!r}"))
    return _lexed(finder, text)


def declaration(d: LayoutDialect, tools: Sequence[Any]) -> str:
    """What the dialect's value syntax declares ``tools`` as. A declaration
    is a function of the tools' content, and a client sends the same tools
    with every request, which render both writes and reads back: each
    declaration made is kept by that content, exactly (a value of a type
    other than JSON's is declared each time)."""
    syntax = load_value_syntax(d.tools_syntax)
    content = _content(tools)
    if content is None:
        return syntax.declare(tools)
    key = (d.tools_syntax, content)
    text = _declared.get(key)
    if text is None:
        text = syntax.declare(tools)
        if len(text) <= _DECLARED_TEXT:
            _declared.put(key, text)
    return text


_declared: Lru[tuple[str, tuple[Any, ...]], str] = Lru(32)
_DECLARED_TEXT = 65_536
"""The longest declaration kept: the cache holds the few tool sets clients
send, not one request's of any size."""


def _content(value: Any) -> tuple[Any, ...] | None:
    """A key equal for two values only if they are alike in every type and
    every character (a float by its repr: ``-0.0`` is not ``0.0``); None
    for a value holding another type than JSON's (or a subclass), a key
    that is not a string, or more text than a kept declaration (what the
    declaration leaves out of a schema is in the key too)."""
    out: list[Any] = []
    stack = [value]
    size = 0
    while stack:
        v = stack.pop()
        t = type(v)
        if t is str:
            out += (t, v)
            size += len(v)
        elif t is int or t is bool or v is None:
            out += (t, v)
        elif t is float:
            out += (t, repr(v))
        elif t is dict:
            out += (t, len(v))
            for k, x in v.items():
                if type(k) is not str:
                    return None
                out.append(k)
                size += len(k)
                stack.append(x)
        elif t is list or t is tuple:
            out += (t, len(v))
            stack.extend(v)
        else:
            return None
        if size > _DECLARED_TEXT:
            return None
    return tuple(out)


def fold(d: LayoutDialect, msgs: Sequence[Msg], resolved: Mapping[str, Any], conds: Mapping[str, bool],
         b: Builder, dropped: list[Dropped]) -> None:
    """Writes the messages (those the system turn holds aside) and the
    generation prompt of a format that folds results into the calling turn."""
    last_user = max((k for k, m in enumerate(msgs) if m.role == "user"), default=-1)
    prev = ""  # the role of the last message written, tool results aside
    calls_before = False
    named: set[int] = set()  # results whose name is the one written
    for k, m in enumerate(msgs):
        if m.role == "tool":
            if not calls_before:
                dropped.append(Dropped(m.at, "content", f"the {d.name} format writes a tool result only right "
                                                        "after the calls it answers"))
            continue
        calls_before = bool(m.calls)
        results = _results(d, msgs, k, named) if m.calls else []
        frame = d.role_frames.get(m.role)
        opening, closing = (d.frame_open, d.frame_close) if frame is None else (frame.open, frame.close)
        mc = {**conds, "after_user": prev == "user", "after_tool": k > 0 and msgs[k - 1].role == "tool",
              "has_calls": bool(m.calls)}
        if not (m.role in d.continues and prev == m.role):
            opening.render({"role": d.roles[m.role].text}, mc, b)
        prev = m.role
        text = _text(d, m, dropped)
        body = d.roles[m.role].body
        if m.role == "assistant":
            _answer(d, m, k > last_user, text, results, mc, body, b, dropped)
        else:
            body.render({"content": text, "tool_call_id": ""}, mc, b)
        if m.calls and not results and d.calls_pending is not None:
            d.calls_pending.render({}, mc, b)
        elif not (results and d.results_open and not (m.raw or {}).get("content")):
            closing.render({}, mc, b)
    if named:
        dropped[:] = [x for x in dropped if not (x.field == "name" and x.message in named)]
    if resolved["add_generation_prompt"]:
        pc = {**conds, "after_user": prev == "user", "after_calls": calls_before}
        probe = Builder()
        d.prompt.render({}, pc, probe)
        if not probe.finish():
            dropped.append(Dropped(-1, "add_generation_prompt", f"the {d.name} format writes no generation prompt "
                                                                "after a turn with calls"))
        d.prompt.render({}, pc, b)


def _answer(d: LayoutDialect, m: Msg, after_last_user: bool, text: str, results: list[tuple[str, str]],
            mc: Mapping[str, bool], body: Pattern, b: Builder, dropped: list[Dropped]) -> None:
    raw = m.raw or {}
    history = d.reasoning == HISTORY  # else the request's reading reports reasoning dropped
    for k in _REASONING_KEYS if history else ():
        if k in raw and not isinstance(raw[k], str):
            raise MessageError("reasoning must be a string", index=m.at, path=k)
    # The first field holding text, in the order the template reads them.
    key = next((k for k in d.reasoning_keys or _REASONING_KEYS if raw.get(k)), None) if history else None
    r: str = raw[key] if key is not None else ""
    written: list[bool] = []

    def reasoning(out: Builder) -> None:
        written.append(True)
        out.text(r)

    each, result = d.calls_each, d.call_result
    assert each is not None and result is not None
    raw_calls = (m.raw or {}).get("tool_calls") or ()

    def calls(out: Builder) -> None:
        for j, (name, args) in enumerate(m.calls):
            given = _given(raw_calls[j])
            value: Value = args
            if d.calls_syntax and not isinstance(given, str):
                value = _syntax_arguments(d, m, j, given)
            each.render({"name": name, "arguments": value, "id": ""},
                        {**mc, "first": j == 0, "has_content": bool(text), "string": isinstance(given, str)}, out)

    def folded(out: Builder) -> None:
        for name, content in results:
            result.render({"name": name, "content": content}, mc, out)

    show = after_last_user and bool(r)
    body.render({"content": text, "reasoning": reasoning, "calls": calls, "results": folded},
                {**mc, "show_reasoning": show, "has_text": bool(text.strip())}, b)
    for k in _REASONING_KEYS if history else ():
        if raw.get(k) and (not written or raw[k] != r):
            dropped.append(Dropped(m.at, k, f"the {d.name} format writes one reasoning field, only beside calls "
                                            "after the last user message"))


def _given(call: Any) -> Any:
    fn = call.get("function", call) if isinstance(call, Mapping) else {}
    return fn.get("arguments") if isinstance(fn, Mapping) else None


def _syntax_arguments(d: LayoutDialect, m: Msg, j: int, given: Any) -> Value:
    """An object's arguments as the dialect's value syntax writes them."""
    finder = d.finder()
    where = f"tool_calls[{j}].function.arguments"
    at = _spelled(given, finder)
    if at is not None:
        raise MessageError(f"an argument spells one of the {d.name} format's tokens, which its value syntax "
                           "writes as tokens", index=m.at, path=where + at)
    try:
        text = load_value_syntax(d.calls_syntax).write(given, {})
    except RequestError as e:
        tail = e.location.removeprefix("arguments") if e.location else ""
        raise MessageError(e.msg, index=m.at, path=where + tail) from None
    return _lexed(finder, text)


def _results(d: LayoutDialect, msgs: Sequence[Msg], k: int, named: set[int]) -> list[tuple[str, str]]:
    """The run of tool results after the calls of ``msgs[k]``: each with the
    name of the call whose id its ``tool_call_id`` is (the last such), else
    its own name; neither is refused, as the template raises on it."""
    m = msgs[k]
    raw_calls = (m.raw or {}).get("tool_calls") or ()
    # Each id's last call, once: ids are strings or absent (None).
    by_id = {c.get("id"): m.calls[j][0] for j, c in enumerate(raw_calls) if isinstance(c, Mapping)}
    out: list[tuple[str, str]] = []
    for t in msgs[k + 1:]:
        if t.role != "tool":
            break
        raw = t.raw or {}
        own = raw.get("name")
        key = raw.get("tool_call_id")
        name = by_id.get(key, own) if key is None or isinstance(key, str) else own
        if not isinstance(name, str):
            raise MessageError(f"the {d.name} format writes a tool result under the name of the call it answers: "
                               "no call before it has this tool_call_id and the result has no name (the template "
                               "raises)", index=t.at, path="tool_call_id")
        if raw.get("content") is None:
            raise MessageError(f"the {d.name} format writes a tool result's content as text: the template would "
                               "print None", index=t.at, path="content")
        if name == own:
            named.add(t.at)
        out.append((name, "".join(_pieces(t, raw["content"]))))
    return out


def _pieces(m: Msg, content: Any) -> list[str]:
    """A string content, or each text part's text (the template writes no
    other part)."""
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    for j, p in enumerate(content or ()):
        if not isinstance(p, Mapping) or p.get("type") != "text" or not isinstance(p.get("text"), str):
            raise MessageError("only text parts ({\"type\": \"text\", \"text\": ...}) are written by this format",
                               index=m.at, path=f"content[{j}]")
        out.append(p["text"])
    return out


def _text(d: LayoutDialect, m: Msg, dropped: list[Dropped]) -> str:
    """A message's content as written: each piece cut (an answer's, where
    the format cuts text out of it) and trimmed where its role's is, then
    joined."""
    pieces = _pieces(m, (m.raw or {}).get("content"))
    strip = d.content_strip if m.role == "assistant" else None
    if strip is not None and any(strip[0] in p or strip[1] in p for p in pieces):
        dropped.append(Dropped(m.at, "content", f"text between {strip[0]} and {strip[1]} is not written"))
        pieces = ["".join(x.split(strip[0], 1)[0] for x in p.split(strip[1])) for p in pieces]
    if m.role in d.content_trim:
        pieces = [p.strip() for p in pieces]
    return "".join(pieces)


def _spelled(value: Any, finder: re.Pattern[str]) -> str | None:
    """Where in ``value`` (a path suffix: ``.key``, ``[0]``) a string or a
    key spells one of the tokens ``finder`` finds; None if none does."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, at = stack.pop()
        if isinstance(v, str):
            if finder.search(v):
                return at
        elif isinstance(v, Mapping):
            for key, x in v.items():
                here = f"{at}.{key}"
                if isinstance(key, str) and finder.search(key):
                    return here
                stack.append((x, here))
        elif isinstance(v, list | tuple):
            stack.extend((x, f"{at}[{j}]") for j, x in enumerate(v))
    return None


def _lexed(finder: re.Pattern[str], text: str) -> Callable[[Builder], None]:
    """Text a value syntax wrote, each of the dialect's tokens in it a token."""

    def write(out: Builder) -> None:
        at = 0
        for hit in finder.finditer(text):
            out.text(text[at:hit.start()])
            out.token(hit.group())
            at = hit.end()
        out.text(text[at:])
    return write
