"""Formats that fold tool results into the calling turn (spec.md §12), with
calls' arguments and the tools' declarations written by a value syntax: the
parse of a whole prompt, the normal form, and what render reports of what
reads back otherwise. Render is :mod:`.layout_fold`'s; answers are read by
:mod:`.layout_fold_answer`.

A prompt is read in the order the writer writes it: the head, the system
turn (the options it shows, the system text, each tool declared), then each
message: a turn a frame opens, or an answer that continues the turn before
(no opening); an answer's reasoning block, its calls, the results folded
after them (each back as a tool message under the name written), its
content, then its close, the pending mark (calls without results) or
nothing (results without content: the turn is left open, and content-only
text after it is that turn's content). The declarations are read as values
by the tools' value syntax: the tools come back as the format writes them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ..errors import MessageError, OptionError, ParseError, RequestError
from ..lru import Lru
from ..plugins.values import load_value_syntax
from .layout import HISTORY, LayoutDialect
from .layout_fold import _results, _syntax_arguments, _text, declaration
from .layout_fold_answer import Fold, fold_reader, read_arguments
from .layout_parse import Lexed
from .layout_pattern import Builder
from .layout_request import Dropped, Msg, read_request

__all__ = ["fold_drops", "normal_form_fold", "parse_prompt_fold"]


_TOKEN = re.compile("[\ud800-\udfff]")
"""A token's character in a lexed string."""


def _next_token(s: str, pos: int) -> int:
    m = _TOKEN.search(s, pos)
    return m.start() if m is not None else len(s)


def _lexed(d: LayoutDialect, text: str) -> str:
    chars = d.chars()
    return d.finder().sub(lambda m: chars[m.group()], text)


# -- the tools -------------------------------------------------------------------------------


def _declarations(d: LayoutDialect, f: Fold, s: str, pos: int, lx: Lexed | None) -> tuple[list[Any], int]:
    """The tools declared one after another from ``pos`` (each read as
    values by the tools' value syntax), and where they end."""
    before, body_open, after = f.declaration
    syntax = load_value_syntax(d.tools_syntax) if d.tools_syntax else f.syntax
    out: list[Any] = []
    while before and s.startswith(before, pos):
        start = pos + len(before)
        end = s.find(after, start)
        if end < 0:
            raise _fail("a tool declaration that is not closed", pos, lx)
        text = s[start:end]
        hit = _read.get((id(d), text))
        if hit is not None and hit[0] is d:
            out.append(json.loads(hit[1]))
            pos = end + len(after)
            continue
        k = text.find(body_open)
        if k < 0:
            raise _fail("a tool declaration without its body", start, lx)
        obj, bad, why = read_arguments(d, f, text[k:], None, syntax)
        if obj is None:
            raise _fail(f"a tool declaration that does not read: {why}", start + k + max(bad, 0), lx)
        tool = {"type": "function", "function": {"name": text[:k], **obj}}
        out.append(tool)
        if len(text) <= _READ_TEXT:
            kept = json.dumps(tool, ensure_ascii=False)
            if json.loads(kept) == tool:  # NaN is not itself: such a tool is read each time
                _read.put((id(d), text), (d, kept))
        pos = end + len(after)
    return out, pos


_read: Lru[tuple[int, str], tuple[LayoutDialect, str]] = Lru(128)
"""A tool declaration's text → the tool it reads as (JSON text: each
reading hands out its own copy), per dialect. A client sends the same tools
with every request, and reading them back is most of what a render reads
back and of what a prompt's parse reads."""

_READ_TEXT = 16_384
"""The longest declaration kept: the cache holds the tools clients send,
not one of any size."""


def _fail(msg: str, at: int, lx: Lexed | None) -> ParseError:
    return ParseError(msg, offset=lx.offset(at) if lx is not None else at)


def _normal_tools(d: LayoutDialect, f: Fold, tools: Any) -> list[Any]:
    """The tools as their declaration reads back."""
    if not d.tools_syntax:
        return []
    try:
        text = _lexed(d, declaration(d, tools))
        read, end = _declarations(d, f, text, 0, None)
        if end != len(text):
            raise ParseError("a tool declaration that does not read whole", offset=end)
    except (ParseError, RequestError) as e:
        raise OptionError(f"the tools do not read back as the {d.name} format declares them: {e.msg}",
                          option="tools") from None
    return read


# -- the parse of a prompt -------------------------------------------------------------------


def _system_turn(d: LayoutDialect, f: Fold, lx: Lexed, pos: int) -> tuple[dict[str, bool], dict[str, Any] | None,
                                                                             list[Any] | None, int]:
    """The options the system turn shows, its system message, its tools and
    where it ends."""
    s = lx.text
    for opts, steps in sorted(f.system, key=lambda x: -len(x[1][0][0])):
        if [n for _, n in steps] != ["system", "tools", ""] or not s.startswith(steps[0][0], pos):
            continue
        at = pos + len(steps[0][0])
        end = _next_token(s, at)
        text = s[at:end]
        if not s.startswith(steps[1][0], end):
            continue
        tools, after = _declarations(d, f, s, end + len(steps[1][0]), lx)
        if not s.startswith(steps[2][0], after):
            continue
        st = d.system_turn
        assert st is not None
        # A turn written for no other reason holds a system message, even
        # an empty one.
        b = Builder()
        st.render({"system": "", "tools": ""}, {**opts, "has_system": False, "has_tools": bool(tools),
                                                 "some_tools": bool(tools)}, b)
        system = {"role": "system", "content": text} if text or not b.finish() else None
        return opts, system, tools or None, after + len(steps[2][0])
    none = [opts for opts, _ in f.system if not _turn_written(d, opts)]
    if not none:
        raise _fail("expected the format's system turn", pos, lx)
    return ({**none[0], **d.options} if dict(d.options) in none else none[0]), None, None, pos


def _turn_written(d: LayoutDialect, opts: Mapping[str, bool]) -> bool:
    st = d.system_turn
    assert st is not None
    b = Builder()
    st.render({"system": "", "tools": ""}, {**opts, "has_system": False, "has_tools": False, "some_tools": False}, b)
    return bool(b.finish())


def parse_prompt_fold(d: LayoutDialect, lx: Lexed) -> dict[str, Any]:
    """A whole rendered request back to its normal form."""
    f = fold_reader(d)
    s = lx.text
    if not s.startswith(f.head):
        raise _fail("expected the format's head", 0, lx)
    opts, system, tools, pos = _system_turn(d, f, lx, len(f.head))
    messages: list[dict[str, Any]] = [system] if system is not None else []
    agp = False
    prev = ""
    state = ""  # how the last answer's turn ended: closed, pending, open
    last: dict[str, Any] | None = None
    longest = max(map(len, f.prompts), default=0)
    while pos < len(s):
        if len(s) - pos <= longest and f.prompts.get(s[pos:]) == opts:
            agp = True
            break
        role = next((r for o, r in f.opens.items() if s.startswith(o, pos)), None)
        if role is not None:
            pos += len(next(o for o, r in f.opens.items() if r == role and s.startswith(o, pos)))
        elif prev in d.continues:
            role = prev
        else:
            raise _fail("a message that is not written as the format writes one", pos, lx)
        if role != "assistant":
            end = _next_token(s, pos)
            if not s.startswith(f.frame_close, end):
                raise _fail(f"a {role} message that is not closed", end, lx)
            messages.append({"role": role, "content": s[pos:end]})
            pos, prev, state = end + len(f.frame_close), role, ""
            continue
        if state == "open" and last is not None and role == prev and not _opens_calls(f, s, pos):
            # Content after results left open: that turn's content.
            end = _next_token(s, pos)
            if not s.startswith(f.frame_close, end):
                raise _fail("an answer that is not closed", end, lx)
            last["content"] = s[pos:end]
            pos, state = end + len(f.frame_close), "closed"
            continue
        msg, results, pos, state = _answer(d, f, lx, pos)
        messages.append(msg)
        messages += results
        last, prev = msg, role
    out: dict[str, Any] = {"messages": messages}
    if tools is not None:
        out["tools"] = tools
    return {**out, "add_generation_prompt": agp, **opts}


def _opens_calls(f: Fold, s: str, pos: int) -> bool:
    return s.startswith(f.call[0], pos) or (f.think is not None and s.startswith(f.think[0], pos))


def _answer(d: LayoutDialect, f: Fold, lx: Lexed, pos: int) -> tuple[dict[str, Any], list[dict[str, Any]], int,
                                                                       str]:
    """The answer written from ``pos`` (its open already read): the message,
    the results folded in it, where it ends and how its turn ended."""
    s = lx.text
    reasoning = ""
    if f.think is not None and s.startswith(f.think[0], pos):
        start = pos + len(f.think[0])
        closing = f.think[1][-1:]
        end = s.find(closing, start)
        tail = f.think[1][:-1]
        if end < 0 or not s[start:end].endswith(tail) or end - len(tail) < start:
            raise _fail("a reasoning block that is not closed as the format closes one", start, lx)
        reasoning = s[start:end - len(tail)]
        pos = end + 1
    calls: list[dict[str, Any]] = []
    while s.startswith(f.call[0], pos):
        start = pos + len(f.call[0])
        end = s.find(f.call[1], start)
        if end < 0:
            raise _fail("a call that is not closed", pos, lx)
        inner = s[start:end]
        bad = next((m.start() for m in _TOKEN.finditer(inner) if m.group() not in f.quotes), -1)
        if bad >= 0:
            raise _fail("a token that does not belong in a call", start + bad, lx)
        k = inner.find(f.args_open)
        if k < 0:
            raise _fail("a call without its arguments", start, lx)
        calls.append(_call(d, f, inner[:k], inner[k:]))
        pos = end + len(f.call[1])
    results: list[dict[str, Any]] = []
    before, middle, after = f.result
    while s.startswith(before, pos):
        start = pos + len(before)
        k = s.find(middle, start)
        if k < 0 or _next_token(s, start) < k:
            raise _fail("a tool result that is not written as the format writes one", start, lx)
        c = _next_token(s, k + len(middle))
        if not s.startswith(after, c):
            raise _fail("a tool result that is not closed", c, lx)
        results.append({"role": "tool", "name": s[start:k], "content": s[k + len(middle):c]})
        pos = c + len(after)
    end = _next_token(s, pos)
    msg: dict[str, Any] = {"role": "assistant", "content": s[pos:end]}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    pos = end
    if calls and not results and f.pending:
        if not s.startswith(f.pending, pos):
            raise _fail("calls that are neither answered nor pending", pos, lx)
        return msg, results, pos + len(f.pending), "pending"
    if results and not msg["content"] and not s.startswith(f.frame_close, pos) and d.results_open:
        return msg, results, pos, "open"
    if not s.startswith(f.frame_close, pos):
        raise _fail("an answer that is not closed", pos, lx)
    return msg, results, pos + len(f.frame_close), "closed"


def _call(d: LayoutDialect, f: Fold, name: str, region: str) -> dict[str, Any]:
    """A call of a prompt: an object's arguments as JSON text, else the
    string written between the string's marks."""
    obj, _, _ = read_arguments(d, f, region, None)
    if obj is not None:
        args = json.dumps(obj, ensure_ascii=False)
    else:
        opening, closing = f.string_call
        if not (region.startswith(opening) and region.endswith(closing) and len(region) >= len(opening + closing)):
            raise ParseError("arguments that are neither the syntax's nor a string", offset=0)
        args = region[len(opening):len(region) - len(closing)]
    return {"type": "function", "function": {"name": name, "arguments": args}}


# -- the normal form -------------------------------------------------------------------------


def _written_args(d: LayoutDialect, f: Fold, m: Msg, j: int) -> tuple[str, str, bool]:
    """A call's name and arguments region as a prompt parse reads them, and
    whether they read back as given."""
    name = m.calls[j][0]
    raw = ((m.raw or {}).get("tool_calls") or ())[j]
    fn = raw.get("function", raw) if isinstance(raw, Mapping) else {}
    given = fn.get("arguments") if isinstance(fn, Mapping) else None
    if isinstance(given, str):
        region = f.string_call[0] + given + f.string_call[1]
    else:
        write = _syntax_arguments(d, m, j, given)
        b = Builder()
        if callable(write):
            write(b)
        chars = d.chars()
        region = "".join(chars[seg.text] if seg.special else seg.text for seg in b.finish())
    k = name.find(f.args_open)
    exact = k < 0
    if k >= 0:
        name, region = name[:k], name[k:] + region
    call = _call(d, f, name, region)
    if isinstance(given, str):
        exact = exact and call["function"]["arguments"] == given
    return call["function"]["name"], call["function"]["arguments"], exact


class _Normal:
    """The normal form and what reads back otherwise, computed together."""

    def __init__(self, d: LayoutDialect, request: Any, options: Mapping[str, Any], report: bool = False) -> None:
        f = fold_reader(d)
        msgs, resolved, _, opts = read_request(d, request, options)
        self.dropped: list[Dropped] = []
        conds = {k: v for k, v in resolved.items() if k in d.options}
        given = opts.get("tools")
        some = bool(given) and bool(d.tools_syntax)
        out: list[dict[str, Any]] = []
        start = 0
        if d.system_turn is not None and msgs[0].role in d.system_roles:
            start = 1
            if isinstance((msgs[0].raw or {}).get("content"), list):
                raise MessageError(f"the {d.name} format writes the first {msgs[0].role} message's content as a "
                                   "string: a list of parts is not read there", index=0, path="content")
            text = msgs[0].content.strip()
            if text or not _written_for(d, conds, some):
                out.append({"role": "system", "content": text})
                if msgs[0].role != "system":
                    self.dropped.append(Dropped(0, "role", f"the {d.name} format writes the first "
                                                           f"{msgs[0].role} message as the system text"))
            else:
                self.dropped.append(Dropped(0, "content", "an empty system text beside the format's own reads "
                                                          "back as none"))
        try:
            tools = _normal_tools(d, f, given) if some else None
        except OptionError:
            if not report:
                raise
            tools = None  # render writes it; no parse reads it
            self.dropped.append(Dropped(-1, "tools", f"the {d.name} format declares these tools so that no reading "
                                                     "reads them back"))
        if tools is not None and tools != json.loads(json.dumps(given)):
            self.dropped.append(Dropped(-1, "tools", f"the {d.name} format declares tools in its own syntax: they "
                                                     "read back as it writes them"))
        body = msgs[start:]
        last_user = max((k for k, m in enumerate(body) if m.role == "user"), default=-1)
        prev = ""
        calls_before = False
        open_turn: dict[str, Any] | None = None
        for k, m in enumerate(body):
            if m.role == "tool":
                continue
            if m.role == "assistant" and not m.calls and open_turn is not None and prev == "assistant" \
                    and m.role in d.continues:
                open_turn["content"] = _text(d, m, [])
                self.dropped.append(Dropped(m.at, "content", "an answer that continues a turn left open reads back "
                                                            "as that turn's content"))
                open_turn, calls_before = None, False
                continue
            open_turn = None
            calls_before = bool(m.calls)
            prev = m.role
            msg: dict[str, Any] = {"role": m.role, "content": _text(d, m, [])}
            out.append(msg)
            if m.role != "assistant":
                continue
            results = _results(d, body, k, set()) if m.calls else []
            if m.calls:
                raw = m.raw or {}
                key = next((x for x in d.reasoning_keys or ("reasoning_content", "thinking", "reasoning")
                            if raw.get(x)), None)
                if key is not None and k > last_user and d.reasoning == HISTORY:
                    msg["reasoning_content"] = raw[key]
                msg["tool_calls"] = []
                for j in range(len(m.calls)):
                    name, args, exact = _written_args(d, f, m, j)
                    if not exact:
                        self.dropped.append(Dropped(m.at, "tool_calls", "a call's name or string arguments read "
                                                                        "back otherwise"))
                    msg["tool_calls"].append({"type": "function", "function": {"name": name, "arguments": args}})
            out += [{"role": "tool", "name": name, "content": content} for name, content in results]
            if results and d.results_open and not (m.raw or {}).get("content"):
                open_turn = msg
        result: dict[str, Any] = {"messages": out}
        if tools:
            result["tools"] = tools
        agp = bool(resolved["add_generation_prompt"]) and not calls_before
        self.form = {**result, "add_generation_prompt": agp, **conds}


def _written_for(d: LayoutDialect, conds: Mapping[str, bool], some_tools: bool) -> bool:
    """Whether the system turn is written without a system message."""
    st = d.system_turn
    assert st is not None
    b = Builder()
    st.render({"system": "", "tools": ""}, {**conds, "has_system": False, "has_tools": some_tools,
                                             "some_tools": some_tools}, b)
    return bool(b.finish())


def normal_form_fold(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The request as a parse of its render returns it: the system text
    trimmed (a first developer message as the system message), the tools as
    their declaration reads, each answer's content as written, reasoning
    beside calls after the last user message, calls without ids, results
    folded after their calls back as tool messages under the name written,
    an answer continuing a turn left open merged into it."""
    return _Normal(d, request, options).form


def fold_drops(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> list[Dropped]:
    """What render writes that reads back otherwise, reported."""
    return _Normal(d, request, options, report=True).dropped

