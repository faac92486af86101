"""Formats with a system turn of their own, each message in a frame of its
role, the tools declared before the last user message (key by key, string
values as they are) and calls as one JSON array after a token: the normal
form, the parse of a whole prompt, and what render reports of it. Render is
:mod:`.layout_render`'s; answers are read by :mod:`.layout_call_array`.

The system turn is read in a fixed order: with the tools' prompt before
without it, the format's own text (its text options read out of it) before
a system message; a system message that spells either reads back as it
(render reports it). A declared string is read up to the first closing
quote that the format's text after a value follows; a value in which such a
quote occurs reads back otherwise (render reports it, and the normal form
reads the declaration as the request spells it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import OptionError, ParseError
from ..lru import Lru
from .layout import LayoutDialect
from .layout_call_array import _decoded, _pieces, lexed_text, read_answer
from .layout_parse import Lexed, _made, _slot_regex
from .layout_pattern import ANY_TEXT, Builder
from .layout_render import _before_last_user, _normal_parts
from .layout_request import Dropped, Msg, read_request

__all__ = ["normal_form_system_turn", "parse_prompt_system_turn", "system_turn_drops"]

_TOOL, _KEY, _VALUE, _TOOLS, _SYSTEM = "\ue006", "\ue007", "\ue008", "\ue009", "\ue00a"


class _Pair(NamedTuple):
    first: str
    """Before the first key; ``more``: before each later one."""
    more: str
    after_key: dict[bool, str]
    """After a key, by whether the value is a string (then it opens it)."""
    close: str
    """After a string value."""


class _Turn(NamedTuple):
    turns: list[tuple[bool, bool, re.Pattern[str]]]
    """(tools given, system message given, the system turn's expression), in
    the order they are tried."""
    block: re.Pattern[str] | None
    """The declaration (group ``tools``)."""
    each: dict[tuple[bool, bool], tuple[str, str]]
    """(first, last) → the text before and after one tool."""
    pair: _Pair | None
    skip: frozenset[str]
    head: str


class _Frames(NamedTuple):
    """What the parse of a prompt reads beside :class:`_Turn` (render, whose
    drops read only that, may run on a copy of the dialect with its frames
    marked)."""

    roles: list[tuple[str, re.Pattern[str]]]
    """Each role but the assistant's: its whole frame (groups ``content``,
    ``tool_call_id``)."""
    openers: str
    """The tokens that open those frames."""
    image: str
    user_starts: str
    """What a user message starts with (a declaration is followed by one)."""


def _turn(d: LayoutDialect) -> _Turn:
    chars = d.chars()
    st = d.system_turn
    if st is None:
        raise ParseError(f"the layout dialect {d.name!r} has no system turn", offset=0)
    turns = []
    for has_tools in (True, False):
        for has_system in (False, True):
            conds = {**d.options, "has_tools": has_tools, "has_system": has_system, "some_tools": has_tools}
            turns.append((has_tools, has_system, re.compile(st.regex(chars, conds))))
    block = None
    each: dict[tuple[bool, bool], tuple[str, str]] = {}
    pair = None
    if d.tools_block is not None and d.tools_each is not None:
        block = re.compile(_slot_regex(d.tools_block, chars, {"tools": f"(?P<tools>{ANY_TEXT}*+)"}))
        for first in (True, False):
            for last in (True, False):
                text = lexed_text(d, d.tools_each, {"tool": _TOOL}, {**d.options, "first": first, "last": last})
                steps = _pieces(text, {"tool": _TOOL})
                each[first, last] = (steps[0][0], steps[1][0])
    tp = d.tools_pair
    if tp is not None:

        def pair_steps(first: bool, string: bool) -> tuple[tuple[str, str], ...]:
            assert tp is not None
            return _pieces(lexed_text(d, tp, {"key": _KEY, "value": _VALUE},
                                      {**d.options, "first": first, "last": False, "string": string}),
                           {"key": _KEY, "value": _VALUE})

        s1, s0, m1 = pair_steps(True, True), pair_steps(True, False), pair_steps(False, True)
        pair = _Pair(s1[0][0], m1[0][0], {True: s1[1][0], False: s0[1][0]}, s1[2][0])
    head = lexed_text(d, d.head, {}, d.options) if d.head is not None else ""
    return _Turn(turns, block, each, pair, frozenset(d.tools_skip), head)


def _frames(d: LayoutDialect) -> _Frames:
    chars = d.chars()
    roles = []
    openers = []
    image = d.image.regex(chars) if d.image is not None else ""
    for role, f in d.role_frames.items():
        if role == "assistant":
            continue
        content = f"(?P<content>(?:{ANY_TEXT}|{image})*)" if image and role == "user" else f"(?P<content>{ANY_TEXT}*)"
        call_id = f"(?P<tool_call_id>{ANY_TEXT}{{{d.id_tail}}})" if d.id_tail else f"(?P<tool_call_id>{ANY_TEXT}*?)"
        rx = f.open.regex(chars) + _slot_regex(d.roles[role].body, chars, {"content": content,
                                                                           "tool_call_id": call_id}) \
            + f.close.regex(chars)
        roles.append((role, re.compile(rx)))
        opening = lexed_text(d, f.open, {}, d.options)[:1]
        if opening in chars.values():
            openers.append(opening)
    user = d.role_frames.get("user")
    starts = lexed_text(d, user.open, {}, d.options) if user is not None else ""
    return _Frames(roles, "".join(openers), image, starts)


_turns: Lru[int, tuple[LayoutDialect, _Turn]] = Lru()
_frame_readers: Lru[int, tuple[LayoutDialect, _Frames]] = Lru()


def _reader(d: LayoutDialect) -> _Turn:
    return _made(_turns, d, _turn)


# -- the parse of a prompt -------------------------------------------------------------------


def parse_prompt_system_turn(d: LayoutDialect, lx: Lexed) -> dict[str, Any]:
    """A whole rendered request back to its normal form: the head, the
    system turn, then each message, the declaration before a user message
    read as the request's tools."""
    t = _reader(d)
    f = _made(_frame_readers, d, _frames)
    s = lx.text
    if not s.startswith(t.head):
        raise ParseError("expected the format's head", offset=lx.offset(0))
    pos = len(t.head)
    turn = _system_of(t, s, pos)
    if turn is None:
        raise ParseError("expected the format's system turn", offset=lx.offset(pos))
    has_tools, has_system, m = turn
    messages: list[dict[str, Any]] = []
    if has_system:
        messages.append({"role": "system", "content": m.group("system") or ""})
    texts = {k: m.group(k) for k in d.text_options if m.groupdict().get(k) is not None}
    tools: list[Any] | None = [] if has_tools else None
    declared: list[Any] | None = None
    pos = m.end()
    while pos < len(s):
        mb = t.block.match(s, pos) if t.block is not None else None
        if mb is not None:
            read = _declaration(t, lx, mb.group("tools"), mb.start("tools"))
            if declared is not None and read != declared:
                raise ParseError("a tool declaration that is not the one before it", offset=lx.offset(pos))
            if not s.startswith(f.user_starts, mb.end()) or mb.end() == len(s):
                raise ParseError("a tool declaration that no user message follows", offset=lx.offset(mb.end()))
            declared, pos = read, mb.end()
            continue
        for role, rx in f.roles:
            mr = rx.match(s, pos)
            if mr is not None:
                messages.append(_message(f, role, mr))
                pos = mr.end()
                break
        else:
            if s[pos] in f.openers:
                raise ParseError("a message that is not written as the format writes one", offset=lx.offset(pos))
            msg, pos = read_answer(d, lx, pos)
            messages.append(msg)
    if declared is not None:
        tools = declared
    out: dict[str, Any] = {"messages": messages}
    if tools is not None:
        out["tools"] = tools
    return {**out, "add_generation_prompt": False, **d.options, **texts}


def _system_of(t: _Turn, s: str, pos: int) -> tuple[bool, bool, re.Match[str]] | None:
    for has_tools, has_system, rx in t.turns:
        m = rx.match(s, pos)
        if m is not None:
            return has_tools, has_system, m
    return None


def _message(t: _Frames, role: str, m: re.Match[str]) -> dict[str, Any]:
    groups = m.groupdict()
    content: Any = groups.get("content") or ""
    if t.image and role == "user" and re.search(t.image, content):
        parts: list[str | None] = []
        for k, piece in enumerate(re.split(t.image, content)):
            if k:
                parts.append(None)
            parts.append(piece)
        content = _normal_parts(Msg(role, "", 0, parts=tuple(parts)))
    msg: dict[str, Any] = {"role": role, "content": content}
    if groups.get("tool_call_id") is not None:
        msg["tool_call_id"] = groups["tool_call_id"]
    return msg


_TRIES = 64
"""How many other readings of the declared strings a declaration is read
with, at most, before it is refused (each a reading of what follows)."""


class _Miss(Exception):
    def __init__(self, at: int, what: str) -> None:
        super().__init__(what)
        self.at = at
        self.what = what


def _declaration(t: _Turn, lx: Lexed | None, text: str, base: int) -> list[Any]:
    """The tools of a declaration: each tool's function key by key, a string
    value up to the first closing quote the format's text after a value
    follows (the next key's opening, or the tool's end); where what follows
    then does not read, up to the next such quote (a bounded number of
    times)."""
    assert t.pair is not None
    p = t.pair
    tool_end = _common(t.each[False, True][1], t.each[False, False][1])
    sep = _common(p.after_key[True], p.after_key[False])
    # A string that may end later: (where it starts, its key, where its
    # next end is looked for, how many tools and which function with how
    # many keys were read before it).
    choices: list[tuple[int, str, int, int, dict[str, Any], int]] = []
    out: list[Any] = []
    fn: dict[str, Any] | None = None
    pos = 0
    tries = _TRIES
    while True:
        try:
            if fn is None:
                if pos == len(text) and (out or not text):
                    return out
                before = t.each[not out, False][0]
                if not text.startswith(before, pos):
                    raise _Miss(pos, "a tool declaration that is not as the format writes one")
                pos += len(before)
                fn = {}
            elif text.startswith(tool_end, pos):
                for is_last in (True, False):
                    after = t.each[not out, is_last][1]
                    if text.startswith(after, pos) and (pos + len(after) == len(text)) == is_last:
                        pos += len(after)
                        break
                else:
                    raise _Miss(pos, "a tool that does not end as the format ends one")
                out.append({"type": "function", "function": fn})
                fn = None
            else:
                lead = p.more if fn else p.first
                if not text.startswith(lead, pos):
                    raise _Miss(pos, "a tool's key that is not as the format writes one")
                pos += len(lead)
                k = text.find(sep, pos)
                if k < 0:
                    raise _Miss(pos, "a tool's key that is not closed")
                key, pos = text[pos:k], k
                if key in fn:
                    raise _Miss(pos, "a tool's key given twice")
                if text.startswith(p.after_key[True], pos):
                    pos += len(p.after_key[True])
                    end = _string_end(text, pos, p.close, (p.more, tool_end))
                    if end < 0:
                        raise _Miss(pos, "a tool's string value that is not closed")
                    choices.append((pos, key, end + 1, len(out), fn, len(fn)))
                    fn[key], pos = text[pos:end], end + len(p.close)
                else:
                    pos += len(p.after_key[False])
                    value, end = _decoded(text, pos)
                    if end == pos:
                        raise _Miss(pos, "a tool's value that is not JSON")
                    fn[key], pos = value, end
        except _Miss as miss:
            k = -1
            while choices and tries and k < 0:
                start, key, resume, n_tools, read, n_keys = choices.pop()
                k = _string_end(text, resume, p.close, (p.more, tool_end))
                tries -= 1
            if k < 0:
                raise ParseError(miss.what, offset=lx.offset(base + miss.at) if lx is not None else miss.at) \
                    from None
            choices.append((start, key, k + 1, n_tools, read, n_keys))
            del out[n_tools:]
            fn = dict(list(read.items())[:n_keys])
            fn[key], pos = text[start:k], k + len(p.close)


def _common(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _string_end(text: str, pos: int, close: str, then: Sequence[str]) -> int:
    """Where a string value that starts at (or ends no sooner than) ``pos``
    ends: the first ``close`` that one of ``then`` follows; -1 where none
    does."""
    k = text.find(close, pos)
    while k >= 0:
        if any(text.startswith(x, k + len(close)) for x in then):
            return k
        k = text.find(close, k + 1)
    return -1


# -- the normal form -------------------------------------------------------------------------


def _normal_tools(d: LayoutDialect, t: _Turn, tools: Sequence[Any]) -> tuple[list[Any], bool]:
    """The tools as the declaration reads back, and whether each reads back
    as given (else the declaration as the request spells it is read)."""
    assert t.pair is not None
    p = t.pair
    tool_end = _common(t.each[False, True][1], t.each[False, False][1])
    out: list[Any] = []
    exact = True
    for tool in tools:
        fn = tool["function"]
        items = [(str(k), v) for k, v in fn.items() if k not in t.skip]
        normal: dict[str, Any] = {}
        for j, (k, v) in enumerate(items):
            sep = _common(p.after_key[True], p.after_key[False])
            if (k + sep).find(sep) != len(k) or k in normal:
                exact = False
            if isinstance(v, str):
                then = p.more if j + 1 < len(items) else tool_end
                if _string_end(v + p.close + then, 0, p.close, (p.more, tool_end)) != len(v):
                    exact = False
                normal[k] = v
            else:
                normal[k] = json.loads(json.dumps(v, ensure_ascii=False))
        out.append({"type": "function", "function": normal})
    return out, exact


def _spelled_tools(d: LayoutDialect, msgs: Sequence[Msg], opts: Mapping[str, Any], conds: Mapping[str, bool],
                   t: _Turn) -> list[Any]:
    """The declaration the request spells, read back: where a key or a
    string reads otherwise, only a reading says what it reads as."""
    made = _before_last_user(d, msgs, opts, conds, [])
    assert made is not None
    b = Builder()
    made[1](b)
    chars = d.chars()
    text = "".join(chars[seg.text] if seg.special else seg.text for seg in b.finish())
    assert t.block is not None
    m = t.block.fullmatch(text)
    if m is None:
        raise ParseError("a tool declaration that does not read back", offset=0)
    return _declaration(t, None, m.group("tools"), m.start("tools"))


def _tools_read(d: LayoutDialect, msgs: Sequence[Msg], opts: Mapping[str, Any], conds: Mapping[str, bool],
                t: _Turn, given: Sequence[Any]) -> list[Any]:
    tools, exact = _normal_tools(d, t, given)
    if exact:
        return tools
    try:
        return _spelled_tools(d, msgs, opts, conds, t)
    except ParseError as e:
        raise OptionError(f"the tools do not read back as the {d.name} format declares them (their strings are "
                          f"written unescaped): {e.msg}", option="tools") from None


def _system_read(d: LayoutDialect, t: _Turn, msgs: Sequence[Msg], resolved: Mapping[str, Any], given: Any,
                 conds: Mapping[str, bool]) -> tuple[bool, str | None, dict[str, str]]:
    """How the system turn reads back: whether it shows tools given, the
    system message's text (None: none), the text options it shows."""
    st = d.system_turn
    assert st is not None
    has_system = msgs[0].role in d.system_roles
    values = {"system": msgs[0].content if has_system else "", "tools": "",
              **{k: resolved[k] for k in d.text_options}}
    text = lexed_text(d, st, values, {**conds, "has_system": has_system, "has_tools": given is not None,
                                      "some_tools": bool(given)})
    found = _system_of(t, text, 0)
    if found is None or found[2].end() != len(text):
        raise ParseError("a system turn that does not read back", offset=0)
    has_tools, read_system, m = found
    texts = {k: m.group(k) for k in d.text_options if m.groupdict().get(k) is not None}
    return has_tools, (m.group("system") or "") if read_system else None, texts


def normal_form_system_turn(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The request as a parse of its render returns it: the system message
    only where one was given (else the text options the format's own text
    shows), the tools as the declaration reads back (none given but the
    tools' prompt written: an empty list), content beside calls gone, ids
    cut, a result's content as written, no generation prompt."""
    msgs, resolved, _, opts = read_request(d, request, options)
    t = _reader(d)
    conds = {k: v for k, v in resolved.items() if k in d.options}
    given = opts.get("tools")
    has_tools, system, texts = _system_read(d, t, msgs, resolved, given, conds)
    out: list[dict[str, Any]] = []
    if system is not None:
        out.append({"role": msgs[0].role, "content": system})
    start = int(msgs[0].role in d.system_roles)
    for m in msgs[start:]:
        msg: dict[str, Any] = {"role": m.role, "content": _normal_parts(m) if m.parts else m.content}
        if m.role == "assistant" and m.calls:
            msg["tool_calls"] = [_normal_call(m, j) for j in range(len(m.calls))]
        if m.role != "assistant" and "tool_call_id" in d.roles[m.role].body.slots():
            msg["tool_call_id"] = m.call_id
        out.append(msg)
    result: dict[str, Any] = {"messages": out}
    if given is not None and any(m.role == "user" for m in msgs) and t.block is not None:
        result["tools"] = _tools_read(d, msgs, opts, conds, t, given)
    elif has_tools:
        result["tools"] = []
    return {**result, "add_generation_prompt": False, **d.options, **texts}


def _normal_call(m: Msg, j: int) -> dict[str, Any]:
    name, args = m.calls[j]
    given = json.loads(args)
    call: dict[str, Any] = {"type": "function", "function": {
        "name": name, "arguments": given if isinstance(given, str) else args}}
    if m.ids:
        call["id"] = m.ids[j]
    return call


def _read_otherwise(d: LayoutDialect, t: _Turn, msgs: Sequence[Msg], opts: Mapping[str, Any],
                    conds: Mapping[str, bool], given: Sequence[Any]) -> bool:
    """Whether the declaration reads back as other tools than given: only
    where a key or a string holds a closing quote the format's text after a
    value follows (another reading of it may then be the first that reads)."""
    tools, exact = _normal_tools(d, t, given)
    if exact:
        return False
    try:
        return _spelled_tools(d, msgs, opts, conds, t) != tools
    except ParseError:
        return True  # no reading of it reads whole: parse refuses it


def system_turn_drops(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> list[Dropped]:
    """What render writes that reads back otherwise, reported: a system
    message that spells the format's own text (the tools' prompt, the
    default system prompt), a declaration whose keys or strings a closing
    quote in them cuts otherwise."""
    msgs, resolved, _, opts = read_request(d, request, options)
    given = opts.get("tools")
    has_system = msgs[0].role in d.system_roles
    if not has_system and given is None:
        return []
    t = _reader(d)
    conds = {k: v for k, v in resolved.items() if k in d.options}
    out: list[Dropped] = []
    if has_system:
        has_tools, system, _ = _system_read(d, t, msgs, resolved, given, conds)
        if system != msgs[0].content or has_tools != (given is not None):
            out.append(Dropped(0, "content", "the system message spells the format's own system text: it reads "
                                             "back as that text"))
    if given and any(m.role == "user" for m in msgs) and t.block is not None and \
            _read_otherwise(d, t, msgs, opts, conds, given):
        out.append(Dropped(-1, "tools", "a declared key or string holds a quote the format's text after it "
                                        "follows: written unescaped, it reads back otherwise"))
    return out
