"""A request rendered by a layout dialect into pieces of text and tokens,
and its normal form: what a parse of that render gives back."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import OptionError
from ..markup.segments import Segment
from .layout import EACH, HISTORY, SYSTEM, LayoutDialect
from .layout_pattern import Builder, Pattern
from .layout_request import Dropped, Msg, read_request

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
    tools = opts.get("tools") if d.tools == SYSTEM else None
    start = 0
    if tools:
        if not isinstance(tools, list | tuple):
            raise OptionError("tools must be a list of tool schemas", option="tools")
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
    last_query = _last_query(d, msgs)
    n = len(msgs)
    for k in range(start, n):
        m = msgs[k]
        r = d.roles[m.role]
        frame = d.role_frames.get(m.role)
        if frame is None:
            opening, closing, group = d.frame_open, d.frame_close, False
        else:
            opening, closing, group = frame.open, frame.close, frame.group
        if not group or k == 0 or msgs[k - 1].role != m.role:
            opening.render({"role": r.text}, conds, b)
        if m.role == "assistant" and (d.reasoning == HISTORY or d.calls == EACH):
            _assistant(d, m, k, k == n - 1, last_query, conds, r.body, b, dropped)
        else:
            r.body.render({"content": m.content}, conds, b)
        if not group or k == n - 1 or msgs[k + 1].role != m.role:
            closing.render({}, conds, b)
    if resolved["add_generation_prompt"]:
        d.prompt.render({}, conds, b)
    return Rendering(b.finish(), tuple(dropped), resolved, opts)


def _tojson(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise OptionError(f"a tool is not JSON: {e}", option="tools") from None


def _last_query(d: LayoutDialect, msgs: Sequence[Msg]) -> int:
    """The index of the last user message that is a query (not tool results
    dressed as a user message); the last message's when there is none."""
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
    each = d.calls_each

    def calls(out: Builder) -> None:
        assert each is not None
        for j, (name, args) in enumerate(m.calls):
            each.render({"name": name, "arguments": args}, {**conds, "first": j == 0, "has_content": bool(content)},
                        out)

    body.render({"content": content, "reasoning": r, "calls": calls}, {**conds, "show_reasoning": show}, b)


def _frame(d: LayoutDialect, role: str, content: str, conds: Mapping[str, bool], b: Builder) -> None:
    r = d.roles[role]
    d.frame_open.render({"role": r.text}, conds, b)
    r.body.render({"content": content}, conds, b)
    d.frame_close.render({}, conds, b)


def normal_form(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The request as a parse of its render returns it: the default system
    message written out, the dropped fields gone."""
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
