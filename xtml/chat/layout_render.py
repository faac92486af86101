"""A request rendered by a layout dialect into pieces of text and tokens,
and its normal form: what a parse of that render gives back."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import MessageError, OptionError
from ..markup.segments import Segment
from .layout import EACH, HISTORY, LAST_USER, SYSTEM, TURN, LayoutDialect
from .layout_fold import declared_by_syntax, fold
from .layout_parse import read_back
from .layout_pattern import Builder, Pattern, Value, holds
from .layout_request import Dropped, Msg, name_of_id, read_request

__all__ = ["Rendering", "normal_form", "render"]


class Rendering(NamedTuple):
    segments: list[Segment]
    dropped: tuple[Dropped, ...]
    options: dict[str, Any]
    """What the request resolved to: ``add_generation_prompt`` and the
    dialect's options."""
    request: dict[str, Any]
    """The request's options as given (keyword options over
    ``chat_template_kwargs`` over the body's keys)."""


def render(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> Rendering:
    msgs, resolved, dropped, opts = read_request(d, request, options)
    b = Builder()
    conds = {k: v for k, v in resolved.items() if k in d.options}
    tools = opts.get("tools") if d.tools in (SYSTEM, TURN) else None
    start = 0
    if d.head is not None:
        d.head.render({}, conds, b)
    if d.system_turn is not None:
        start = _system_turn(d, msgs, resolved, opts, conds, b, dropped)
    declaration = _before_last_user(d, msgs, opts, conds, dropped)
    if tools and d.tools == TURN:
        assert d.tools_turn is not None
        d.tools_turn.render({"tools": _declared_one_by_one(d, _tool_list(tools), conds)
                             if d.tools_turn_each is not None else _tojson(_tool_list(tools))}, conds, b)
        tools = None  # declared in its own turn: the system turn is as without tools
    if tools:
        _tool_list(tools)
        has_system = msgs[0].role == "system"
        each, block, turn = d.tools_each, d.tools_block, d.system_with_tools
        assert each is not None and block is not None and turn is not None

        def each_tool(out: Builder) -> None:
            for t in tools:
                each.render({"tool": _tojson(t)}, conds, out)

        def declared(out: Builder) -> None:
            block.render({"tools": each_tool}, conds, out)

        turn.render({"system": msgs[0].content if has_system else "", "tools": declared},
                    {**conds, "has_system": has_system}, b)
        start = int(has_system)
    elif d.default_system is not None and msgs[0].role != "system":
        _frame(d, "system", d.default_system, conds, b)
    if d.system_hoist is not None:
        d.system_hoist.render({"system": _hoisted(d, msgs)}, conds, b)
    if d.call_result is not None:
        # Results written in the turn that called for them: a loop of its own.
        fold(d, msgs[start:], resolved, conds, b, dropped)
        return Rendering(b.finish(), tuple(dropped), resolved, opts)
    last_query = _last_query(d, msgs)
    n = len(msgs)
    prev = ""
    for k in range(start, n):
        m = msgs[k]
        if d.system_hoist is not None and m.role == "system":
            continue
        r = d.roles[m.role]
        m = _suffixed(d, m, conds)
        if d.message_conds:
            conds, plain = _message_conds(d, m, prev, conds), conds
            m = _cut(d, m, conds, dropped)
            _hidden_flags(d, m, conds, dropped)
            if m.role != "system":
                prev = m.role
        if declaration is not None and m.role == "user" and m.raw == declaration[0]:
            declaration[1](b)
        frame = d.role_frames.get(m.role)
        if frame is None:
            opening, closing, group = d.frame_open, d.frame_close, False
        else:
            opening, closing, group = frame.open, frame.close, frame.group
        if not group or k == 0 or msgs[k - 1].role != m.role:
            opening.render({"role": m.name or r.text}, conds, b)
        if m.role == "assistant" and (d.reasoning == HISTORY or d.calls == EACH):
            _assistant(d, m, k, k == n - 1, last_query, conds, r.body, b, dropped)
        else:
            # An assistant's body read without a history policy: no
            # reasoning shown, its content as given.
            asked = {**conds, "show_reasoning": False, "has_text": bool(m.content.strip())} \
                if m.role == "assistant" else conds
            r.body.render({"content": _content(d, m, m.content, conds), "tool_call_id": m.call_id}, asked, b)
        if not group or k == n - 1 or msgs[k + 1].role != m.role:
            closing.render({}, conds, b)
        if d.message_conds:
            conds = plain
    if resolved["add_generation_prompt"]:
        if not d.prompt.items:
            dropped.append(Dropped(-1, "add_generation_prompt", f"the {d.name} format writes no generation prompt"))
        if d.message_conds:
            conds = {**conds, "after_user": prev == "user", "after_tool": prev == "tool"}
            if not _written(d.prompt, conds):
                dropped.append(Dropped(-1, "add_generation_prompt", f"the {d.name} format writes no generation "
                                                                    f"prompt after a {prev or 'system'} message"))
        d.prompt.render({}, conds, b)
    return Rendering(b.finish(), tuple(dropped), resolved, opts)


def _system_turn(d: LayoutDialect, msgs: Sequence[Msg], resolved: Mapping[str, Any], opts: Mapping[str, Any],
                 conds: Mapping[str, bool], b: Builder, dropped: list[Dropped]) -> int:
    """Writes the format's own system turn; the index of the first message
    left to write (past the system message it holds)."""
    turn = d.system_turn
    assert turn is not None
    has_system = msgs[0].role in d.system_roles
    if has_system and isinstance((msgs[0].raw or {}).get("content"), list) and \
            d.parts_by_role.get(msgs[0].role) not in ("first", "str"):
        # The turn holds the system message as a string: the template would
        # print a list as Python's str() of it.
        raise MessageError(f"the {d.name} format writes the first {msgs[0].role} message's content as a string: a "
                           "list of parts is not read there", index=0, path="content")
    values: dict[str, Value] = {"system": msgs[0].content if has_system else ""}
    values.update({k: resolved[k] for k in d.text_options})
    given = opts.get("tools")
    values["tools"] = declared_by_syntax(d, _tool_list(given), dropped) if d.tools_syntax and given else ""
    turn.render(values, {**conds, "has_system": has_system, "has_tools": given is not None,
                         "some_tools": bool(given)}, b)
    return int(has_system)


def _before_last_user(d: LayoutDialect, msgs: Sequence[Msg], opts: Mapping[str, Any], conds: Mapping[str, bool],
                      dropped: list[Dropped]) -> tuple[Mapping[str, Any] | None, Callable[[Builder], None]] | None:
    """The last user message as given and the writer of the declaration
    that goes before it (and before each user message equal to it), where
    the format declares tools so."""
    given = opts.get("tools")
    if d.tools != LAST_USER or given is None:
        return None
    tools = _tool_list(given)
    last = next((m for m in reversed(msgs) if m.role == "user"), None)
    if last is None:
        if tools:
            dropped.append(Dropped(-1, "tools", f"the {d.name} format declares tools before the last user message, "
                                                "and there is none"))
        return None
    functions: list[Mapping[str, Any]] = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(fn, Mapping):
            raise OptionError(f"the {d.name} format writes each tool's function: a tool is "
                              "{\"type\": \"function\", \"function\": {...}}", option="tools")
        functions.append(fn)
        # Only the function is written: the tool's other keys, a type other
        # than "function" and the keys the format skips are left out.
        dropped.extend(Dropped(-1, f"tools[{i}].{k}", f"the {d.name} format writes only each tool's function")
                       for k in t if k != "function" and (k != "type" or t[k] != "function"))
        if d.tools_pair is not None:
            dropped.extend(Dropped(-1, f"tools[{i}].function.{k}", f"the {d.name} format leaves {k!r} out of a "
                                   "tool's function") for k in fn if k in d.tools_skip)
    each, block, pair = d.tools_each, d.tools_block, d.tools_pair
    assert each is not None and block is not None
    texts: list[Value] = [_tojson(fn) if pair is None else _function_pairs(d, fn, conds) for fn in functions]
    n = len(texts)

    def each_tool(out: Builder) -> None:
        for k, text in enumerate(texts):
            each.render({"tool": text}, {**conds, "first": k == 0, "last": k == n - 1}, out)

    def declared(out: Builder) -> None:
        block.render({"tools": each_tool}, conds, out)
    return last.raw, declared


def _function_pairs(d: LayoutDialect, fn: Mapping[str, Any], conds: Mapping[str, bool]) -> Value:
    """A tool's function key by key: a string value as it is, any other as
    tojson writes it; the keys the format skips left out."""
    pair = d.tools_pair
    assert pair is not None
    items = [(str(k), v if isinstance(v, str) else _tojson(v)) for k, v in fn.items() if k not in d.tools_skip]
    strings = [isinstance(v, str) for k, v in fn.items() if k not in d.tools_skip]
    n = len(items)

    def write(out: Builder) -> None:
        for j, (k, v) in enumerate(items):
            pair.render({"key": k, "value": v}, {**conds, "first": j == 0, "last": j == n - 1, "string": strings[j]},
                        out)
    return write


def _declared_one_by_one(d: LayoutDialect, tools: list[Any], conds: Mapping[str, bool]) -> Value:
    each = d.tools_turn_each
    assert each is not None
    texts = [_tojson(t) for t in tools]

    def write(out: Builder) -> None:
        for t in texts:
            each.render({"tool": t}, conds, out)
    return write


def _suffixed(d: LayoutDialect, m: Msg, conds: Mapping[str, bool]) -> Msg:
    """The message with the format's suffix added to its content, where the
    format adds it (not twice)."""
    sx = d.content_suffix
    if sx is None or m.role != sx[0] or (sx[2] and not holds(sx[2], conds)) or m.content.endswith(sx[1]) or m.parts:
        return m
    return m._replace(content=m.content + sx[1])


def _pairs(d: LayoutDialect, arguments: str, conds: Mapping[str, bool]) -> Value:
    """Arguments (an object's JSON) written pair by pair: a string value as
    it is, any other as tojson writes it."""
    pair = d.call_pair
    assert pair is not None
    items = list(json.loads(arguments).items())

    def write(out: Builder) -> None:
        for k, v in items:
            pair.render({"key": k, "value": v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)},
                        conds, out)
    return write


def _hoisted(d: LayoutDialect, msgs: Sequence[Msg]) -> str:
    return d.system_join.join(m.content for m in msgs if m.role == "system")


def _message_conds(d: LayoutDialect, m: Msg, prev: str, conds: Mapping[str, bool]) -> dict[str, bool]:
    """What a message's frame and body may ask of it (``prev``: the role of
    the message before it, system messages aside)."""
    out = {**conds, "after_user": prev == "user", "after_tool": prev == "tool", "has_calls": bool(m.calls)}
    for f in d.flags:
        out[f] = f in m.flags
    return out


def _cut(d: LayoutDialect, m: Msg, conds: Mapping[str, bool], dropped: list[Dropped] | None) -> Msg:
    """The message with its content cut where the format cuts an assistant's."""
    cut = d.content_cut
    if cut is None or m.role != "assistant" or cut[0] not in m.content or (cut[1] and holds(cut[1], conds)):
        return m
    if dropped is not None:
        dropped.append(Dropped(m.at, "content", f"text before the first {cut[0]} is not written"))
    return m._replace(content=m.content.split(cut[0], 1)[1])


def _written(p: Pattern, conds: Mapping[str, bool]) -> bool:
    b = Builder()
    p.render({}, conds, b)
    return bool(b.finish())


def _shown_flags(d: LayoutDialect, m: Msg, conds: Mapping[str, bool]) -> list[str]:
    """The message's flags that change how its frame is written (the others
    the format does not show)."""
    if not m.flags:
        return []  # most messages: nothing to compare, no render to make
    frame = d.role_frames.get(m.role)
    opening = d.frame_open if frame is None else frame.open

    def text(c: Mapping[str, bool]) -> str:
        b = Builder()
        opening.render({"role": d.roles[m.role].text}, c, b)
        return "".join(seg.text for seg in b.finish())

    here = text(conds)
    return [f for f in sorted(m.flags) if text({**conds, f: False}) != here]


def _hidden_flags(d: LayoutDialect, m: Msg, conds: Mapping[str, bool], dropped: list[Dropped]) -> None:
    shown = _shown_flags(d, m, conds)
    for f in sorted(m.flags):
        if f not in shown:
            dropped.append(Dropped(m.at, f, f"the {d.name} format does not show {f} here"))


def _tool_list(tools: Any) -> list[Any]:
    if not isinstance(tools, list | tuple):
        raise OptionError("tools must be a list of tool schemas", option="tools")
    return list(tools)


def _content(d: LayoutDialect, m: Msg, content: str, conds: Mapping[str, bool]) -> Value:
    """A message's content: its text, or its parts with each image as the
    format's placeholder."""
    if not m.parts:
        return content
    image = d.image
    assert image is not None

    def write(out: Builder) -> None:
        for p in m.parts:
            if p is None:
                image.render({}, conds, out)
            else:
                out.text(p)
    return write


def _tojson(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise OptionError(f"a tool is not JSON: {e}", option="tools") from None


def _last_query(d: LayoutDialect, msgs: Sequence[Msg]) -> int:
    """The index of the last user message that is a query (not tool results
    dressed as a user message); the last message's when there is none."""
    if d.reasoning_show == "after_last_answer":
        return next((k for k in range(len(msgs) - 1, -1, -1) if msgs[k].role == "assistant" and not msgs[k].calls),
                    -1)
    if d.reasoning_show == "after_last_user":
        # The last user message, whatever it holds; none: -1 (every answer).
        return next((k for k in range(len(msgs) - 1, -1, -1) if msgs[k].role == "user"), -1)
    if d.reasoning_show != "after_last_query":
        return len(msgs) - 1
    ex = d.query_excludes
    for k in range(len(msgs) - 1, -1, -1):
        m = msgs[k]
        if m.role == "user" and not (ex is not None and m.content.startswith(ex[0]) and m.content.endswith(ex[1])):
            return k
    return len(msgs) - 1


def _reasoning_of(d: LayoutDialect, m: Msg, k: int, last: bool, last_query: int) -> tuple[str, str, bool, bool]:
    """An assistant message's content and reasoning as the format reads
    them (reasoning taken out of content when none is given), whether the
    history policy shows the reasoning, and whether it was taken out."""
    content, reasoning = m.content, m.reasoning
    split = False
    if reasoning is None and d.reasoning_split is not None and d.reasoning_split[1] in content:
        opening, closing = d.reasoning_split
        parts = content.split(closing)
        content = parts[-1].lstrip("\n")
        reasoning = parts[0].rstrip("\n").split(opening)[-1].lstrip("\n")
        split = True
    r = reasoning or ""
    show = d.reasoning == HISTORY and k > last_query and ((last and d.reasoning_last) or bool(r))
    return content, r, show, split


def _assistant(d: LayoutDialect, m: Msg, k: int, last: bool, last_query: int, conds: Mapping[str, bool],
               body: Pattern, b: Builder, dropped: list[Dropped]) -> None:
    content, r, show, split = _reasoning_of(d, m, k, last, last_query)
    if r and not show:
        dropped.append(Dropped(m.at, "content" if split else "reasoning_content",
                               "reasoning before the last query is not written"))
    each, section = d.calls_each, d.calls_section

    def each_call(out: Builder) -> None:
        assert each is not None
        for j, (name, args) in enumerate(m.calls):
            each.render({"name": name, "arguments": args if d.call_pair is None else _pairs(d, args, conds),
                         "id": m.ids[j] if m.ids else ""},
                        {**conds, "first": j == 0, "has_content": bool(content)}, out)

    def calls(out: Builder) -> None:
        if section is None:
            each_call(out)
        elif m.calls:
            section.render({"calls": each_call}, conds, out)

    body.render({"content": _content(d, m, content, conds), "reasoning": r, "calls": calls},
                {**conds, "show_reasoning": show, "has_text": bool(content.strip())}, b)


def _frame(d: LayoutDialect, role: str, content: str, conds: Mapping[str, bool], b: Builder) -> None:
    r = d.roles[role]
    d.frame_open.render({"role": r.text}, conds, b)
    r.body.render({"content": content}, conds, b)
    d.frame_close.render({}, conds, b)


def normal_form(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The request as a parse of its render returns it: the default system
    message written out, the dropped fields gone."""
    if d.system_hoist is not None:
        return _hoisted_normal_form(d, request, options)
    if d.turns:
        return _turns_normal_form(d, request, options)
    if not d.parseable:
        return _rich_normal_form(d, request, options)
    msgs, resolved, _, _ = read_request(d, request, options)
    out: list[dict[str, Any]] = []
    if d.default_system is not None and msgs[0].role != "system":
        out.append({"role": "system", "content": d.default_system})
    out += [{"role": m.role, "content": m.content} for m in msgs]
    if not resolved["add_generation_prompt"]:
        # Only the generation prompt shows the options: without it they
        # read back as their defaults.
        resolved.update(d.options)
    return {"messages": out, **resolved}


def _rich_normal_form(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`normal_form` of a format with tools in the system turn, calls,
    a reasoning history policy or grouped frames."""
    msgs, resolved, _, opts = read_request(d, request, options)
    out: list[dict[str, Any]] = []
    tools = opts.get("tools") if d.tools == SYSTEM else None
    if not tools and d.default_system is not None and msgs[0].role != "system":
        out.append({"role": "system", "content": d.default_system})
    last_query = _last_query(d, msgs)
    n = len(msgs)
    for k, m in enumerate(msgs):
        if m.role != "assistant":
            out.append({"role": m.role, "content": m.content})
            continue
        content, r, show, _ = _reasoning_of(d, m, k, k == n - 1, last_query)
        msg: dict[str, Any] = {"role": "assistant"}
        if show:
            content = content.lstrip("\n")
            if r.strip("\n"):
                msg["reasoning_content"] = r.strip("\n")
        msg["content"] = content
        if m.calls:
            msg["tool_calls"] = [{"type": "function", "function": {"name": name, "arguments": args}}
                                 for name, args in m.calls]
        out.append(msg)
    result: dict[str, Any] = {"messages": out}
    if tools:
        result["tools"] = json.loads(json.dumps(list(tools)))
    if not resolved["add_generation_prompt"]:
        resolved.update(d.options)
    return {**result, **resolved}


def _turns_normal_form(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`normal_form` of a format whose messages are each a turn of
    their own: names where written as role text, calls with their ids as
    written, tool results with their ids, reasoning where the policy shows
    it, content with images as image parts."""
    msgs, resolved, _, opts = read_request(d, request, options)
    out: list[dict[str, Any]] = []
    tools = opts.get("tools") if d.tools == TURN else None
    if d.default_system is not None and msgs[0].role != "system":
        out.append({"role": "system", "content": d.default_system})
    last_query = _last_query(d, msgs)
    n = len(msgs)
    for k, m in enumerate(msgs):
        msg: dict[str, Any] = {"role": m.role}
        if m.name and m.name != d.roles[m.role].text:
            msg["name"] = m.name
        content = m.content
        if m.role == "assistant":
            content, r, show, _ = _reasoning_of(d, m, k, k == n - 1, last_query)
            if show and r:
                msg["reasoning_content"] = r
            if m.calls:
                msg["tool_calls"] = [_normal_call(d, m, j) for j in range(len(m.calls))]
        elif m.call_id:
            msg["tool_call_id"] = m.call_id
        msg["content"] = _normal_parts(m) if m.parts else content
        if m.name and m.role != "assistant" and not m.parts:
            # A name written as role text may be another role's text, or
            # open the turn another role's body fits: read as the parse reads.
            b = Builder()
            d.roles[m.role].body.render({"content": content, "tool_call_id": m.call_id}, {}, b)
            msg = read_back(d, m.role, m.name, "".join(seg.text for seg in b.finish())) or msg
        out.append(msg)
    result: dict[str, Any] = {"messages": out}
    if tools:
        result["tools"] = json.loads(json.dumps(list(tools)))
    if not resolved["add_generation_prompt"]:
        resolved.update(d.options)
    return {**result, **resolved}


def _normal_call(d: LayoutDialect, m: Msg, j: int) -> dict[str, Any]:
    name, args = m.calls[j]
    if d.arguments == "tojson":
        given = json.loads(args)
        if isinstance(given, str):
            args = given  # a string written quoted reads back as the string
    each = d.calls_each
    if each is not None and "name" not in each.slots():
        name = name_of_id(d, m.ids[j]) or ""
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
    if m.ids and m.ids[j]:
        call["id"] = m.ids[j]
    return call


def _normal_parts(m: Msg) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in m.parts:
        if p is None:
            out.append({"type": "image"})
        elif p:
            if out and out[-1]["type"] == "text":
                out[-1]["text"] += p
            else:
                out.append({"type": "text", "text": p})
    return out


def _hoisted_normal_form(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`normal_form` of a format that writes every system message
    first: one system message of them all, then the others as written (an
    assistant's content cut, its calls without ids, the flags it shows),
    the generation prompt only where the format writes one."""
    msgs, resolved, _, _ = read_request(d, request, options)
    conds = {k: v for k, v in resolved.items() if k in d.options}
    system = _hoisted(d, msgs)
    out: list[dict[str, Any]] = []
    prev = ""
    for m in msgs:
        if m.role == "system":
            continue
        mc = _message_conds(d, m, prev, conds)
        m = _cut(d, m, mc, None)
        msg: dict[str, Any] = {"role": m.role, "content": m.content}
        if not prev and m.role == "assistant" and not _written(_open_of(d, m.role), mc):
            # Nothing opens it: its content reads as the system text's end.
            system, msg["content"] = system + m.content, ""
        if m.calls:
            msg["tool_calls"] = [{"type": "function", "function": {"name": name, "arguments": args}}
                                 for name, args in m.calls]
        for f in _shown_flags(d, m, mc):
            msg[f] = True
        out.append(msg)
        prev = m.role
    if system:
        out.insert(0, {"role": "system", "content": system})
    agp = resolved["add_generation_prompt"] and _written(d.prompt, {**conds, "after_user": prev == "user",
                                                                     "after_tool": prev == "tool"})
    resolved["add_generation_prompt"] = agp
    if not agp:
        resolved.update(d.options)
    return {"messages": out, **resolved}


def _open_of(d: LayoutDialect, role: str) -> Pattern:
    frame = d.role_frames.get(role)
    return d.frame_open if frame is None else frame.open
