"""Render of a format that writes one request message as several of its own
(:mod:`.layout_split`): the system turn with its list options and the tools
a value syntax declares (``[tools] render = "syntax"``), each message by its
role's frame and body, an answer's reasoning where the history policy (or
the end of the render) shows it, its first calls, and each tool result
named by the call it answers. The order of the refusals is the template's: each message's own
(texts it refuses, content and reasoning both beside calls, a result that
answers no call) come before what the request reader refuses of it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import MessageError, OptionError, shown
from .layout import HISTORY, LayoutDialect
from .layout_fold import declared_by_syntax
from .layout_pattern import Builder, Value
from .layout_render import Rendering
from .layout_request import Dropped, Msg, read_request
from .layout_split import CALL_NAME, ENDS, SOME_TOOLS, SYSTEM_TEXT, SplitLayout
from .layout_turn import KEEP

__all__ = ["render_split"]

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
"""Where a message's reasoning is, in the order transformers aliases them."""


class _Checks:
    """The refusals of each message, in the template's order, called by the
    request reader on each message before its own; the name each tool
    result answers and the reasoning each answer gives, as read."""

    def __init__(self, d: LayoutDialect, sp: SplitLayout) -> None:
        self.d, self.sp = d, sp
        self.names_call = any(CALL_NAME in f.open.slots() or CALL_NAME in f.close.slots()
                              for f in d.role_frames.values()) or CALL_NAME in d.frame_open.slots()
        self.last_call: str | None = None
        self.names: dict[int, str] = {}
        self.reasoning: dict[int, tuple[str, str]] = {}

    def __call__(self, i: int, role: str, m: Mapping[str, Any]) -> None:
        given = [(k, m[k]) for k in _REASONING_KEYS if k in m]
        if any(v != given[0][1] for _, v in given[1:]):
            # Templates read one of the names, the serving layers another.
            raise MessageError(f"reasoning is given as {given[0][0]} and as {given[1][0]}, with other text: give it "
                               "under one name", index=i, path=given[1][0])
        for text in self.sp.forbid.get(role, ()):
            content = m.get("content")
            if isinstance(content, str) and text in content:
                raise MessageError(f"the {self.d.name} format refuses {shown(text)} in content (the template raises "
                                   "on it)", index=i, path="content")
            for k, v in given:
                if isinstance(v, str) and text in v:
                    raise MessageError(f"the {self.d.name} format refuses {shown(text)} in reasoning (the template "
                                       "raises on it)", index=i, path=k)
        if given and isinstance(given[0][1], str):
            self.reasoning[i] = (given[0][0], given[0][1])
        if role == "assistant" and "tool_calls" in m:
            calls = m["tool_calls"]
            if isinstance(calls, list | tuple) and not calls:
                raise MessageError(f"the {self.d.name} format writes an assistant message with tool_calls as its "
                                   "calls: give at least one, or no tool_calls", index=i, path="tool_calls")
            if self.sp.content_reasoning and m.get("content") and given and given[0][1]:
                raise MessageError(f"the {self.d.name} format writes the content beside calls as the reasoning: "
                                   f"give content or {given[0][0]}, not both (the template raises)", index=i,
                                   path=given[0][0])
            first = calls[0] if isinstance(calls, list | tuple) else None
            fn = first.get("function", first) if isinstance(first, Mapping) else None
            name = fn.get("name") if isinstance(fn, Mapping) else None
            self.last_call = name if isinstance(name, str) else None
        elif role == "assistant":
            self.last_call = None  # an answer ends the run of results
        elif role == "tool" and self.names_call:
            if self.last_call is None:
                raise MessageError(f"the {self.d.name} format names a tool result by the call it answers: there is "
                                   "no assistant message with calls before it, since the last answer (the template "
                                   "raises)", index=i, path="role")
            self.names[i] = self.last_call


def render_split(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> Rendering:
    sp = d.split
    assert sp is not None
    checks = _Checks(d, sp)
    msgs, resolved, dropped, opts = read_request(d, request, options, checks)
    conds: dict[str, bool] = {k: v for k, v in resolved.items() if k in d.options}
    conds.update(_lists(d, sp, opts, resolved, dropped))
    b = Builder()
    if d.head is not None:
        d.head.render({}, conds, b)
    start = _system_turn(d, msgs, resolved, opts, conds, b, dropped) if d.system_turn is not None else 0
    n = len(msgs)
    ends = not resolved["add_generation_prompt"]
    after = _after(d, msgs)
    prev = ""
    for k in range(start, n):
        m = msgs[k]
        if m.role in sp.drop_later and k > 0:
            if m.raw is not None and m.raw.get("content") not in (None, "", [], ()):
                dropped.append(Dropped(m.at, "content", f"the {d.name} format writes a {m.role} message only first"))
            continue
        mc = {**conds, "after_user": prev == "user", "after_tool": prev == "tool", "has_calls": bool(m.calls),
              ENDS: ends and k == n - 1}
        prev = m.role
        r = d.roles[m.role]
        frame = d.role_frames.get(m.role)
        opening, closing = (d.frame_open, d.frame_close) if frame is None else (frame.open, frame.close)
        opening.render({"role": r.text, CALL_NAME: checks.names.get(m.at, "")}, mc, b)
        if m.role == "assistant":
            _assistant(d, sp, m, k, after, checks.reasoning.get(m.at), mc, b, dropped)
        else:
            r.body.render({"content": _content(d, m), "tool_call_id": m.call_id}, mc, b)
        closing.render({CALL_NAME: checks.names.get(m.at, "")}, mc, b)
    if resolved["add_generation_prompt"]:
        if not d.prompt.items:
            dropped.append(Dropped(-1, "add_generation_prompt", f"the {d.name} format writes no generation prompt"))
        d.prompt.render({}, {**conds, "after_user": prev == "user", "after_tool": prev == "tool"}, b)
    return Rendering(b.finish(), tuple(dropped), resolved, opts)


def _lists(d: LayoutDialect, sp: SplitLayout, opts: Mapping[str, Any], resolved: dict[str, Any],
           dropped: list[Dropped]) -> dict[str, bool]:
    """The conditions of the list options: each given and not empty, and
    each value it holds; a name the format has no condition for is written
    nowhere (reported)."""
    out: dict[str, bool] = {}
    for name, values in sp.lists.items():
        v = opts.get(name)
        if v is not None and (not isinstance(v, list | tuple) or not all(isinstance(x, str) for x in v)):
            raise OptionError(f"{name} must be a list of names", option=name)
        given = list(v or ())
        resolved[name] = given if v is not None else None
        out[name] = bool(given)
        out.update({f"{name}_{x}": x in given for x in values})
        unknown = [x for x in given if x not in values]
        if unknown:
            dropped.append(Dropped(-1, name, f"the {d.name} format writes nothing for {', '.join(map(shown, unknown))}"
                                             f" (it knows {', '.join(values)})"))
    return out


def _system_turn(d: LayoutDialect, msgs: Sequence[Msg], resolved: Mapping[str, Any], opts: Mapping[str, Any],
                 conds: Mapping[str, bool], b: Builder, dropped: list[Dropped]) -> int:
    """Writes the format's own system turn; the index of the first message
    left to write (past the system message it holds)."""
    turn = d.system_turn
    assert turn is not None
    first = msgs[0]
    has_system = first.role == "system"
    tools = opts.get("tools")
    if tools is not None and not isinstance(tools, list | tuple):
        raise OptionError("tools must be a list of tool schemas", option="tools")
    declared = declared_by_syntax(d, list(tools), dropped) if d.tools_syntax and tools else ""
    values: dict[str, Value] = {"system": first.content if has_system else "", "tools": declared}
    values.update({k: resolved[k] for k in d.text_options})
    text = has_system and first.raw is not None and bool(first.raw.get("content"))
    turn.render(values, {**conds, "has_system": has_system, "has_tools": tools is not None, SOME_TOOLS: bool(tools),
                         SYSTEM_TEXT: text}, b)
    return int(has_system)


def _after(d: LayoutDialect, msgs: Sequence[Msg]) -> int:
    """The index after which the history policy shows reasoning (the last
    message's when it shows none)."""
    n = len(msgs)
    if d.reasoning != HISTORY or d.reasoning_show == "never":
        return n - 1
    if d.reasoning_show == "after_last_answer":
        return next((k for k in range(n - 1, -1, -1) if msgs[k].role == "assistant" and not msgs[k].calls), -1)
    if d.reasoning_show == "after_last_user":
        return next((k for k in range(n - 1, -1, -1) if msgs[k].role == "user"), -1)
    ex = d.query_excludes
    return next((k for k in range(n - 1, -1, -1) if msgs[k].role == "user" and not (
        ex is not None and msgs[k].content.startswith(ex[0]) and msgs[k].content.endswith(ex[1]))), n - 1)


def _assistant(d: LayoutDialect, sp: SplitLayout, m: Msg, k: int, after: int, given: tuple[str, str] | None,
               mc: Mapping[str, bool], b: Builder, dropped: list[Dropped]) -> None:
    """An answer: its reasoning where shown (the content beside calls, where
    the format writes it so), its content, its first calls."""
    calls = m.calls
    if sp.keep_calls and len(calls) > sp.keep_calls:
        dropped.extend(Dropped(m.at, f"tool_calls[{j}]", f"the {d.name} format writes a message's first "
                                                         f"{sp.keep_calls} call(s)")
                       for j in range(sp.keep_calls, len(calls)))
        calls = calls[:sp.keep_calls]
    content = m.content
    key, reasoning = given if given is not None and d.reasoning == HISTORY else ("", None)
    if calls and sp.content_reasoning:
        # Both given were refused: the one given is the reasoning.
        text, key = (content, "content") if content else (reasoning or "", key)
        content = ""
        show = bool(text) and k > after
    elif sp.ending_given and mc[ENDS]:
        text, show = reasoning or "", reasoning is not None
    else:
        text = reasoning or ""
        show = bool(text) and k > after
    if text and not show:
        dropped.append(Dropped(m.at, key, "reasoning the history policy hides is not written"))
    each = d.calls_each

    def write_calls(out: Builder) -> None:
        if each is None:
            return
        for j, (name, args) in enumerate(calls):
            each.render({"name": name, "arguments": args, "id": ""},
                        {**mc, "first": j == 0, "has_content": bool(content)}, out)
    d.roles["assistant"].body.render({"content": content, "reasoning": text, "calls": write_calls},
                                     {**mc, "show_reasoning": show, "has_text": bool(content.strip())}, b)


def _content(d: LayoutDialect, m: Msg) -> Value:
    """A message's content; a list kept as given, as JSON (for a body that
    writes it with ``tojson``)."""
    raw = m.raw.get("content") if m.raw is not None else None
    if d.parts_by_role.get(m.role) == KEEP and isinstance(raw, list | tuple):
        text = json.dumps(list(raw), ensure_ascii=False)

        def write(out: Builder) -> None:
            out.text(text)
        return write
    return m.content

