"""The parse of a layout dialect's text: a whole prompt back to its
request (:func:`parse_prompt`), and what a model generated after the
generation prompt to one assistant message (:func:`parse_completion`),
strictly or leniently. Both read a :class:`Lexed` string with the same
patterns render writes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from ..errors import ParseError, shown
from ..lru import Lru
from .layout import EACH, HISTORY, LayoutDialect
from .layout_pattern import ANY_TEXT, TOKEN_BASE, Cond, Lit, Pattern, Slot, Tok, item_regex, options_of

__all__ = ["Lexed", "compiled", "parse_completion", "parse_prompt", "shape"]


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
        self.bodies = {r.text: (r.name, re.compile(r.body.regex(chars) + close)) for r in d.roles.values()}

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


def _slot_regex(p: Pattern, chars: Mapping[str, str], subs: Mapping[str, str]) -> str:
    """A pattern's regular expression with some slots replaced by others'."""
    out: list[str] = []
    for i in p.items:
        if isinstance(i, Slot) and i.name in subs:
            out.append(subs[i.name])
        else:
            out.append(item_regex(i, chars, None, None))
    return "".join(out)


class _Rich(NamedTuple):
    system_with_tools: re.Pattern[str] | None
    open: re.Pattern[str]
    close: str
    runs: dict[str, tuple[re.Pattern[str], re.Pattern[str], str]]
    """Role → its frame's open, its body (slot ``content``), its close."""
    bodies: dict[str, re.Pattern[str]]
    """Role text → the body and close of a role's message, but the assistant's."""
    prompt: re.Pattern[str]
    taken: list[tuple[str, bool]]


def _rich(d: LayoutDialect) -> _Rich:
    chars = d.chars()
    swt = None
    if d.system_with_tools is not None and d.tools_block is not None and d.tools_each is not None:
        block = _slot_regex(d.tools_block, chars, {"tools": f"(?P<tools>{ANY_TEXT}*?)"})
        swt = re.compile(_slot_regex(d.system_with_tools, chars, {"tools": block}))
    close = d.frame_close.regex(chars)
    runs = {r: (re.compile(f.open.regex(chars).replace("(?P<role>", "(?:")),
                re.compile(d.roles[r].body.regex(chars)), f.close.regex(chars))
            for r, f in d.role_frames.items()}
    bodies = {r.text: re.compile(r.body.regex(chars) + close) for r in d.roles.values() if r.name != "assistant"}
    taken: list[tuple[str, bool]] = []
    prompt = re.compile(d.prompt.regex(chars, None, taken))
    return _Rich(swt, re.compile(d.frame_open.regex(chars)), close, runs, bodies, prompt, taken)


def _parse_rich(d: LayoutDialect, lx: Lexed) -> dict[str, Any]:
    rich = _rich(d)
    s = lx.text
    chars = d.chars()
    messages: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    pos = 0
    if rich.system_with_tools is not None:
        m = rich.system_with_tools.match(s)
        if m is not None:
            if m.group("system") is not None:
                messages.append({"role": "system", "content": m.group("system")})
            try:
                result["tools"] = [json.loads(line) for line in m.group("tools").split("\n")[1:]]
            except ValueError:
                raise ParseError("a tool declaration that is not JSON", offset=lx.offset(m.start("tools"))) from None
            pos = m.end()
    conds = dict(d.options)
    agp = False
    close_chars = [chars[i.token] for i in d.frame_close.items if isinstance(i, Tok)]
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
        named = next((r.name for r in d.roles.values() if r.text == role_text), None)
        if named is None:
            raise ParseError(f"unknown role {shown(role_text)}", offset=lx.offset(m.start("role")))
        if named == "assistant":
            end = s.find(close_chars[0], m.end()) if close_chars else -1
            if end < 0:
                raise ParseError("an assistant message that is not closed", offset=lx.offset(m.end()))
            sub = Lexed(s[m.end():end + 1], _shifted(lx, m.end()))
            msg = parse_completion(d, sub, lenient=False)
            mc = re.compile(rich.close).match(s, end)
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
        mc = re.compile(close).match(s, at) if contents else None
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


def _shape(d: LayoutDialect) -> _Shape:
    chars = d.chars()
    think = None
    split = d.reasoning_split
    if d.reasoning == HISTORY and split is not None and split[0] in chars and split[1] in chars:
        think = (chars[split[0]], chars[split[1]])
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
            inner = "".join(item_regex(i, chars, None, None) for i in items[1:-1])
            call = (chars[first.token], chars[last.token], re.compile(inner, re.S), sep)
    return _Shape(frozenset(chars[t] for t in d.stops), think, call)


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


def parse_completion(d: LayoutDialect, lx: Lexed, *, lenient: bool) -> dict[str, Any]:
    """What a model generated after the generation prompt: one assistant
    message, read as the format writes one. Strict: it ends with a stop
    token with nothing after it, and holds nothing the format would not
    write; else a ParseError at the first problem. Lenient: never raises;
    each repair is a diagnostic at its token offset (a call cut off or
    malformed is withheld, never half read)."""
    sh = shape(d)
    s = lx.text
    r = _Repairs(d, lx, lenient)
    stop_at = next((k for k, ch in enumerate(s) if ch in sh.stops), -1) if _TOKEN_CHAR.search(s) else -1
    body = s if stop_at < 0 else s[:stop_at]
    message: dict[str, Any] = {"role": "assistant"}
    start = 0
    if sh.think is not None and body[:1] == sh.think[0]:
        # The reasoning block opens the answer, as the format writes it; a
        # reasoning token anywhere else is out of place.
        ci = body.find(sh.think[1])
        head = body[1:ci if ci >= 0 else len(body)]
        reasoning = _text(r, head, 1).strip("\n")
        if ci < 0:
            r.add("truncated", len(s) if stop_at < 0 else stop_at, "the reasoning block is not closed")
            start = len(body)
        else:
            start = ci + 1
            while start < len(body) and body[start] == "\n":
                start += 1
        if reasoning:
            message["reasoning_content"] = reasoning
    region = body[start:]
    calls: list[dict[str, Any]] = []
    j = region.find(sh.call[0]) if sh.call is not None else -1
    text = region if j < 0 else region[:j]
    if j >= 0 and sh.call is not None and sh.call[3] and text.endswith(sh.call[3]):
        text = text[:-len(sh.call[3])]
    message["content"] = _text(r, text, start)
    if j >= 0 and sh.call is not None:
        _calls_of(r, region, j, start, sh.call, calls)
    if calls:
        message["tool_calls"] = calls
    if stop_at < 0:
        r.add("truncated", len(s), "the answer ends before a stop token")
    elif stop_at + 1 < len(s):
        r.add("after-end", stop_at + 1, "ids after the stop token are not read")
    if r.list:
        message["diagnostics"] = r.list
    return message


def _calls_of(r: _Repairs, region: str, pos: int, base: int, call: tuple[str, str, re.Pattern[str], str],
              out: list[dict[str, Any]]) -> None:
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
        m = inner.fullmatch(body)
        if m is None or _TOKEN_CHAR.search(body):
            r.add("bad-call", base + pos, f"tool call {len(out) + 1} is not written as the format writes one: "
                                          "it is withheld")
        else:
            args = m.group("arguments")
            try:
                ok = isinstance(json.loads(args), dict)
            except ValueError:
                ok = False
            if not ok:
                r.add("bad-argument", base + pos, f"the arguments of tool call {len(out) + 1} are not a JSON "
                                                  "object: it is withheld")
            else:
                out.append({"type": "function", "function": {"name": m.group("name"), "arguments": args}})
        pos = k + 1
