"""Render, normal form and parse of a layout dialect with ``[turns]``
(:mod:`.layout_turn`): a head, a system turn the format always writes, the
tool declarations in it or in the first user message, one call per
assistant turn (JSON, or a built-in tool's call after its token), and
options that are text or lists of names. Everything here reads the
dialect's patterns; nothing names a model family."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import MessageError, OptionError, ParseError, RequestError, shown
from ..lru import Lru
from ..plugins import jsonfmt
from .layout import LayoutDialect
from .layout_parse import Lexed, _made, _Repairs, _shifted, _text, first_of
from .layout_pattern import (
    ANY_TEXT,
    CODECS,
    TOKEN_BASE,
    Builder,
    Cond,
    Item,
    Lit,
    Pattern,
    Slot,
    Tok,
    Value,
    slot_codec,
)
from .layout_render import Rendering
from .layout_request import Dropped, Msg, read_request
from .layout_turn import KEEP, STRING, STRINGS, CallTurn, TextOption, TurnLayout

__all__ = ["normal_form_turns", "parse_completion_turns", "parse_prompt_turns", "render_turns"]


# -- reading the request ---------------------------------------------------------------------


def _text_options(t: TurnLayout, opts: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, o in t.options.items():
        v = opts.get(name)
        if v is None:
            out[name] = o.default
            continue
        if o.type == STRING:
            if not isinstance(v, str):
                raise OptionError(f"{name} must be a string", option=name)
            _no_surrogates(v, name)
        else:
            if not isinstance(v, list | tuple) or not all(isinstance(x, str) for x in v):
                raise OptionError(f"{name} must be a list of strings", option=name)
            for x in v:
                _no_surrogates(x, name)
            v = list(v)
        out[name] = v
    return out


def _no_surrogates(s: str, option: str) -> None:
    if any("\ud800" <= ch <= "\udfff" for ch in s):
        raise OptionError(f"{option} holds a lone surrogate: text must be valid Unicode", option=option)


def _tools(opts: Mapping[str, Any]) -> list[Any] | None:
    # The template tests whether tools were given, not whether any were:
    # an empty list still writes the environment line.
    tools = opts.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list | tuple):
        raise OptionError("tools must be a list of tool schemas", option="tools")
    return list(tools)


def _slot_value(o: TextOption, v: Any) -> str:
    if o.type == STRING:
        return str(v)
    return o.join.join(x for x in v or () if x not in o.omit)


def _conds(d: LayoutDialect, resolved: Mapping[str, Any], text: Mapping[str, Any]) -> dict[str, bool]:
    conds = {k: bool(resolved[k]) for k in d.options}
    t = d.header_turns
    assert t is not None
    conds.update({k: text[k] is not None for k, o in t.options.items() if o.type == STRINGS})
    return conds


def _dump(t: TurnLayout, tool: Any) -> str:
    try:
        return json.dumps(tool, ensure_ascii=False, indent=t.tool_indent)
    except (TypeError, ValueError) as e:
        raise OptionError(f"a tool is not JSON: {e}", option="tools") from None


def _coded(p: Pattern, name: str, value: str) -> str:
    codec = slot_codec(p, name)
    return CODECS[codec](value) if codec else value


def _kept_parts(m: Msg) -> list[Any] | None:
    """A list of parts kept for a body that writes it as JSON."""
    raw = m.raw or {}
    content = raw.get("content")
    if not isinstance(content, list | tuple):
        return None

    def walk(x: Any) -> None:
        if isinstance(x, str):
            if any("\ud800" <= ch <= "\udfff" for ch in x):
                raise MessageError("a lone surrogate: text must be valid Unicode", index=m.at, path="content")
        elif isinstance(x, Mapping):
            for v in x.values():
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)
    walk(content)
    try:
        return list(json.loads(json.dumps(list(content), ensure_ascii=False)))
    except (TypeError, ValueError) as e:
        raise MessageError(f"content parts that are not JSON: {e}", index=m.at, path="content") from None


def _call_fields(call: Any) -> tuple[str, Any]:
    fn = call.get("function", call)
    return fn["name"], fn.get("arguments")


def _is_builtin(t: TurnLayout, text: Mapping[str, Any], name: str) -> bool:
    c = t.calls
    return c.builtin is not None and text.get(c.builtin_when) is not None and name in text[c.builtin_when]


# -- render ----------------------------------------------------------------------------------


def render_turns(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> Rendering:
    msgs, resolved, dropped, opts = read_request(d, request, options)
    t = d.header_turns
    assert t is not None
    text = _text_options(t, opts)
    conds = _conds(d, resolved, text)
    tools = _tools(opts)
    b = Builder()
    t.head.render({}, conds, b)
    has_system = msgs[0].role == "system"
    rest = msgs[1:] if has_system else msgs
    in_user = tools is not None and t.tools_user is not None and conds.get(t.tools_user_when, False)

    def each_tool(out: Builder) -> None:
        for tool in tools or ():
            t.tool.render({"tool": _dump(t, tool)}, conds, out)

    def in_system(out: Builder) -> None:
        if t.tools_system is not None:
            t.tools_system.render({"tools": each_tool}, conds, out)

    values: dict[str, Value] = {name: _slot_value(o, text[name]) for name, o in t.options.items()}
    values.update({"system": msgs[0].content if has_system else "", "tools": in_system})
    t.system.render(values, {**conds, "has_tools": tools is not None, "has_system": has_system}, b)
    if in_user:
        assert t.tools_user is not None
        if not rest:
            raise RequestError(f"the tools go into the first user message ({t.tools_user_when}), and there is no "
                               "message after the system message", location="messages")
        first, rest = rest[0], rest[1:]
        raw = first.raw or {}
        if isinstance(raw.get("content"), list | tuple):
            raise MessageError("the first user message holds the tools and writes its content as one string: a "
                               "list of parts is not read", index=first.at, path="content")
        if first.role != "user":
            dropped.append(Dropped(first.at, "role", "the first message after the system message is written as the "
                                                     "user message that holds the tools"))
        if raw.get("tool_calls"):
            dropped.append(Dropped(first.at, "tool_calls", "the user message that holds the tools writes no calls"))
        t.tools_user.render({"tools": each_tool, "content": first.content}, conds, b)
    for m in rest:
        _message(d, t, m, conds, text, b, dropped)
    if resolved["add_generation_prompt"]:
        d.prompt.render({}, conds, b)
    return Rendering(b.finish(), tuple(dropped), {**resolved, **text}, opts)


def _message(d: LayoutDialect, t: TurnLayout, m: Msg, conds: Mapping[str, bool], text: Mapping[str, Any],
             b: Builder, dropped: list[Dropped]) -> None:
    raw = m.raw or {}
    r = d.roles[m.role]
    d.frame_open.render({"role": r.text}, conds, b)
    if m.role == "assistant" and "tool_calls" in raw:
        _call_turn(d, t, m, conds, text, b, dropped)
        return
    parts = _kept_parts(m) if d.parts_by_role.get(m.role) == KEEP else None
    value: Value = m.content
    if parts is not None:
        dumped = json.dumps(parts, ensure_ascii=False)

        def value(out: Builder) -> None:
            out.text(dumped)
    r.body.render({"content": value}, conds, b)
    d.frame_close.render({}, conds, b)


def _call_turn(d: LayoutDialect, t: TurnLayout, m: Msg, conds: Mapping[str, bool], text: Mapping[str, Any],
               b: Builder, dropped: list[Dropped]) -> None:
    c = t.calls
    calls = (m.raw or {})["tool_calls"]
    if not isinstance(calls, list | tuple):
        raise MessageError("tool_calls must be a list", index=m.at, path="tool_calls")
    if c.max and not 1 <= len(calls) <= c.max:
        raise MessageError(f"the {d.name} format writes {c.max} tool call{'s' if c.max > 1 else ''} per assistant "
                           f"message at most and at least one, not {len(calls)} (its template raises)",
                           index=m.at, path="tool_calls")
    if m.content and c.content == "drop":
        dropped.append(Dropped(m.at, "content", "the content beside a tool call is not written"))
    for j, call in enumerate(calls):
        name, args = _call_fields(call)
        where = f"tool_calls[{j}].function.arguments"
        if _is_builtin(t, text, name):
            assert c.builtin is not None and c.builtin_argument is not None
            if not isinstance(args, Mapping):
                raise MessageError(f"a call to the built-in tool {shown(name)} needs its arguments as an object "
                                   "(the template reads them as pairs)", index=m.at, path=where)
            for k, v in args.items():
                if not isinstance(v, str):
                    raise MessageError(f"a built-in tool's argument values are strings (the template adds them to "
                                       f"text), not {type(v).__name__}", index=m.at, path=f"{where}.{k}")
            c.builtin.render({"name": name, "arguments": _builtin_writer(c, list(args.items()), conds)}, conds, b)
        else:
            each = d.calls_each
            assert each is not None
            a = json.dumps(args, ensure_ascii=False) if c.arguments == "tojson" or not isinstance(args, str) \
                else args
            each.render({"name": name, "arguments": a}, {**conds, "first": j == 0, "has_content": bool(m.content)},
                        b)
    (c.close or d.frame_close).render({}, conds, b)


def _builtin_writer(c: CallTurn, pairs: list[tuple[str, str]], conds: Mapping[str, bool]) -> Callable[[Builder], None]:
    argument, sep = c.builtin_argument, c.builtin_separator
    assert argument is not None

    def written(out: Builder) -> None:
        for k, (key, v) in enumerate(pairs):
            if k:
                out.text(sep)
            argument.render({"key": key, "value": v}, conds, out)
    return written


# -- normal form -----------------------------------------------------------------------------


def normal_form_turns(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The request as a parse of its render gives it back."""
    msgs, resolved, _, opts = read_request(d, request, options)
    t = d.header_turns
    assert t is not None
    text = _text_options(t, opts)
    conds = _conds(d, resolved, text)
    tools = _tools(opts)
    in_user = tools is not None and t.tools_user is not None and conds.get(t.tools_user_when, False)
    has_system = msgs[0].role == "system"
    rest = msgs[1:] if has_system else msgs
    out: list[dict[str, Any]] = []
    if in_user:
        assert t.tools_user is not None
        out.append({"role": "user", "content": _coded(t.tools_user, "content", rest[0].content)})
        rest = rest[1:]
    used: list[str] = []
    for m in rest:
        raw = m.raw or {}
        if m.role == "assistant" and "tool_calls" in raw:
            calls = []
            for call in raw["tool_calls"]:
                name, args = _call_fields(call)
                if _is_builtin(t, text, name):
                    # An object, as the template needs a built-in call's.
                    used.append(name)
                    args = dict(args)
                elif t.calls.arguments == "tojson" and not isinstance(args, str):
                    # As given: the template writes an object and a string
                    # otherwise.
                    args = json.loads(json.dumps(args, ensure_ascii=False))
                elif not isinstance(args, str):
                    args = json.dumps(args, ensure_ascii=False)
                calls.append({"type": "function", "function": {"name": name, "arguments": args}})
            out.append({"role": "assistant", "content": "", "tool_calls": calls})
            continue
        body = d.roles[m.role].body
        if slot_codec(body, "content") == "tojson":
            parts = _kept_parts(m) if d.parts_by_role.get(m.role) == KEEP else None
            out.append({"role": m.role, "content": m.content if parts is None else parts})
        else:
            out.append({"role": m.role, "content": _coded(body, "content", m.content)})
    system = _coded(t.system, "system", msgs[0].content) if has_system else ""
    if system or (has_system and not in_user and (not out or out[0]["role"] == "system")):
        # An empty system message reads back only where the next one shows
        # it was there.
        out.insert(0, {"role": "system", "content": system})
    result: dict[str, Any] = {"messages": out}
    if tools is not None:
        result["tools"] = json.loads(json.dumps(tools))
    result["add_generation_prompt"] = resolved["add_generation_prompt"]
    for k, default in d.options.items():
        result[k] = resolved[k] if k != t.tools_user_when or tools is not None else default
    for name, o in t.options.items():
        v = text[name]
        if o.type == STRINGS and v is not None:
            # What the template leaves out of the list reads back where a call
            # shows it.
            v = [x for x in v if x not in o.omit] + [x for x in o.omit if x in v and x in used]
        result[name] = v
    return result


# -- parse -----------------------------------------------------------------------------------


def _rx(items: Sequence[Item], chars: Mapping[str, str], subs: Mapping[str, str],
        taken: list[tuple[str, bool]]) -> str:
    """A regular expression of pattern items, some slots replaced, each
    conditional part an optional group named for ``taken``."""
    out: list[str] = []
    for i in items:
        if isinstance(i, Lit):
            out.append(re.escape(i.text))
        elif isinstance(i, Tok):
            out.append(chars[i.token])
        elif isinstance(i, Slot):
            out.append(subs.get(i.name, f"(?P<{i.name}>{ANY_TEXT}*?)"))
        else:
            k = len(taken)
            taken.append((i.name, i.negate))
            out.append(f"(?P<_c{k}>{_rx(i.body, chars, subs, taken)})?")
    return "".join(out)


class _Turns:
    def __init__(self, d: LayoutDialect) -> None:
        t = d.header_turns
        assert t is not None
        chars = self.chars = d.chars()
        self.stops = frozenset(chars[x] for x in d.stops)
        # _close_of's answers, by whether the message has calls and the
        # options (a prompt's messages share them), at most _CLOSES.
        self.closes: dict[tuple[bool, tuple[tuple[str, Any], ...]], str] = {}
        self.head = re.compile(_rx(t.head.items, chars, {}, []))
        self.system_taken: list[tuple[str, bool]] = []
        decl = f"(?P<tools>{_rx(t.tools_system.items, chars, {'tools': f'(?P<decl>{ANY_TEXT}*?)'}, [])})" \
            if t.tools_system is not None else "(?P<tools>(?!))"
        self.system = re.compile(_rx(t.system.items, chars, {"tools": decl}, self.system_taken))
        self.user = re.compile(_rx(t.tools_user.items, chars, {"tools": f"(?P<decl>{ANY_TEXT}*?)"}, [])) \
            if t.tools_user is not None else None
        self.open = re.compile(_rx(d.frame_open.items, chars, {}, []))
        self.prompt = re.compile(_rx(d.prompt.items, chars, {}, []))
        self.bodies = {r.text: (r, re.compile(_rx(r.body.items, chars, {}, []) + _rx(d.frame_close.items, chars, {},
                                                                                        [])))
                       for r in d.roles.values()}
        closers = {chars[i.token] for i in _toks(d.frame_close.items)}
        if t.calls.close is not None:
            closers |= {chars[i.token] for i in _toks(t.calls.close.items)}
        self.closers = frozenset(closers)
        tool = t.tool.items
        self.tool_lead = "".join(i.text for i in tool[:_slot_at(tool, "tool")] if isinstance(i, Lit))
        self.tool_tail = "".join(i.text for i in tool[_slot_at(tool, "tool") + 1:] if isinstance(i, Lit))
        each = d.calls_each
        self.call = re.compile(_rx(each.items, chars, {}, []), re.S) if each is not None else None
        self.call_lead = each.items[0].text if each is not None and isinstance(each.items[0], Lit) else None
        b = t.calls.builtin
        self.builtin: tuple[str, re.Pattern[str]] | None = None
        if b is not None and b.items and isinstance(b.items[0], Tok):
            self.builtin = (chars[b.items[0].token], re.compile(_rx(b.items[1:], chars, {}, []), re.S))


def _toks(items: Sequence[Item]) -> list[Tok]:
    out: list[Tok] = []
    for i in items:
        if isinstance(i, Tok):
            out.append(i)
        elif isinstance(i, Cond):
            out += _toks(i.body)
    return out


def _slot_at(items: Sequence[Item], name: str) -> int:
    return next(k for k, i in enumerate(items) if isinstance(i, Slot) and i.name == name)


# As layout_parse keeps what it makes of a dialect.
_cache: Lru[int, tuple[LayoutDialect, _Turns]] = Lru()
_PLAIN = (bool, int, float, str, type(None))
_CLOSES = 64
"""The closes kept a dialect: options differ by request (a date), so the
cache is bounded; past it they are written each time."""


def _compiled(d: LayoutDialect) -> _Turns:
    return _made(_cache, d, _Turns)


def _peel(t: TurnLayout, c: _Turns, text: str) -> tuple[list[Any], str]:
    """The tools written at the start of ``text`` (each exactly as render
    writes it) and the text after them."""
    tools: list[Any] = []
    dec = json.JSONDecoder()
    pos = 0
    lead, tail = c.tool_lead, c.tool_tail
    while text.startswith(lead + "{", pos):
        start = pos + len(lead)
        try:
            obj, end = dec.raw_decode(text, start)
        except ValueError:
            break
        if not text.startswith(tail, end) or json.dumps(obj, ensure_ascii=False, indent=t.tool_indent) \
                != text[start:end]:
            break
        tools.append(obj)
        pos = end + len(tail)
    return tools, text[pos:]


def parse_prompt_turns(d: LayoutDialect, lx: Lexed) -> dict[str, Any]:
    t = d.header_turns
    assert t is not None
    c = _compiled(d)
    s = lx.text
    mh = c.head.match(s)
    if mh is None:
        raise ParseError("expected the start of the text", offset=lx.offset(0))
    ms = c.system.match(s, mh.end())
    if ms is None:
        raise ParseError("expected the system turn the format always writes", offset=lx.offset(mh.end()))
    pos = ms.end()
    given = {name for k, (name, neg) in enumerate(c.system_taken) if not neg and ms.group(f"_c{k}") is not None}
    text: dict[str, Any] = {}
    for name, o in t.options.items():
        if o.type == STRING:
            text[name] = ms.group(name)
        elif name in given:
            v = ms.group(name)
            text[name] = v.split(o.join) if v else []
        else:
            text[name] = None
    tools: list[Any] | None = None
    in_user = False
    system = ms.group("system")
    if ms.group("tools") is not None:
        tools, system = _peel(t, c, s[ms.start("decl"):ms.end("system")])
    messages: list[dict[str, Any]] = []
    if tools is None and c.user is not None:
        mu = c.user.match(s, pos)
        if mu is not None:
            tools, first = _peel(t, c, s[mu.start("decl"):mu.end("content")])
            in_user = True
            messages.append({"role": "user", "content": first})
            pos = mu.end()
    agp = False
    used: list[str] = []
    while pos < len(s):
        if c.prompt.fullmatch(s, pos) is not None:
            agp = True
            break
        mo = c.open.match(s, pos)
        if mo is None:
            raise ParseError("expected the start of a message", offset=lx.offset(pos))
        hit = c.bodies.get(mo.group("role"))
        if hit is None:
            raise ParseError(f"unknown role {shown(mo.group('role'))}", offset=lx.offset(mo.start("role")))
        r, body = hit
        if r.name == "assistant":
            end = first_of(s, c.closers, mo.end())
            if end < 0:
                raise ParseError("an assistant message that is not closed", offset=lx.offset(mo.end()))
            msg, builtin, objects = _completion(d, Lexed(s[mo.end():end + 1], _shifted(lx, mo.end())),
                                                lenient=False)
            used += builtin
            for call, obj in zip(msg.get("tool_calls", ()), objects, strict=True):
                if obj:
                    # Given as an object, as written (and as a built-in call
                    # must be given).
                    call["function"]["arguments"] = json.loads(call["function"]["arguments"])
            want = _close_of(d, t, bool(msg.get("tool_calls")), {**dict(d.options), **{
                k: text[k] is not None for k, o in t.options.items() if o.type == STRINGS}})
            if s[end] != want:
                raise ParseError("an assistant message closed otherwise than the format closes it",
                                 offset=lx.offset(end))
            messages.append(msg)
            pos = end + 1
            continue
        mb = body.match(s, mo.end())
        if mb is None:
            raise ParseError(f"a {r.name} message that does not end as the format ends one",
                             offset=lx.offset(mo.end()))
        content: Any = mb.group("content") or ""
        if slot_codec(r.body, "content") == "tojson":
            try:
                content = jsonfmt.read(content)
            except ValueError:  # nested past Python's reader too (jsonfmt.TooDeep)
                raise ParseError(f"a {r.name} message whose content is not JSON",
                                 offset=lx.offset(mo.end())) from None
        messages.append({"role": r.name, "content": content})
        pos = mb.end()
    if system or (not in_user and (not messages or messages[0]["role"] == "system")):
        messages.insert(0, {"role": "system", "content": system})
    result: dict[str, Any] = {"messages": messages}
    if tools is not None:
        result["tools"] = tools
    result["add_generation_prompt"] = agp
    for k, default in d.options.items():
        result[k] = in_user if k == t.tools_user_when and tools is not None else default
    for name, o in t.options.items():
        v = text[name]
        if o.type == STRINGS and v is not None:
            v = v + [x for x in o.omit if x in used and x not in v]
        result[name] = v
    return result


def _close_of(d: LayoutDialect, t: TurnLayout, calls: bool, conds: Mapping[str, bool]) -> str:
    c = _compiled(d)
    key = (calls, tuple(sorted((k, v if isinstance(v, _PLAIN) else repr(v)) for k, v in conds.items())))
    hit = c.closes.get(key)
    if hit is None:
        b = Builder()
        (t.calls.close if calls and t.calls.close is not None else d.frame_close).render({}, conds, b)
        chars = c.chars
        hit = next((chars[seg.text] for seg in b.finish() if seg.special), "")
        if len(c.closes) < _CLOSES:
            c.closes[key] = hit
    return hit


def parse_completion_turns(d: LayoutDialect, lx: Lexed, *, lenient: bool) -> dict[str, Any]:
    return _completion(d, lx, lenient=lenient)[0]


def _completion(d: LayoutDialect, lx: Lexed, *, lenient: bool) -> tuple[dict[str, Any], list[str], list[bool]]:
    """One assistant message, the names of its built-in calls, and for each
    call whether its arguments were written as an object."""
    t = d.header_turns
    assert t is not None
    c = _compiled(d)
    s = lx.text
    r = _Repairs(d, lx, lenient)
    stop_at = first_of(s, c.stops)
    body = s if stop_at < 0 else s[:stop_at]
    end = len(s) if stop_at < 0 else stop_at
    message: dict[str, Any] = {"role": "assistant"}
    calls: list[dict[str, Any]] = []
    builtin: list[str] = []
    objects: list[bool] = []
    content = ""
    if c.builtin is not None and body[:1] == c.builtin[0]:
        _builtin_call(t, c, r, body, 0, end, stop_at < 0, calls, builtin, objects)
    elif c.call_lead is not None and body.startswith(c.call_lead):
        _json_call(c, r, body, 0, end, stop_at < 0, calls, objects)
    else:
        respelled = _respelled(body)
        if respelled is not None:
            r.add("respelled", 0, "a tool call not spelled as the format writes one: read as the call")
            calls.append(respelled)
            objects.append(True)
        else:
            j = _call_after_text(c, body)
            if j > 0:
                # The format writes no text beside a call: a call after text
                # is said, and in a lenient parse read with the text before it.
                r.add("call-after-text", j, "a tool call after text, which the format never writes: read as the "
                                            "call, the text before it as content")
                if c.builtin is not None and body[j] == c.builtin[0]:
                    _builtin_call(t, c, r, body, j, end, stop_at < 0, calls, builtin, objects)
                else:
                    _json_call(c, r, body[:end], j, end, stop_at < 0, calls, objects)
                body = body[:j]
            content = _coded(d.roles["assistant"].body, "content", _text(r, body, 0))
    message["content"] = content
    if calls:
        message["tool_calls"] = calls
    r.ended(stop_at)
    if r.list:
        message["diagnostics"] = r.list
    return message, builtin, objects


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _json_call(c: _Turns, r: _Repairs, body: str, base: int, end: int, cut: bool, out: list[dict[str, Any]],
               objects: list[bool]) -> None:
    assert c.call is not None
    m = c.call.fullmatch(body, base)
    if m is None or _has_token(body[base:]):
        if cut:
            r.add("truncated", end, "the tool call is not finished: it is withheld")
        else:
            r.add("bad-call", base, "the tool call is not written as the format writes one: it is withheld")
        return
    args = m.group("arguments")
    try:
        value = jsonfmt.read(args)
    except ValueError:
        value = None
    if isinstance(value, dict):
        out.append(_call(m.group("name"), args))
        objects.append(True)
    elif isinstance(value, str):
        # As the template writes arguments given as JSON text: quoted.
        out.append(_call(m.group("name"), value))
        objects.append(False)
    else:
        r.add("bad-argument", base, "the arguments of the tool call are not a JSON object: it is withheld")


def _builtin_call(t: TurnLayout, c: _Turns, r: _Repairs, body: str, base: int, end: int, cut: bool,
                  out: list[dict[str, Any]], names: list[str], objects: list[bool]) -> None:
    assert c.builtin is not None
    rest = body[base + 1:]
    if c.call_lead is not None and rest.startswith(c.call_lead):
        r.add("respelled", base, "a JSON tool call after the built-in call's token: read as the call")
        _json_call(c, r, body, base + 1, end, cut, out, objects)
        return
    m = c.builtin[1].fullmatch(rest)
    if m is None or _has_token(rest):
        if cut:
            r.add("truncated", end, "the built-in tool call is not finished: it is withheld")
        else:
            r.add("bad-call", base, "the built-in tool call is not written as the format writes one: it is withheld")
        return
    args = _builtin_args(t, m.group("arguments"))
    if args is None:
        r.add("bad-argument", base, "the arguments of the built-in tool call are not written as the format "
                                    "writes them: it is withheld")
        return
    out.append(_call(m.group("name"), json.dumps(args, ensure_ascii=False)))
    names.append(m.group("name"))
    objects.append(True)


_KEY = "[A-Za-z_][A-Za-z0-9_]*"


def _builtin_args(t: TurnLayout, text: str) -> dict[str, str] | None:
    """``key="value"`` pairs as the built-in call's argument pattern writes
    them; a separator counts only where the next key starts."""
    arg = t.calls.builtin_argument
    if not text or arg is None:
        return {}
    items = arg.items
    mid, tail = items[1], items[3]
    assert isinstance(mid, Lit) and isinstance(tail, Lit)
    pieces = re.split(re.escape(tail.text + t.calls.builtin_separator) + f"(?={_KEY}{re.escape(mid.text)})", text)
    out: dict[str, str] = {}
    for k, p in enumerate(pieces):
        if k < len(pieces) - 1:
            p += tail.text
        key, sep, value = p.partition(mid.text)
        if not sep or not re.fullmatch(_KEY, key) or not value.endswith(tail.text) or key in out:
            return None
        out[key] = value[:len(value) - len(tail.text)]
    return out


def _call_after_text(c: _Turns, body: str) -> int:
    """Where a call starts after text (the built-in call's token, or the
    start of a JSON call that runs to the end), or -1."""
    if c.builtin is not None:
        j = body.find(c.builtin[0], 1)
        if j > 0:
            return j
    if c.call is not None and c.call_lead is not None:
        j = body.find(c.call_lead, 1)
        while j > 0:
            if c.call.fullmatch(body, j) is not None:
                return j
            j = body.find(c.call_lead, j + 1)
    return -1


def _respelled(body: str) -> dict[str, Any] | None:
    """A call written as a JSON object of ``name`` and ``parameters`` but
    spaced otherwise than the format writes it."""
    stripped = body.strip()
    if not stripped.startswith("{") or _has_token(stripped):
        return None
    try:
        value = jsonfmt.read(stripped)
    except ValueError:
        return None
    if not isinstance(value, dict) or set(value) != {"name", "parameters"} or not isinstance(value["name"], str) \
            or not isinstance(value["parameters"], dict):
        return None
    return _call(value["name"], json.dumps(value["parameters"], ensure_ascii=False))


def _has_token(s: str) -> bool:
    return any(TOKEN_BASE <= ord(ch) < TOKEN_BASE + 0x800 for ch in s)
