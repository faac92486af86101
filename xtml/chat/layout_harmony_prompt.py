"""Prompts of a format that writes one message as several of its own
(:mod:`.layout_split`, harmony's): the parse of a whole prompt and the
normal form, the request as that parse returns it.

The system turn is read by its pattern (its text options, the list
options it shows, the first system message and the tools, which the value
syntax that declared them reads back); then each message by its role's
frame, an assistant's messages grouped as render writes one request message:
its reasoning, then its call or its final text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import OptionError, ParseError, RequestError
from ..lru import Lru
from ..plugins.values import load_value_syntax
from .layout import HISTORY, LayoutDialect
from .layout_call_array import lexed_text
from .layout_fold import declaration
from .layout_harmony import Harmony, call_of, harmony
from .layout_parse import Lexed, _made
from .layout_pattern import ANY_TEXT, options_of, slot_codec
from .layout_request import Dropped, Msg, read_request
from .layout_split import CALL_NAME
from .layout_split_render import _after, _Checks, _lists
from .layout_turn import KEEP

__all__ = ["normal_form_harmony", "parse_prompt_harmony", "read_declaration"]

_N, _C = "\ue021", "\ue022"
_TOKEN = re.compile("[\ud800-\udfff]")


class _Role(NamedTuple):
    role: str
    rx: re.Pattern[str]
    json: bool
    """The content is written as JSON (``tojson``)."""


class _Prompt(NamedTuple):
    h: Harmony
    turn: re.Pattern[str]
    taken: list[tuple[str, bool]]
    head: str
    roles: tuple[_Role, ...]
    call: re.Pattern[str]
    prompt: str


def _prompt(d: LayoutDialect) -> _Prompt:
    h = harmony(d)
    chars = d.chars()
    if d.system_turn is None or d.split is None:
        raise ParseError(f"the layout dialect {d.name!r} writes prompts its reader does not read", offset=0)
    taken: list[tuple[str, bool]] = []
    turn = re.compile(d.system_turn.regex(chars, None, taken), re.S)
    head = lexed_text(d, d.head, {}, d.options) if d.head is not None else ""
    conds = {**d.options, "after_user": False, "after_tool": False, "has_calls": False}
    roles: list[_Role] = []
    for name, r in d.roles.items():
        if name == "assistant" or name in d.split.drop_later:
            continue
        frame = d.role_frames.get(name)
        opening, closing = (d.frame_open, d.frame_close) if frame is None else (frame.open, frame.close)
        text = (lexed_text(d, opening, {"role": r.text, CALL_NAME: _N}, conds)
                + lexed_text(d, r.body, {"content": _C, "tool_call_id": ""}, conds)
                + lexed_text(d, closing, {CALL_NAME: _N}, conds))
        as_json = slot_codec(r.body, "content") == "tojson"
        stand = json.dumps(_C, ensure_ascii=False) if as_json else _C
        rx = re.escape(text).replace(re.escape(stand), f"(?P<content>{ANY_TEXT}*)", 1)
        rx = rx.replace(re.escape(_N), f"(?P<name>{ANY_TEXT}*?)", 1)
        if _N in rx or _C in rx:
            raise ParseError(f"the layout dialect {d.name!r} writes a {name} message its reader does not read",
                             offset=0)
        roles.append(_Role(name, re.compile(rx), as_json))
    call = re.compile(re.escape(h.to + h.namespace) + f"(?P<name>{ANY_TEXT}+?)" + re.escape(
        h.channel + h.call_channel + " " + h.call_type))
    return _Prompt(h, turn, taken, head, tuple(roles), call, lexed_text(d, d.prompt, {}, conds))


_prompts: Lru[int, tuple[LayoutDialect, _Prompt]] = Lru()


def _reader(d: LayoutDialect) -> _Prompt:
    return _made(_prompts, d, _prompt)


def read_declaration(d: LayoutDialect, text: str) -> list[Any]:
    """The tools a declaration written by the dialect's value syntax holds,
    as that syntax reads it back."""
    return list(load_value_syntax(d.tools_syntax).declared(text))


def parse_prompt_harmony(d: LayoutDialect, lx: Lexed) -> dict[str, Any]:
    """A whole rendered request back to its normal form; a ParseError at
    the first place that is not of the format."""
    p = _reader(d)
    h = p.h
    s = lx.text
    if not s.startswith(p.head):
        raise ParseError("expected the format's head", offset=lx.offset(0))
    m = p.turn.match(s, len(p.head))
    if m is None:
        raise ParseError("expected the format's system turn", offset=lx.offset(len(p.head)))
    sp = d.split
    assert sp is not None
    shown = options_of(m, p.taken, {})
    out: dict[str, Any] = {k: m.group(k) for k in d.text_options}
    for name, values in sp.lists.items():
        held = [v for v in values if shown.get(f"{name}_{v}")]
        if held:
            out[name] = held
    messages: list[dict[str, Any]] = []
    system = m.groupdict().get("system")
    if system is not None:
        messages.append({"role": "system", "content": system})
    tools = m.groupdict().get("tools")
    if tools is not None:
        try:
            out["tools"] = read_declaration(d, tools)
        except (ParseError, RequestError) as e:
            at = e.offset if isinstance(e, ParseError) else 0
            raise ParseError(f"a tool declaration that does not read back: {e.msg}",
                             offset=lx.offset(m.start("tools") + min(at, len(tools)))) from None
    pos = m.end()
    n = len(s)
    agp = False
    reasoning: tuple[str, int] | None = None
    while pos < n:
        if s[pos:] == p.prompt and reasoning is None:
            agp = True
            break
        if s[pos] != h.start:
            raise ParseError("expected the start of a message", offset=lx.offset(pos))
        k = pos + 1
        if s.startswith(h.author, k) and s[k + len(h.author):k + len(h.author) + 1] in (" ", h.channel):
            pos, reasoning = _assistant(d, p, lx, k + len(h.author), messages, reasoning)
            continue
        if reasoning is not None:
            raise ParseError("reasoning that no call or answer follows", offset=lx.offset(reasoning[1]))
        for role in p.roles:
            mm = role.rx.match(s, pos)
            if mm is None:
                continue
            content: Any = mm.group("content")
            if role.json:
                try:
                    content = json.loads(content)
                except ValueError:
                    raise ParseError("content that is not JSON", offset=lx.offset(mm.start("content"))) from None
            msg: dict[str, Any] = {"role": role.role, "content": content}
            if "name" in mm.groupdict():
                msg["name"] = mm.group("name")
            messages.append(msg)
            pos = mm.end()
            break
        else:
            raise ParseError("a message that is not of the format", offset=lx.offset(pos))
    if reasoning is not None:
        raise ParseError("reasoning that no call or answer follows", offset=lx.offset(reasoning[1]))
    return {"messages": messages, "add_generation_prompt": agp, **out}


def _assistant(d: LayoutDialect, p: _Prompt, lx: Lexed, pos: int, messages: list[dict[str, Any]],
               reasoning: tuple[str, int] | None) -> tuple[int, tuple[str, int] | None]:
    """One of an answer's messages, from its header: reasoning is held for
    the call or final text it comes before."""
    h = p.h
    s = lx.text
    mi = s.find(h.message, pos)
    if mi < 0:
        raise ParseError("a message with no text", offset=lx.offset(pos))
    header = s[pos:mi]
    tok = _TOKEN.search(s, mi + 1)
    t = len(s) if tok is None else tok.start()
    if t >= len(s) or s[t] not in h.closes:
        raise ParseError("a message that is not closed", offset=lx.offset(t))
    text = s[mi + 1:t]
    close = s[t]
    if header == h.channel + h.reasoning and reasoning is None and close == h.message_close:
        return t + 1, (text, pos)
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning[0]
    cm = p.call.fullmatch(header)
    if cm is not None and close == h.call_close:
        call = call_of(text, cm.group("name"), history=True)
        if isinstance(call, str):
            raise ParseError(call, offset=lx.offset(mi + 1))
        msg["tool_calls"] = [call]
    elif header == h.channel + h.final and (close == h.message_close or (close == h.end_close and t == len(s) - 1)):
        msg["content"] = text
    else:
        raise ParseError("an answer's message that is not written as the format writes one", offset=lx.offset(pos))
    messages.append(msg)
    return t + 1, None


def normal_form_harmony(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The request as a parse of its render returns it: the text options
    and the list options the system turn shows, the first system message
    where its text is written, the tools as their declaration reads back,
    each answer's first call (or its text) and its reasoning where shown,
    each tool result named by the call it answers; what render leaves out,
    gone."""
    sp = d.split
    assert sp is not None
    checks = _Checks(d, sp)
    msgs, resolved, _, opts = read_request(d, request, options, checks)
    _lists(d, sp, opts, dict(resolved), [])
    out: dict[str, Any] = {k: resolved[k] for k in d.text_options}
    for name, values in sp.lists.items():
        given = opts.get(name) or ()
        held = [v for v in values if v in given]
        if held:
            out[name] = held
    tools = opts.get("tools")
    if tools:
        out["tools"] = _tools_read(d, list(tools))
    messages: list[dict[str, Any]] = []
    first = msgs[0]
    start = 0
    if first.role == "system":
        start = 1
        if first.raw is not None and first.raw.get("content"):
            messages.append({"role": "system", "content": first.content})
    n = len(msgs)
    ends = not resolved["add_generation_prompt"]
    after = _after(d, msgs)
    for k in range(start, n):
        m = msgs[k]
        if m.role in sp.drop_later:
            continue
        if m.role == "assistant":
            messages.append(_answer(d, m, k, after, checks.reasoning.get(m.at), ends and k == n - 1))
        elif m.role in d.role_frames and CALL_NAME in d.role_frames[m.role].open.slots():
            messages.append({"role": m.role, "name": checks.names.get(m.at, ""), "content": _content(d, m)})
        else:
            messages.append({"role": m.role, "content": _content(d, m)})
    return {"messages": messages, "add_generation_prompt": resolved["add_generation_prompt"], **out}


def _content(d: LayoutDialect, m: Msg) -> Any:
    raw = m.raw.get("content") if m.raw is not None else None
    if d.parts_by_role.get(m.role) == KEEP and isinstance(raw, list | tuple):
        return json.loads(json.dumps(list(raw), ensure_ascii=False))
    return m.content


def _answer(d: LayoutDialect, m: Msg, k: int, after: int, given: tuple[str, str] | None,
            ends: bool) -> dict[str, Any]:
    """An answer as its messages read back (render's choices, as
    :func:`~.layout_split_render._assistant` makes them)."""
    sp = d.split
    assert sp is not None
    calls = m.calls[:sp.keep_calls] if sp.keep_calls else m.calls
    content = m.content
    reasoning = given[1] if given is not None and d.reasoning == HISTORY else None
    if calls and sp.content_reasoning:
        text = content or reasoning or ""
        content = ""
        show = bool(text) and k > after
    elif sp.ending_given and ends:
        text, show = reasoning or "", reasoning is not None
    else:
        text = reasoning or ""
        show = bool(text) and k > after
    out: dict[str, Any] = {"role": "assistant", "content": "" if calls else content}
    if show:
        out["reasoning_content"] = text
    if calls:
        out["tool_calls"] = [_call(name, args) for name, args in calls]
    return out


def _call(name: str, args: str) -> dict[str, Any]:
    """A call as its message reads back: arguments written by ``tojson``, a
    string read back as the string."""
    value = json.loads(args)
    return {"type": "function", "function": {"name": name, "arguments": value if isinstance(value, str) else args}}


def _tools_read(d: LayoutDialect, tools: Sequence[Any]) -> list[Any]:
    """The tools as their declaration reads back."""
    try:
        return read_declaration(d, declaration(d, tools))
    except ParseError as e:
        raise OptionError(f"the tools' declaration does not read back: {e.msg}", option="tools") from None


def harmony_drops(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> list[Dropped]:
    """What render writes that reads back otherwise, reported: tools whose
    declaration reads back as other tools."""
    _, _, _, opts = read_request(d, request, options)
    tools = opts.get("tools")
    if not tools or not isinstance(tools, list | tuple):
        return []
    try:
        if _tools_read(d, list(tools)) == [dict(t) for t in tools]:
            return []
    except OptionError:
        pass
    return [Dropped(-1, "tools", f"the {d.name} format's declaration of the tools reads back as other tools")]
