"""Formats whose turns have no closing marker (each ends where the token
that opens the next turn is) and whose calls write their arguments as
key/value pairs: the normal form, the parse of a whole prompt and the parse
of an answer. Render is :mod:`.layout_render`'s.

A pair's value is written as it is when it is a string and as JSON
otherwise, so reading it back needs to know which it was: the declared
tool's schema says (a ``string`` property is read as the text, any other
as JSON); where no schema says, a value that reads as a JSON number,
boolean, null, object or array is that value, and anything else is the
text. The normal form applies the same rule, so a string that would read
back as a number is a number there too (and render reports it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import ParseError, shown
from ..lru import Lru
from ..plugins import jsonfmt
from .layout import LayoutDialect
from .layout_parse import Lexed, _made, _Repairs, _Shape, _shifted, _text, first_of
from .layout_pattern import ANY_TEXT, CODECS, Builder, Item, Lit, Pattern, Slot, Tok, options_of, slot_codec
from .layout_render import _last_query, _reasoning_of, _suffixed
from .layout_request import Dropped, read_request

__all__ = ["normal_form_open", "open_shape", "parse_completion_open", "parse_prompt_open", "string_typed",
           "typed_arguments"]


# -- the values of pairs ---------------------------------------------------------------------


def schemas(tools: Any) -> dict[str, Mapping[str, Any]]:
    """Tool name → its parameters' properties, from a request's tools (the
    OpenAI shape, or a bare function)."""
    out: dict[str, Mapping[str, Any]] = {}
    if not isinstance(tools, list | tuple):
        return out
    for t in tools:
        f = t.get("function", t) if isinstance(t, Mapping) else None
        if not isinstance(f, Mapping) or not isinstance(f.get("name"), str):
            continue
        params = f.get("parameters")
        props = params.get("properties") if isinstance(params, Mapping) else None
        out.setdefault(f["name"], props if isinstance(props, Mapping) else {})
    return out


def string_typed(prop: Any) -> bool | None:
    """Whether a property's value is read as its text (True: its schema
    says it is a string), as JSON (False), or as JSON only where the text is
    JSON of another kind than a string (None: the schema says nothing a
    reader can use). The completion grammar writes values by the same
    rule."""
    if not isinstance(prop, Mapping):
        return None
    t = prop.get("type")
    if t == "string" or (isinstance(t, list) and "string" in t):
        return True
    if isinstance(t, str | list) and t:
        return False
    enum = prop.get("enum")
    if isinstance(enum, list) and enum:
        return all(isinstance(v, str) for v in enum)
    return None


def read_value(text: str, prop: Any) -> tuple[Any, bool]:
    """A pair's value read back: (value, whether it is as the schema says).
    A declared non-string property whose text is not JSON is not."""
    string = string_typed(prop)
    if string:
        return text, True
    try:
        value = jsonfmt.read(text)
    except ValueError:
        return text, string is None
    if string is None and isinstance(value, str):
        return text, True  # a JSON string literal: the text, quotes and all
    return value, True


def typed_arguments(arguments: str, props: Mapping[str, Any] | None) -> str:
    """Arguments (an object's JSON text) as a pair-by-pair render of them
    reads back: each value written (a string as is, else as JSON) and read
    by its property's schema."""
    obj = json.loads(arguments)
    props = props or {}
    out: dict[str, Any] = {}
    for k, v in obj.items():
        written = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
        out[k] = read_value(written, props.get(k))[0]
    return json.dumps(out, ensure_ascii=False)


def changed_by_pairs(arguments: str, props: Mapping[str, Any] | None) -> list[str]:
    """The keys whose values a pair-by-pair render reads back as another
    value (a string that reads as a number, a number a string property reads
    as text)."""
    obj = json.loads(arguments)
    back = json.loads(typed_arguments(arguments, props))
    return [k for k, v in obj.items() if type(back.get(k)) is not type(v) or back.get(k) != v]


# -- the normal form -------------------------------------------------------------------------


def _coder(p: Pattern, name: str) -> Callable[[str], str]:
    codec = slot_codec(p, name)
    return CODECS[codec] if codec and codec != "tojson" else (lambda v: v)


def normal_form_open(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The request as a parse of its render returns it: the suffix in the
    content it is added to, an answer's content and reasoning as the body
    writes them (trimmed), reasoning only where the policy shows it, calls'
    arguments typed back by the declared tools, no call ids or names (the
    format writes none)."""
    msgs, resolved, _, opts = read_request(d, request, options)
    conds = {k: v for k, v in resolved.items() if k in d.options}
    tools = opts.get("tools") or None
    props = schemas(tools)
    body = d.roles["assistant"].body
    content_of, reasoning_of = _coder(body, "content"), _coder(body, "reasoning")
    last_query = _last_query(d, msgs)
    out: list[dict[str, Any]] = []
    n = len(msgs)
    for k, m in enumerate(msgs):
        m = _suffixed(d, m, conds)
        msg: dict[str, Any] = {"role": m.role}
        if m.role == "assistant":
            content, r, show, _ = _reasoning_of(d, m, k, k == n - 1, last_query)
            r = reasoning_of(r)
            if show and r:
                msg["reasoning_content"] = r
            msg["content"] = content_of(content)
            if m.calls:
                msg["tool_calls"] = [{"type": "function", "function": {
                    "name": name, "arguments": typed_arguments(args, props.get(name))}} for name, args in m.calls]
        else:
            msg["content"] = m.content
        out.append(msg)
    result: dict[str, Any] = {"messages": out}
    if tools:
        result["tools"] = json.loads(json.dumps(list(tools)))
    if not resolved["add_generation_prompt"]:
        prompt = _as_prompt(d, out[-1], conds)
        if prompt is not None:
            # Written as the generation prompt writes itself: read as it.
            out.pop()
            resolved.update(prompt, add_generation_prompt=True)
        else:
            resolved.update(d.options)
    return {**result, **resolved}


def _as_prompt(d: LayoutDialect, last: Mapping[str, Any], conds: Mapping[str, bool]) -> dict[str, bool] | None:
    """The options under which the generation prompt is written as ``last``
    (an empty answer at the end of a request without a prompt) is, if any."""
    if last["role"] != "assistant" or last["content"] or len(last) > 2:
        return None
    return _prompts(d).get(_text_of(d, d.role_frames["assistant"].open, conds)
                           + _text_of(d, d.roles["assistant"].body, {**conds, "show_reasoning": False,
                                                                      "has_text": False}))


def _text_of(d: LayoutDialect, p: Pattern, conds: Mapping[str, bool]) -> str:
    b = Builder()
    p.render({"content": "", "reasoning": "", "calls": ""}, {**conds, "first": True, "has_content": False}, b)
    return "".join(seg.text for seg in b.finish())


def _prompts(d: LayoutDialect) -> dict[str, dict[str, bool]]:
    """The generation prompt's text under each setting of the options."""
    return _made(_prompt_texts, d, _all_prompts)


def _all_prompts(d: LayoutDialect) -> dict[str, dict[str, bool]]:
    names = list(d.options)
    out: dict[str, dict[str, bool]] = {}
    for bits in range(2 ** len(names)):
        conds = {n: bool(bits >> k & 1) for k, n in enumerate(names)}
        out.setdefault(_text_of(d, d.prompt, conds), conds)
    return out


_prompt_texts: Lru[int, tuple[LayoutDialect, dict[str, dict[str, bool]]]] = Lru()


def open_drops(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> list[Dropped]:
    """What render writes that reads back otherwise, reported: an argument
    that reads back as another value (a string that reads as a number, a
    number a string property reads as text), and an empty last answer
    written as the generation prompt writes itself."""
    raw = request.get("messages") if isinstance(request, Mapping) else request
    if isinstance(raw, list) and all(isinstance(m, Mapping) for m in raw) and raw \
            and not any(m.get("tool_calls") for m in raw) and raw[-1].get("role") != "assistant":
        return []  # no calls and no last answer: nothing to read again
    msgs, resolved, _, opts = read_request(d, request, options)
    props = schemas(opts.get("tools") or None)
    out: list[Dropped] = []
    for m in msgs:
        for j, (name, args) in enumerate(m.calls):
            for key in changed_by_pairs(args, props.get(name)):
                out.append(Dropped(m.at, "tool_calls", f"argument {key!r} of call {j + 1} reads back as another "
                                                       "value: the format writes strings unquoted and types "
                                                       "values by the declared schema"))
    if msgs and msgs[-1].role == "assistant" and not resolved["add_generation_prompt"]:
        normal = normal_form_open(d, request, options)
        if normal["add_generation_prompt"]:
            out.append(Dropped(msgs[-1].at, "content", "an empty last answer is written as the generation prompt "
                                                       "is: it reads back as that prompt"))
    return out


# -- the reader ------------------------------------------------------------------------------


class _Open(NamedTuple):
    head: re.Pattern[str] | None
    tools: re.Pattern[str] | None
    """The declaration's turn (group ``tools``)."""
    each: tuple[str, str]
    """The literal text before and after each declared tool."""
    opens: list[tuple[str, re.Pattern[str]]]
    starts: str
    """The tokens that open a turn (or the generation prompt): where a turn ends."""
    bodies: dict[str, re.Pattern[str]]
    """Each role but the assistant's: its body."""
    groups: frozenset[str]
    """Roles whose messages in a row share one turn."""
    prompt: re.Pattern[str]
    taken: list[tuple[str, bool]]
    stops: str
    think: tuple[str, str] | None
    call: tuple[str, str]
    """A call's opening and closing tokens."""
    inner: re.Pattern[str]
    """Between them: groups ``name`` and ``arguments``."""
    pair: re.Pattern[str]
    """One argument: groups ``key`` and ``value``."""
    trim_content: Callable[[str], str]
    trim_reasoning: Callable[[str], str]


def _first_tok(p: Pattern) -> Tok | None:
    first = p.items[0] if p.items else None
    return first if isinstance(first, Tok) else None


def _lit(items: Sequence[Item]) -> str:
    return "".join(i.text for i in items if isinstance(i, Lit))


def _open(d: LayoutDialect) -> _Open:
    chars = d.chars()

    def rx(items: Sequence[Item], subs: Mapping[str, str]) -> str:
        out: list[str] = []
        for i in items:
            if isinstance(i, Slot) and i.name in subs:
                out.append(subs[i.name])
            elif isinstance(i, Lit):
                out.append(re.escape(i.text))
            elif isinstance(i, Tok):
                out.append(re.escape(chars[i.token]))
            else:
                raise ParseError(f"the layout dialect {d.name!r} writes what its reader does not read", offset=0)
        return "".join(out)

    head = re.compile(d.head.regex(chars)) if d.head is not None else None
    tools = None
    each = ("", "")
    if d.tools_turn is not None:
        tools = re.compile(rx(d.tools_turn.items, {"tools": f"(?P<tools>{ANY_TEXT}*?)"}))
        if d.tools_turn_each is not None:
            items = d.tools_turn_each.items
            k = next(j for j, i in enumerate(items) if isinstance(i, Slot))
            each = (_lit(items[:k]), _lit(items[k + 1:]))
    opens: list[tuple[str, re.Pattern[str]]] = []
    starts: list[str] = []
    for role in d.roles:
        f = d.role_frames[role]
        opens.append((role, re.compile(f.open.regex(chars))))
        first = _first_tok(f.open)
        if first is not None:
            starts.append(chars[first.token])
    first = _first_tok(d.prompt)
    if first is not None:
        starts.append(chars[first.token])
    bodies = {r: re.compile(d.roles[r].body.regex(chars)) for r in d.roles if r != "assistant"}
    taken: list[tuple[str, bool]] = []
    prompt = re.compile(d.prompt.regex(chars, None, taken))
    split = d.reasoning_split
    think = (chars[split[0]], chars[split[1]]) if split is not None else None
    each_call = d.calls_each
    assert each_call is not None and d.call_pair is not None  # the file's checks
    toks = [k for k, i in enumerate(each_call.items) if isinstance(i, Tok)]
    a, b = toks[0], toks[-1]
    call_open, call_close = each_call.items[a], each_call.items[b]
    assert isinstance(call_open, Tok) and isinstance(call_close, Tok)
    name = "(?P<name>[^\n\ud800-\udfff]*)"
    inner = re.compile(rx(each_call.items[a + 1:b], {"name": name, "arguments": "(?P<arguments>.*)"}), re.S)
    pair = re.compile(rx(d.call_pair.items, {"key": f"(?P<key>{ANY_TEXT}*?)", "value": f"(?P<value>{ANY_TEXT}*?)"}))
    body = d.roles["assistant"].body
    return _Open(head, tools, each, opens, "".join(dict.fromkeys(starts)), bodies,
                 frozenset(r for r, f in d.role_frames.items() if f.group), prompt, taken,
                 "".join(chars[t] for t in d.stops), think, (chars[call_open.token], chars[call_close.token]),
                 inner, pair, _coder(body, "content"), _coder(body, "reasoning"))


_readers: Lru[int, tuple[LayoutDialect, _Open]] = Lru()


def _reader(d: LayoutDialect) -> _Open:
    return _made(_readers, d, _open)


def _declared(o: _Open, lx: Lexed, m: re.Match[str]) -> list[Any]:
    """The tools of the declaration's turn: each a JSON value between the
    literal text the format writes around one (the first end after which
    the text read is JSON: the literal may occur inside a value)."""
    text = m.group("tools")
    base = m.start("tools")
    before, after = o.each
    out: list[Any] = []
    pos = 0
    while pos < len(text):
        if not text.startswith(before, pos):
            raise ParseError("a tool declaration that is not as the format writes one", offset=lx.offset(base + pos))
        pos += len(before)
        end = text.find(after, pos) if after else len(text)
        while True:
            if end < 0:
                raise ParseError("a tool declaration that is not JSON", offset=lx.offset(base + pos))
            try:
                out.append(jsonfmt.read(text[pos:end]))
                break
            except ValueError:  # nested past Python's reader too (jsonfmt.TooDeep)
                end = text.find(after, end + 1) if after else -1
        pos = end + len(after)
    return out


def parse_prompt_open(d: LayoutDialect, lx: Lexed) -> dict[str, Any]:
    """A whole rendered request back to its normal form: the head, the
    declaration's turn, then each turn told by the token that opens it and
    ended by the next such token; a run of one role's messages in its one
    turn."""
    o = _reader(d)
    s = lx.text
    pos = 0
    if o.head is not None:
        m = o.head.match(s)
        if m is None:
            raise ParseError("expected the format's head", offset=lx.offset(0))
        pos = m.end()
    result: dict[str, Any] = {}
    tools: Any = None
    if o.tools is not None:
        m = o.tools.match(s, pos)
        if m is not None:
            tools = result["tools"] = _declared(o, lx, m)
            pos = m.end()
    props = schemas(tools)
    messages: list[dict[str, Any]] = []
    conds = dict(d.options)
    agp = False
    while pos < len(s):
        mp = o.prompt.fullmatch(s, pos)
        if mp is not None:
            agp = True
            conds = options_of(mp, o.taken, d.options)
            break
        found = next(((role, mo) for role, opening in o.opens if (mo := opening.match(s, pos)) is not None), None)
        if found is None:
            raise ParseError("expected the start of a message", offset=lx.offset(pos))
        role, mo = found
        at = mo.end()
        end = first_of(s, o.starts, at)
        end = len(s) if end < 0 else end
        if role == "assistant":
            messages.append(_answer(d, o, Lexed(s[at:end], _shifted(lx, at)), lenient=False, props=props,
                                    history=True))
        else:
            messages += _bodies(o, role, s, at, end, lx)
        pos = end
    return {"messages": messages, **result, "add_generation_prompt": agp, **conds}


def _bodies(o: _Open, role: str, s: str, at: int, end: int, lx: Lexed) -> list[dict[str, Any]]:
    body = o.bodies[role]
    if role not in o.groups:
        mb = body.fullmatch(s, at, end)
        if mb is None:
            raise ParseError(f"a {role} message that is not as the format writes one", offset=lx.offset(at))
        return [{"role": role, "content": mb.group("content") or ""}]
    out: list[dict[str, Any]] = []
    while True:
        mb = body.match(s, at, end)
        if mb is None or mb.end() == at:
            raise ParseError(f"a {role} message that is not as the format writes one", offset=lx.offset(at))
        out.append({"role": role, "content": mb.group("content") or ""})
        at = mb.end()
        if at == end:
            return out


def parse_completion_open(d: LayoutDialect, lx: Lexed, *, lenient: bool, tools: Any = None) -> dict[str, Any]:
    """What a model generated after the generation prompt: its reasoning
    block (where it opens the answer), its content up to the first call,
    its calls (each argument typed by ``tools``' schemas), and the stop
    token. Strict raises at the first problem; lenient repairs (a call cut
    off or malformed is withheld, never half read)."""
    return _answer(d, _reader(d), lx, lenient=lenient, props=schemas(tools), history=False)


def _answer(d: LayoutDialect, o: _Open, lx: Lexed, *, lenient: bool, props: Mapping[str, Mapping[str, Any]],
            history: bool) -> dict[str, Any]:
    s = lx.text
    r = _Repairs(d, lx, lenient)
    stop_at = -1 if history else first_of(s, o.stops)
    body = s if stop_at < 0 else s[:stop_at]
    message: dict[str, Any] = {"role": "assistant"}
    start = len(body) - len(body.lstrip())
    if o.think is not None and body[start:start + 1] == o.think[0]:
        ci = body.find(o.think[1], start + 1)
        reasoning = o.trim_reasoning(_text(r, body[start + 1:ci if ci >= 0 else len(body)], start + 1))
        if ci < 0:
            r.add("truncated", len(body), "the reasoning block is not closed")
            start = len(body)
        else:
            start = ci + 1
        if reasoning:
            message["reasoning_content"] = reasoning
    j = body.find(o.call[0], start)
    message["content"] = o.trim_content(_text(r, body[start:j if j >= 0 else len(body)], start))
    calls: list[dict[str, Any]] = []
    while j >= 0:
        k = body.find(o.call[1], j + 1)
        if k < 0:
            r.add("truncated", len(body), f"tool call {len(calls) + 1} is not closed: it is withheld")
            break
        found = _call(o, body[j + 1:k], props)
        if isinstance(found, str):
            r.add("bad-argument" if found.startswith("the argument") else "bad-call", j,
                  f"{found.replace('#', str(len(calls) + 1))}: it is withheld")
        else:
            calls.append(found)
        nxt = body.find(o.call[0], k + 1)
        if body[k + 1:nxt if nxt >= 0 else len(body)].strip():
            r.add("stray-content", k + 1, "text between or after the tool calls is left out")
        j = nxt
    if calls:
        message["tool_calls"] = calls
    if not history:
        r.ended(stop_at)
    if r.list:
        message["diagnostics"] = r.list
    return message


def _call(o: _Open, inner: str, props: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | str:
    """A call read out of the text between its tokens, or what is wrong with
    it (``#`` for its number)."""
    m = o.inner.fullmatch(inner)
    if m is None:
        return "tool call # is not written as the format writes one"
    name, text = m.group("name"), m.group("arguments")
    schema = props.get(name, {})
    args: dict[str, Any] = {}
    pos = 0
    while pos < len(text):
        mp = o.pair.match(text, pos)
        if mp is None or mp.end() == pos:
            return "the arguments of tool call # are not written as the format writes them"
        key = mp.group("key")
        if key in args:
            return f"tool call # gives the argument {shown(key)} twice"
        value, ok = read_value(mp.group("value"), schema.get(key))
        if not ok:
            return f"the argument {shown(key)} of tool call # is not JSON of its declared type"
        args[key] = value
        pos = mp.end()
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def open_shape(d: LayoutDialect) -> _Shape:
    """What a stream reads as it comes, in the terms of the other formats'
    live reader: the reasoning block (after the format's whitespace), the
    token that opens the first call, content and reasoning trimmed."""
    o = _reader(d)
    return _made(_shapes, d, lambda _: _Shape(frozenset(o.stops), o.think, (o.call[0], o.call[1], o.inner, ""),
                                              trim=True, lead=True))


_shapes: Lru[int, tuple[LayoutDialect, _Shape]] = Lru()
