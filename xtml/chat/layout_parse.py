"""The parse of a layout dialect's text: a whole prompt back to its
request (:func:`parse_prompt`), and what a model generated after the
generation prompt to one assistant message (:func:`parse_completion`),
strictly or leniently. Both read a :class:`Lexed` string with the same
patterns render writes."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

from ..errors import ParseError, shown
from ..lru import Lru
from ..plugins import jsonfmt
from .layout import EACH, HISTORY, LayoutDialect
from .layout_pattern import ANY_TEXT, TOKEN_BASE, Cond, Lit, Pattern, Slot, Tok, items_regex, options_of
from .layout_request import name_of_id

__all__ = ["Lexed", "compiled", "first_of", "parse_completion", "parse_prompt", "shape"]


class Lexed(NamedTuple):
    """Model output or a prompt as a parse reads it: text, with each token of
    the dialect as its character (:func:`~.layout_pattern.token_char`), and where each
    character came from."""

    text: str
    offset: Callable[[int], int]
    """Character index → the offset of its token (or text character)."""


class _Compiled:
    """A dialect's patterns as regular expressions over lexed strings."""

    def __init__(self, d: LayoutDialect) -> None:
        chars = d.chars()
        self.chars = chars
        self.open = re.compile(d.frame_open.regex(chars))
        close = d.frame_close.regex(chars)
        closed = d.frame_close.opens_with_token
        self.bodies = {r.text: (r.name, re.compile(r.body.regex(chars, closed=closed) + close))
                       for r in d.roles.values()}

        self.taken: list[tuple[str, bool]] = []
        self.prompt = re.compile(d.prompt.regex(chars, None, self.taken))


# What is made from a dialect, by the dialect's identity (a frozen dialect
# takes no attribute), under the one bound of the process's caches; the
# dialect is kept beside it, so an id reused by another object misses.
_compiled: Lru[int, tuple[LayoutDialect, _Compiled]] = Lru()
_shapes: Lru[int, tuple[LayoutDialect, _Shape]] = Lru()
_T = TypeVar("_T")


def _made(cache: Lru[int, tuple[LayoutDialect, _T]], d: LayoutDialect, make: Callable[[LayoutDialect], _T]) -> _T:
    hit = cache.get(id(d))
    if hit is not None and hit[0] is d:
        return hit[1]
    return cache.put(id(d), (d, make(d)))[1]


def compiled(d: LayoutDialect) -> _Compiled:
    if not d.parseable:
        raise ParseError(f"parsing is not yet available for the layout dialect {d.name!r}", offset=0)
    return _made(_compiled, d, _Compiled)


def parse_prompt(d: LayoutDialect, lx: Lexed) -> dict[str, Any]:
    """A whole rendered request back to its normal form; raises
    :class:`ParseError` at the first place it is not of the format."""
    if d.system_hoist is not None:
        return _parse_hoisted(d, lx)
    if d.turns:
        return _parse_turns(d, lx)
    if not d.parseable:
        return _parse_rich(d, lx)
    c = compiled(d)
    s = lx.text
    conds = dict(d.options)
    messages: list[dict[str, Any]] = []
    pos = 0
    agp = False
    while pos < len(s):
        mp = c.prompt.fullmatch(s, pos)
        if mp is not None:
            agp = True
            conds = options_of(mp, c.taken, d.options)
            break
        m = c.open.match(s, pos)
        if m is None:
            raise ParseError("expected the start of a message", offset=lx.offset(pos))
        role_text = m.group("role")
        hit = c.bodies.get(role_text)
        if hit is None:
            raise ParseError(f"unknown role {shown(role_text)}", offset=lx.offset(m.start("role")))
        role, body = hit
        mb = body.match(s, m.end())
        if mb is None:
            raise ParseError(f"a {role} message that does not end as the format ends one",
                             offset=lx.offset(m.end()))
        messages.append({"role": role, "content": mb.groupdict().get("content") or ""})
        pos = mb.end()
    return {"messages": messages, "add_generation_prompt": agp, **conds}


def _slot_regex(p: Pattern, chars: Mapping[str, str], subs: Mapping[str, str], then: str = "",
                tight: Mapping[str, Callable[[str], str | None]] | None = None) -> str:
    """A pattern's regular expression with some slots replaced by others'.
    ``then``: the token that follows the pattern in the expression, if one
    does; ``tight``: for a replaced slot, its expression when it is right
    before a given token (None where that token does not end it)."""
    out: list[str] = []
    items = p.items
    for k, i in enumerate(items):
        after = items[k + 1] if k + 1 < len(items) else None
        nxt = chars[after.token] if isinstance(after, Tok) else then if after is None else ""
        if isinstance(i, Slot) and i.name in subs:
            fast = tight[i.name](nxt) if tight is not None and i.name in tight and nxt else None
            out.append(subs[i.name] if fast is None else fast)
        else:
            out.append(items_regex((i,), chars, None, None, bool(nxt)))
    return "".join(out)


def _all_text(name: str) -> Callable[[str], str | None]:
    """A text slot right before a token: all the text up to the token."""
    return lambda then: f"(?P<{name}>{ANY_TEXT}*+)"


def _first_token(p: Pattern, chars: Mapping[str, str]) -> str:
    """The token a pattern starts with, or "" when it starts otherwise."""
    first = p.items[0] if p.items else None
    return chars[first.token] if isinstance(first, Tok) else ""


class _Rich(NamedTuple):
    system_with_tools: re.Pattern[str] | None
    open: re.Pattern[str]
    close: re.Pattern[str]
    runs: dict[str, tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]]
    """Role → its frame's open, its body (slot ``content``), its close."""
    bodies: dict[str, re.Pattern[str]]
    """Role text → the body and close of a role's message, but the assistant's."""
    prompt: re.Pattern[str]
    taken: list[tuple[str, bool]]
    names: dict[str, str]
    """Role text → the first role written with it."""
    end: str
    """The frame's closing token (where an assistant's message ends), or none."""


def _rich(d: LayoutDialect) -> _Rich:
    chars = d.chars()
    swt = None
    if d.system_with_tools is not None and d.tools_block is not None and d.tools_each is not None:
        block = _slot_regex(d.tools_block, chars, {"tools": f"(?P<tools>{ANY_TEXT}*?)"})
        swt = re.compile(_slot_regex(d.system_with_tools, chars, {"tools": block}))
    close = d.frame_close.regex(chars)
    runs = {r: (re.compile(f.open.regex(chars).replace("(?P<role>", "(?:")),
                re.compile(d.roles[r].body.regex(chars)), re.compile(f.close.regex(chars)))
            for r, f in d.role_frames.items()}
    closed = d.frame_close.opens_with_token
    bodies = {r.text: re.compile(r.body.regex(chars, closed=closed) + close) for r in d.roles.values()
              if r.name != "assistant"}
    taken: list[tuple[str, bool]] = []
    prompt = re.compile(d.prompt.regex(chars, None, taken))
    names: dict[str, str] = {}
    for r in d.roles.values():
        names.setdefault(r.text, r.name)
    ends = [chars[i.token] for i in d.frame_close.items if isinstance(i, Tok)]
    return _Rich(swt, re.compile(d.frame_open.regex(chars)), re.compile(close), runs, bodies, prompt, taken,
                 names, ends[0] if ends else "")


_rich_readers: Lru[int, tuple[LayoutDialect, _Rich]] = Lru()


def _parse_rich(d: LayoutDialect, lx: Lexed) -> dict[str, Any]:
    rich = _made(_rich_readers, d, _rich)
    s = lx.text
    messages: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    pos = 0
    if rich.system_with_tools is not None:
        m = rich.system_with_tools.match(s)
        if m is not None:
            if m.group("system") is not None:
                messages.append({"role": "system", "content": m.group("system")})
            result["tools"] = declared_tools(m, lx, per_line=True)
            pos = m.end()
    conds = dict(d.options)
    agp = False
    while pos < len(s):
        mp = rich.prompt.fullmatch(s, pos)
        if mp is not None:
            agp = True
            conds = options_of(mp, rich.taken, d.options)
            break
        run = _read_run(rich, s, pos)
        if run is not None:
            role, contents, pos = run
            messages += [{"role": role, "content": c} for c in contents]
            continue
        m = rich.open.match(s, pos)
        if m is None:
            raise ParseError("expected the start of a message", offset=lx.offset(pos))
        role_text = m.group("role")
        named = rich.names.get(role_text)
        if named is None:
            raise ParseError(f"unknown role {shown(role_text)}", offset=lx.offset(m.start("role")))
        if named == "assistant":
            end = s.find(rich.end, m.end()) if rich.end else -1
            if end < 0:
                raise ParseError("an assistant message that is not closed", offset=lx.offset(m.end()))
            sub = Lexed(s[m.end():end + 1], _shifted(lx, m.end()))
            msg = parse_completion(d, sub, lenient=False)
            mc = rich.close.match(s, end)
            if mc is None:
                raise ParseError("an assistant message that does not end as the format ends one",
                                 offset=lx.offset(end))
            messages.append(msg)
            pos = mc.end()
            continue
        mb = rich.bodies[role_text].match(s, m.end())
        if mb is None:
            raise ParseError(f"a {named} message that does not end as the format ends one",
                             offset=lx.offset(m.end()))
        messages.append({"role": named, "content": mb.group("content") or ""})
        pos = mb.end()
    return {"messages": messages, **result, "add_generation_prompt": agp, **conds}


class _Turns(NamedTuple):
    tools: re.Pattern[str] | None
    """The declaration's turn (group ``tools``)."""
    opens: list[tuple[str, re.Pattern[str]]]
    """Each role and its frame's open (group ``role``), in the order a text
    that names no role tries them: bodies that start with text first."""
    bodies: dict[str, re.Pattern[str]]
    """Each role but the assistant's: its body and close."""
    close: dict[str, re.Pattern[str]]
    """Each role's close."""
    end: str
    """The token that ends an assistant's turn (read as its answer's stop)."""
    image: re.Pattern[str] | None
    prompt: re.Pattern[str]
    taken: list[tuple[str, bool]]


def _turns(d: LayoutDialect) -> _Turns:
    chars = d.chars()
    tools = None
    if d.tools_turn is not None:
        tools = re.compile(_slot_regex(d.tools_turn, chars, {"tools": f"(?P<tools>{ANY_TEXT}*?)"},
                                       tight={"tools": _all_text("tools")}))
    image = d.image.regex(chars) if d.image is not None else None
    content = {"content": f"(?P<content>(?:{ANY_TEXT}|{image})*?)"} if image is not None else {}
    # Before a token an image does not start with, the content is all the
    # text and images there are: read without backtracking.
    image_first = _first_token(d.image, chars) if d.image is not None else ""

    def tight(then: str) -> str | None:
        if image is None or not image_first or then == image_first:
            return None
        return f"(?P<content>{ANY_TEXT}*+(?:{image}{ANY_TEXT}*+)*+)"

    def frame(role: str) -> tuple[Pattern, Pattern]:
        f = d.role_frames.get(role)
        return (d.frame_open, d.frame_close) if f is None else (f.open, f.close)

    order = sorted(d.roles, key=lambda r: not (d.roles[r].body.items and isinstance(d.roles[r].body.items[0], Lit)))
    opens = [(r, re.compile(frame(r)[0].regex(chars))) for r in order]
    close = {r: frame(r)[1].regex(chars) for r in d.roles}
    bodies = {r: re.compile(_slot_regex(d.roles[r].body, chars, content, _first_token(frame(r)[1], chars),
                                        {"content": tight}) + close[r])
              for r in d.roles if r != "assistant"}
    closes = {r: re.compile(c) for r, c in close.items()}
    taken: list[tuple[str, bool]] = []
    prompt = re.compile(d.prompt.regex(chars, None, taken))
    ends = [i.token for i in frame("assistant")[1].items if isinstance(i, Tok)]
    return _Turns(tools, opens, bodies, closes, chars[ends[0]] if ends else "",
                  re.compile(image) if image is not None else None, prompt, taken)


_turn_readers: Lru[int, tuple[LayoutDialect, _Turns]] = Lru()


def _parse_turns(d: LayoutDialect, lx: Lexed) -> dict[str, Any]:
    """A prompt of a format whose messages are each a turn a token opens:
    the role told by the open and its text, or (where a name is written as
    role text) by which role's body the turn holds."""
    t = _made(_turn_readers, d, _turns)
    s = lx.text
    messages: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    pos = 0
    if t.tools is not None:
        m = t.tools.match(s)
        if m is not None:
            result["tools"] = declared_tools(m, lx, per_line=False)
            pos = m.end()
    conds = dict(d.options)
    agp = False
    while pos < len(s):
        mp = t.prompt.fullmatch(s, pos)
        if mp is not None:
            agp = True
            conds = options_of(mp, t.taken, d.options)
            break
        found = [(r, m) for r, rx in t.opens if (m := rx.match(s, pos)) is not None]
        if not found:
            raise ParseError("expected the start of a message", offset=lx.offset(pos))
        text = found[0][1].group("role")
        if not d.role_names and not any(d.roles[r].text == text for r, _ in found):
            raise ParseError(f"unknown role {shown(text)}", offset=lx.offset(found[0][1].start("role")))
        if "assistant" in (r for r, _ in found):
            msg, pos = _assistant_turn(d, t, lx, found[0][1].end())
        else:
            read = _read_turn(d, t, s, found[0][1].end(), [r for r, _ in found], text)
            if read is None:
                raise ParseError(f"a {found[0][0]} message that does not end as the format ends one",
                                 offset=lx.offset(found[0][1].end()))
            msg, pos = read
        if text != d.roles[msg["role"]].text:
            msg["name"] = text
        messages.append(msg)
    return {"messages": messages, **result, "add_generation_prompt": agp, **conds}


def _read_turn(d: LayoutDialect, t: _Turns, s: str, at: int, roles: list[str], text: str) -> tuple[
        dict[str, Any], int] | None:
    """The turn at ``at`` (after its open) as the first of ``roles`` whose
    body it holds: the role its text names first, then (where names are
    role text) the others, bodies that start with text first."""
    for role in sorted(roles, key=lambda r: d.roles[r].text != text):
        mb = t.bodies[role].match(s, at)
        if mb is not None:
            msg: dict[str, Any] = {"role": role}
            groups = mb.groupdict()
            if groups.get("tool_call_id"):
                msg["tool_call_id"] = groups["tool_call_id"]
            msg["content"] = _content_of(t, groups.get("content") or "")
            return msg, mb.end()
        if not d.role_names:
            break
    return None


def read_back(d: LayoutDialect, role: str, text: str, body: str) -> dict[str, Any] | None:
    """A turn of a non-assistant message, opened with role text ``text``
    and holding ``body`` (text), as a parse reads it back: where names are
    role text, a turn another role's open also opens reads as the role its
    text names or its body fits. None when it reads as written."""
    if not d.role_names or not d.turns:
        return None
    t = _made(_turn_readers, d, _turns)
    source = dict(t.opens)[role].pattern
    roles = [r for r, rx in t.opens if rx.pattern == source and r != "assistant"]
    read = _read_turn(d, t, body + t.end, 0, roles, text)
    if read is None or read[0]["role"] == role:
        return None
    msg = read[0]
    if text != d.roles[msg["role"]].text:
        msg["name"] = text
    return msg


def _assistant_turn(d: LayoutDialect, t: _Turns, lx: Lexed, at: int) -> tuple[dict[str, Any], int]:
    s = lx.text
    end = s.find(t.end, at) if t.end else -1
    mc = t.close["assistant"].match(s, end) if end >= 0 else None
    if mc is None:
        raise ParseError("an assistant message that is not closed", offset=lx.offset(at))
    # The turn's close is its answer's stop token, as a model ends one.
    msg = parse_completion(d, Lexed(s[at:end + 1], _shifted(lx, at)), lenient=False, history=True)
    return msg, mc.end()


def _content_of(t: _Turns, content: str) -> Any:
    """Content as read: text, or parts where it holds an image."""
    if t.image is None or t.image.search(content) is None:
        return content
    out: list[dict[str, Any]] = []
    pos = 0
    for m in t.image.finditer(content):
        if m.start() > pos:
            out.append({"type": "text", "text": content[pos:m.start()]})
        out.append({"type": "image"})
        pos = m.end()
    if pos < len(content):
        out.append({"type": "text", "text": content[pos:]})
    return out


class _Hoisted(NamedTuple):
    start: re.Pattern[str]
    """The hoisted system text (group ``system``)."""
    opens: list[tuple[str, re.Pattern[str], re.Pattern[str]]]
    """Each role but the assistant's and the system's: its open, and its
    body and close."""
    answer: re.Pattern[str]
    """An assistant message's open (maybe nothing), its conditions taken."""
    answer_taken: list[tuple[str, bool]]
    end: str
    prompt: re.Pattern[str]
    taken: list[tuple[str, bool]]


def _hoisted(d: LayoutDialect) -> _Hoisted:
    chars = d.chars()
    assert d.system_hoist is not None
    start = re.compile(_slot_regex(d.system_hoist, chars, {"system": f"(?P<system>{ANY_TEXT}*)"}))

    def frame(role: str) -> tuple[Pattern, Pattern]:
        f = d.role_frames.get(role)
        return (d.frame_open, d.frame_close) if f is None else (f.open, f.close)

    opens = []
    for r in d.roles:
        if r in ("assistant", "system"):
            continue
        o, c = frame(r)
        close = c.regex(chars)
        # A turn with no close ends where the next token is: its text is all of the run.
        content = f"(?P<content>{ANY_TEXT}*{'?' if close else ''})"
        body = _slot_regex(d.roles[r].body, chars, {"content": content}, _first_token(c, chars),
                           {"content": _all_text("content")})
        opens.append((r, re.compile(o.regex(chars)), re.compile(body + close)))
    answer_taken: list[tuple[str, bool]] = []
    answer = re.compile(frame("assistant")[0].regex(chars, None, answer_taken))
    ends = [i.token for i in frame("assistant")[1].items if isinstance(i, Tok)]
    taken: list[tuple[str, bool]] = []
    prompt = re.compile(d.prompt.regex(chars, None, taken))
    return _Hoisted(start, opens, answer, answer_taken, chars[ends[0]] if ends else "", prompt, taken)


_hoisted_readers: Lru[int, tuple[LayoutDialect, _Hoisted]] = Lru()


def _parse_hoisted(d: LayoutDialect, lx: Lexed) -> dict[str, Any]:
    """A prompt of a format that writes every system message first: the
    system text, then each turn told by the token that opens it, an
    assistant's by its open or by none (after a tool result or an answer)."""
    h = _made(_hoisted_readers, d, _hoisted)
    s = lx.text
    m = h.start.match(s)
    if m is None:
        raise ParseError("expected the start of a conversation", offset=lx.offset(0))
    messages: list[dict[str, Any]] = []
    if m.group("system"):
        messages.append({"role": "system", "content": m.group("system")})
    pos = m.end()
    conds = dict(d.options)
    agp = False
    while pos < len(s):
        mp = h.prompt.fullmatch(s, pos)
        if mp is not None:
            agp = True
            conds = {k: v for k, v in options_of(mp, h.taken, d.options).items() if k in d.options}
            break
        for role, opening, body in h.opens:
            mo = opening.match(s, pos)
            if mo is None or mo.end() == pos:
                continue
            mb = body.match(s, mo.end())
            if mb is None:
                raise ParseError(f"a {role} message that does not end as the format ends one",
                                 offset=lx.offset(mo.end()))
            messages.append({"role": role, "content": mb.group("content") or ""})
            pos = mb.end()
            break
        else:
            ma = h.answer.match(s, pos)
            assert ma is not None  # every part of it is optional
            end = s.find(h.end, ma.end()) if h.end else -1
            if end < 0:
                raise ParseError("an assistant message that is not closed", offset=lx.offset(ma.end()))
            msg = parse_completion(d, Lexed(s[ma.end():end + 1], _shifted(lx, ma.end())), lenient=False,
                                   history=True)
            for k, (name, negate) in enumerate(h.answer_taken):
                words = name.split(" ")
                if ma.group(f"_c{k}") is not None and not negate:
                    msg.update({f: True for f in d.flags if f in words and f"not {f}" not in name})
            messages.append(msg)
            pos = end + 1
    return {"messages": messages, "add_generation_prompt": agp, **conds}


def _shifted(lx: Lexed, base: int) -> Callable[[int], int]:
    def offset(at: int) -> int:
        return lx.offset(base + at)
    return offset


def _read_run(rich: _Rich, s: str, pos: int) -> tuple[str, list[str], int] | None:
    """A run of messages that share one frame (tool results), if one starts
    at ``pos``."""
    for role, (opening, body, close) in rich.runs.items():
        m = opening.match(s, pos)
        if m is None:
            continue
        at = m.end()
        contents: list[str] = []
        while True:
            mb = body.match(s, at)
            if mb is None or mb.end() == at:
                break
            contents.append(mb.group("content") or "")
            at = mb.end()
        mc = close.match(s, at) if contents else None
        if mc is not None:
            return role, contents, mc.end()
    return None


class _Shape(NamedTuple):
    """What an answer may hold, as a parse reads it: the stop tokens, the
    reasoning block's two tokens, and a call's two tokens, the body between
    them and the separator before each call but a first after no content."""

    stops: frozenset[str]
    think: tuple[str, str] | None
    call: tuple[str, str, re.Pattern[str], str] | None
    section: tuple[str, str] | None = None
    """The two tokens of the section the calls are in."""
    exact: bool = False
    """The reasoning block as written: no newline trimmed around it."""
    opened: bool = False
    """The generation prompt opens the reasoning block: text before its
    closing token is reasoning."""
    trim: bool = False
    """Content and reasoning are read with all their surrounding whitespace
    stripped (not only newlines)."""
    lead: bool = False
    """Whitespace before the reasoning block is the format's: the block may
    open after it."""

    @property
    def calls_open(self) -> str | None:
        """The token that ends the content: the section's or the first call's."""
        if self.section is not None:
            return self.section[0]
        return self.call[0] if self.call is not None else None


def _shape(d: LayoutDialect) -> _Shape:
    chars = d.chars()
    think = None
    split = d.reasoning_split or d.reasoning_block
    if d.reasoning == HISTORY and split is not None and split[0] in chars and split[1] in chars:
        think = (chars[split[0]], chars[split[1]])
    opened = d.reasoning_opened
    if opened is not None and opened[0] in chars and opened[1] in chars:
        think = (chars[opened[0]], chars[opened[1]])
    call = None
    each = d.calls_each
    if d.calls == EACH and each is not None:
        items = list(each.items)
        sep = ""
        if items and isinstance(items[0], Cond) and all(isinstance(i, Lit) for i in items[0].body):
            sep = "".join(i.text for i in items[0].body if isinstance(i, Lit))
            items = items[1:]
        toks = [k for k, i in enumerate(items) if isinstance(i, Tok)]
        if len(toks) >= 2 and toks[0] == 0 and toks[-1] == len(items) - 1:
            first, last = items[0], items[-1]
            assert isinstance(first, Tok) and isinstance(last, Tok)
            inner = items_regex(items[1:-1], chars, None, None)
            call = (chars[first.token], chars[last.token], re.compile(inner, re.S), sep)
    section = None
    if d.calls_section is not None:
        ends = [i.token for i in d.calls_section.items if isinstance(i, Tok)]
        if len(ends) == 2:
            section = (chars[ends[0]], chars[ends[1]])
    by_prompt = think is not None and opened is not None
    return _Shape(frozenset(chars[t] for t in d.stops), think, call, section,
                  d.reasoning_block is not None or by_prompt, by_prompt)


def shape(d: LayoutDialect) -> _Shape:
    return _made(_shapes, d, _shape)


class _Repairs:
    """The diagnostics of a lenient parse; in a strict one the first problem
    raises."""

    def __init__(self, d: LayoutDialect, lx: Lexed, lenient: bool) -> None:
        self.d = d
        self.lx = lx
        self.lenient = lenient
        self.list: list[dict[str, Any]] = []

    def add(self, kind: str, at: int, message: str) -> None:
        if not self.lenient:
            raise ParseError(message, offset=self.lx.offset(at))
        self.list.append({"kind": kind, "offset": self.lx.offset(at), "message": message})

    def token(self, ch: str) -> str:
        return self.d.tokens[ord(ch) - TOKEN_BASE]

    def ended(self, stop_at: int) -> None:
        """How the answer ends: at a stop token (``stop_at``, -1 for none)
        with nothing after it, else a repair."""
        n = len(self.lx.text)
        if stop_at < 0:
            self.add("truncated", n, "the answer ends before a stop token")
        elif stop_at + 1 < n:
            self.add("after-end", stop_at + 1, "ids after the stop token are not read")


_TOKEN_CHAR = re.compile("[\ud800-\udfff]")


def _text(r: _Repairs, s: str, base: int) -> str:
    """Text of an answer with every token in it left out (a repair each)."""
    if _TOKEN_CHAR.search(s) is None:
        return s
    out: list[str] = []
    pos = 0
    for t in _TOKEN_CHAR.finditer(s):
        out.append(s[pos:t.start()])
        r.add("stray-token", base + t.start(), f"{r.token(t.group())!r} does not belong here: left out")
        pos = t.end()
    out.append(s[pos:])
    return "".join(out)


def declared_tools(m: re.Match[str], lx: Lexed, *, per_line: bool) -> Any:
    """The tools a prompt declares, from the match's ``tools`` group: one
    JSON value a line after the first (``per_line``) or one JSON list; a
    declaration that is not JSON (or nested past Python's reader) is a
    ParseError at it."""
    text = m.group("tools")
    try:
        return [jsonfmt.read(line) for line in text.split("\n")[1:]] if per_line else jsonfmt.read(text)
    except ValueError:
        raise ParseError("a tool declaration that is not JSON", offset=lx.offset(m.start("tools"))) from None


def first_of(s: str, chars: Iterable[str], start: int = 0) -> int:
    """Where the first of ``chars`` is in ``s`` from ``start`` on, or -1:
    one search of the string per character (each bounded by the best found
    so far), in C."""
    end = len(s)
    found = -1
    for c in chars:
        k = s.find(c, start, end)
        if k >= 0:
            end = found = k
    return found


def parse_completion(d: LayoutDialect, lx: Lexed, *, lenient: bool, history: bool = False) -> dict[str, Any]:
    """What a model generated after the generation prompt: one assistant
    message, read as the format writes one. Strict: it ends with a stop
    token with nothing after it, and holds nothing the format would not
    write; else a ParseError at the first problem. Lenient: never raises;
    each repair is a diagnostic at its token offset (a call cut off or
    malformed is withheld, never half read). ``history``: an assistant
    message of a prompt, whose calls are read as the format wrote them (a
    name the id does not spell, arguments that are not an object)."""
    sh = shape(d)
    s = lx.text
    r = _Repairs(d, lx, lenient)
    stop_at = first_of(s, sh.stops)
    body = s if stop_at < 0 else s[:stop_at]
    message: dict[str, Any] = {"role": "assistant"}
    start = 0
    if sh.opened and sh.think is not None:
        # The prompt opened the block (with thinking on): what comes before
        # its close is reasoning; without a close there is none. A prompt's
        # message shows none.
        ci = -1 if history else body.find(sh.think[1])
        if ci >= 0:
            reasoning = _text(r, body[:ci], 0)
            if reasoning:
                message["reasoning_content"] = reasoning
            start = ci + 1
    elif sh.think is not None and body[:1] == sh.think[0]:
        # The reasoning block opens the answer, as the format writes it; a
        # reasoning token anywhere else is out of place.
        ci = body.find(sh.think[1])
        head = body[1:ci if ci >= 0 else len(body)]
        reasoning = _text(r, head, 1)
        if not sh.exact:
            reasoning = reasoning.strip("\n")
        if ci < 0:
            r.add("truncated", len(s) if stop_at < 0 else stop_at, "the reasoning block is not closed")
            start = len(body)
        else:
            start = ci + 1
            while not sh.exact and start < len(body) and body[start] == "\n":
                start += 1
        if reasoning:
            message["reasoning_content"] = reasoning
    region = body[start:]
    calls: list[dict[str, Any]] = []
    opens = sh.calls_open
    j = region.find(opens) if opens is not None else -1
    text = region if j < 0 else region[:j]
    if j >= 0 and sh.call is not None and sh.call[3] and text.endswith(sh.call[3]):
        text = text[:-len(sh.call[3])]
    message["content"] = _text(r, text, start)
    if j >= 0 and sh.call is not None and sh.section is not None:
        _section_of(r, region, j, start, sh, calls, history)
    elif j >= 0 and sh.call is not None:
        _calls_of(r, region, j, start, sh.call, calls)
    if calls:
        message["tool_calls"] = calls
    r.ended(stop_at)
    if r.list:
        message["diagnostics"] = r.list
    return message


def _section_of(r: _Repairs, region: str, pos: int, base: int, sh: _Shape, out: list[dict[str, Any]],
                history: bool) -> None:
    """The calls of a section that opens at ``pos``: nothing but calls in
    it, nothing after it."""
    assert sh.section is not None and sh.call is not None
    end = region.find(sh.section[1], pos + 1)
    inside = region[pos + 1:] if end < 0 else region[pos + 1:end]
    _calls_of(r, inside, 0, base + pos + 1, sh.call, out, history)
    if end < 0:
        r.add("truncated", base + len(region), "the tool-call section is not closed")
    elif end + 1 < len(region):
        r.add("stray-content", base + end + 1, "what follows the tool-call section is left out")


def _calls_of(r: _Repairs, region: str, pos: int, base: int, call: tuple[str, str, re.Pattern[str], str],
              out: list[dict[str, Any]], history: bool = False) -> None:
    opening, closing, inner, sep = call
    n = len(region)
    while pos < n:
        if region[pos] != opening:
            nxt = region.find(opening, pos)
            end = n if nxt < 0 else nxt
            if region[pos:end] != sep or nxt < 0:
                r.add("stray-content", base + pos, "text between or after the tool calls is left out")
            if nxt < 0:
                return
            pos = nxt
        k = region.find(closing, pos + 1)
        if k < 0:
            r.add("truncated", base + n, f"tool call {len(out) + 1} is not closed: it is withheld")
            return
        body = region[pos + 1:k]
        # A full match holds no token but the pattern's own: its slots are text.
        m = inner.fullmatch(body)
        if m is None:
            r.add("bad-call", base + pos, f"tool call {len(out) + 1} is not written as the format writes one: "
                                          "it is withheld")
        else:
            found = _call_of(r.d, m, history)
            if isinstance(found, str):
                r.add("bad-argument" if found.startswith("the arguments") else "bad-call", base + pos,
                      f"{found.replace('#', str(len(out) + 1))}: it is withheld")
            else:
                out.append(found)
        pos = k + 1


def _call_of(d: LayoutDialect, m: re.Match[str], history: bool) -> dict[str, Any] | str:
    """A call read out of its match, or what is wrong with it (``#`` for
    its number)."""
    args = m.group("arguments")
    try:
        value = jsonfmt.read(args)
    except ValueError:  # nested past Python's reader too (jsonfmt.TooDeep)
        value = None
    if d.arguments == "tojson" and isinstance(value, str):
        # Written through tojson: a string argument is a JSON string.
        args = value
        try:
            value = jsonfmt.read(args)
        except ValueError:
            value = None
    if not isinstance(value, dict) and not history:
        return "the arguments of tool call # are not a JSON object"
    groups = m.groupdict()
    call_id = groups.get("id")
    name = groups.get("name")
    if name is None:
        name = name_of_id(d, call_id or "")
        if name is None:
            if not history:
                return f"tool call # has an id that names no tool ({shown(call_id or '')})"
            name = ""
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
    if call_id:
        call["id"] = call_id
    return call
