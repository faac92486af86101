"""Answers of a format that writes one message as several of its own
(:mod:`.layout_split`, harmony's): the parse of a completion, the reading of
one such message, and what a stream reads as it comes.

Every message is ``START AUTHOR[ to=RECIPIENT] CHANNEL NAME[ TYPE] MESSAGE
text CLOSE``. What each piece is, is learnt from the dialect's own patterns:
the assistant's body (the reasoning message, the final one and the close
that ends the render), the call pattern (the recipient's spelling, the
call's channel and type, its close) and the stops. A token the format
declares and no pattern writes may stand before a call's type (harmony's
``<|constrain|>json``), and a recipient may come after the channel, as
openai-harmony writes an assistant's call.

A completion is read message by message: the reasoning channel's text is
reasoning, the final channel's and a message on the call channel without a
recipient (a preamble) are content, a message to ``NAMESPACE.NAME`` is a
call whose text is JSON. Several texts of one kind are joined by a blank
line. The answer ends at a stop that is not ``message_end``; after a
``message_end`` the model may go on with another message of its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..errors import ParseError, shown
from ..lru import Lru
from ..plugins import jsonfmt
from .layout import LayoutDialect
from .layout_call_array import lexed_text
from .layout_parse import Lexed, _made, _Repairs, first_of
from .layout_split import ENDS

__all__ = ["JOIN", "Harmony", "authored", "harmony", "parse_completion_harmony", "read_header",
           "reasoning_length_harmony"]

JOIN = "\n\n"
"""What joins two texts of one kind (two reasoning messages, a preamble and
the final text) in the message read."""

_WS = " \t\n\r"
_TOKEN = re.compile("[\ud800-\udfff]")
# Stand-ins for the slots, to learn the literal text around them.
_R, _C, _K, _N, _A = "\ue011", "\ue012", "\ue013", "\ue014", "\ue015"


class Harmony(NamedTuple):
    """What a format of this kind writes around its messages, as a lexed
    string holds it (each token its character)."""

    start: str
    message: str
    channel: str
    author: str
    """The assistant's author text (``assistant``)."""
    reasoning: str
    """The channel of reasoning (``analysis``)."""
    final: str
    """The channel of the answer's text (``final``)."""
    call_channel: str
    call_type: str
    to: str
    """What comes before a recipient in a header (`` to=``)."""
    namespace: str
    """A call's recipient before the name (``functions.``)."""
    closes: Mapping[str, str]
    """Close token → its stop meaning."""
    message_close: str
    """The close of a message after which the answer may go on."""
    end_close: str
    """The close of the answer that ends the render."""
    call_close: str
    constrain: frozenset[str]
    """Tokens that may stand before a call's type."""
    ends: frozenset[str]
    """The closes that end an answer."""


def _harmony(d: LayoutDialect) -> Harmony:
    bad = ParseError(f"the layout dialect {d.name!r} writes messages its reader does not read", offset=0)
    each = d.calls_each
    if "assistant" not in d.roles or each is None:
        raise bad
    chars = d.chars()
    conds = {**d.options, "show_reasoning": True, "has_calls": False, "has_text": True, "after_user": False,
             "after_tool": False, "first": True, "has_content": False}
    body = d.roles["assistant"].body
    vals = {"reasoning": _R, "content": _C, "calls": _K}
    ended = lexed_text(d, body, vals, {**conds, ENDS: True})
    open_ = lexed_text(d, body, vals, {**conds, ENDS: False})
    call = lexed_text(d, each, {"name": _N, "arguments": _A, "id": ""}, conds)
    tok = "[\ud800-\udfff]"
    shape = re.compile(f"({tok})([^\ud800-\udfff]*)({tok})([^\ud800-\udfff]*)({tok}){_R}({tok}){_K}"
                       f"({tok})([^\ud800-\udfff]*)({tok})([^\ud800-\udfff]*)({tok}){_C}({tok})")
    m, m2 = shape.fullmatch(ended), shape.fullmatch(open_)
    cm = re.fullmatch(f"({tok})([^\ud800-\udfff]*){_N}({tok})([^ \ud800-\udfff]+) ([^ \ud800-\udfff]+)({tok}){_A}"
                      f"({tok})", call)
    if m is None or m2 is None or cm is None:
        raise bad
    start, author, channel, reasoning, message = m.group(1, 2, 3, 4, 5)
    message_close = m.group(6)
    if m.group(7, 8, 9) != (start, author, channel) or m.group(11) != message or m2.group(12) != message_close \
            or cm.group(1) != start or cm.group(3) != channel or cm.group(6) != message:
        raise bad
    lead = cm.group(2)
    eq = lead.find("=")
    if not lead.startswith(author) or eq < 0:
        raise bad
    stops = {chars[t]: meaning for t, meaning in d.stops.items()}
    end_close, call_close = m.group(12), cm.group(7)
    if not {message_close, end_close, call_close} <= set(stops):
        raise bad
    written = [p.source for p in (d.frame_open, d.frame_close, d.prompt, each, *(r.body for r in d.roles.values()),
                                  *(f.open for f in d.role_frames.values()),
                                  *(f.close for f in d.role_frames.values()))]
    if d.system_turn is not None:
        written.append(d.system_turn.source)
    constrain = frozenset(chars[t] for t in d.tokens if t not in d.stops and not any(t in w for w in written))
    return Harmony(start, message, channel, author, reasoning, m.group(10), cm.group(4), cm.group(5),
                   lead[len(author):eq + 1], lead[eq + 1:], stops, message_close, end_close, call_close, constrain,
                   frozenset(c for c, meaning in stops.items() if meaning != "message_end"))


_readers: Lru[int, tuple[LayoutDialect, Harmony]] = Lru()


def harmony(d: LayoutDialect) -> Harmony:
    return _made(_readers, d, _harmony)


class Header(NamedTuple):
    """What a message's header says: its kind (``reasoning``, ``content``,
    ``call``, ``bad-call``), the call's name, and what is wrong with it
    (kind, message, offset in the header) — each a repair."""

    kind: str
    name: str
    problems: tuple[tuple[str, str, int], ...]


def read_header(h: Harmony, text: str) -> Header:
    """A header after its author (``text`` holds tokens as characters)."""
    problems: list[tuple[str, str, int]] = []
    recipient: str | None = None
    pos = 0
    n = len(text)
    if text.startswith(h.to):
        k = pos + len(h.to)
        e = k
        while e < n and text[e] not in " " + h.channel and _TOKEN.match(text[e]) is None:
            e += 1
        recipient, pos = text[k:e], e
    channel: str | None = None
    words: list[tuple[str, int]] = []
    if pos < n and text[pos] == h.channel:
        pos += 1
        for wm in re.finditer("[\ud800-\udfff]|[^ \ud800-\udfff]+", text[pos:]):
            words.append((wm.group(), pos + wm.start()))
        if words and _TOKEN.match(words[0][0]) is None:
            channel = words.pop(0)[0]
    elif pos < n:
        problems.append(("header", f"the header holds {shown(_plain(text[pos:]))} where a channel belongs", pos))
    else:
        problems.append(("header", "a message with no channel: read as the answer's text", pos))
    kind_type = ""
    constrained = False
    for w, at in words:
        if w.startswith(h.to[1:]) and recipient is None:
            # After the channel: as openai-harmony writes an assistant's call.
            recipient = w[len(h.to) - 1:]
        elif w in h.constrain and not constrained and not kind_type:
            constrained = True
        elif _TOKEN.match(w) is None and not kind_type:
            kind_type = w
        else:
            problems.append(("header", f"{shown(_plain(w))} does not belong in the header: left out", at))
    if constrained and not kind_type:
        problems.append(("header", "a constraint with no type", n))
    if recipient is not None:
        if channel != h.call_channel and channel is not None:
            problems.append(("header", f"a call on the {shown(channel)} channel", 0))
        if not kind_type:
            problems.append(("header", "a call with no type: read as JSON", n))
        elif kind_type != h.call_type:
            problems.append(("header", f"a call of type {shown(kind_type)}: read as JSON", n))
        if not recipient.startswith(h.namespace) or len(recipient) == len(h.namespace):
            return Header("bad-call", recipient, tuple(problems))
        return Header("call", recipient[len(h.namespace):], tuple(problems))
    if kind_type or constrained:
        problems.append(("header", "a type on a message that is not a call", n))
    if channel is None or channel == h.final or channel == h.call_channel:
        return Header("content", "", tuple(problems))
    if channel == h.reasoning:
        return Header("reasoning", "", tuple(problems))
    problems.append(("unknown-channel", f"the channel {shown(channel)} is not the format's: read as reasoning", 0))
    return Header("reasoning", "", tuple(problems))


def _plain(s: str) -> str:
    """Text of a header with each token shown as such."""
    return _TOKEN.sub(lambda m: "<token>", s)


def call_of(text: str, name: str, *, history: bool) -> dict[str, Any] | str:
    """A call's message: its text is the arguments, a JSON object (or, as
    the template writes string arguments, a JSON string; in a completion one
    that holds an object); else what is wrong."""
    args = text.strip(_WS)
    try:
        value = jsonfmt.read(args)
    except ValueError:
        value = None
    if isinstance(value, str):
        args = value
        if not history:
            try:
                value = jsonfmt.read(args)
            except ValueError:
                value = None
    if not history and not isinstance(value, dict):
        return "the arguments of the call are not a JSON object"
    if history and value is None:
        return "the arguments of the call are not JSON"
    return {"type": "function", "function": {"name": name, "arguments": args}}


def parse_completion_harmony(d: LayoutDialect, lx: Lexed, *, lenient: bool) -> dict[str, Any]:
    """What a model generated after the generation prompt, as one assistant
    message. Strict: each message as the format writes one, the answer
    ending at a stop with nothing after it; else a ParseError at the first
    problem. Lenient: never raises; each repair located."""
    h = harmony(d)
    s = lx.text
    r = _Repairs(d, lx, lenient)
    # The answer ends at the first stop that ends one, wherever it is.
    stop = first_of(s, h.ends)
    n = stop + 1 if stop >= 0 else len(s)
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    pos = 0
    first = True
    last = ""
    while pos < n:
        at = pos
        if not first:
            if s[pos] != h.start:
                nxt = s.find(h.start, pos, n)
                r.add("stray-content", pos, "what follows a message's close is not a message: left out")
                if nxt < 0:
                    break
                pos = at = nxt
            if not authored(h, s, pos + 1):
                r.add("stray-message", pos, "a message of another author: it and what follows are not read")
                break
            pos += 1 + len(h.author)
        first = False
        mi = _next_token(s, pos)
        while mi < n and s[mi] not in (h.message, h.start) and s[mi] not in h.closes:
            mi = _next_token(s, mi + 1)
        if mi >= n:
            r.add("truncated", n, "the answer ends inside a message's header")
            last = "cut"
            pos = n
            break
        if s[mi] != h.message:
            r.add("header", mi, "a message with no text: left out")
            last = "cut"
            pos = mi if s[mi] == h.start else mi + 1
            if s[mi] in h.ends:
                break
            continue
        head = read_header(h, s[pos:mi])
        for kind, msg, k in head.problems:
            r.add(kind, pos + k if k < mi - pos else mi, msg)
        body_at = mi + 1
        e = body_at
        pieces: list[str] = []
        while True:
            t = _next_token(s, e)
            pieces.append(s[e:t])
            if t >= n or s[t] == h.start or s[t] in h.closes:
                break
            r.add("stray-token", t, f"{r.token(s[t])!r} does not belong in a message: left out")
            e = t + 1
        text = "".join(pieces)
        close = s[t] if t < n and s[t] in h.closes else ""
        if head.kind in ("call", "bad-call"):
            if not close:
                r.add("truncated", t, "the call is not closed: it is withheld")
            elif head.kind == "bad-call":
                r.add("bad-call", at, f"a call to {shown(head.name)}, not to a function of the format: it is "
                                      "withheld")
            else:
                found = call_of(text, head.name, history=False)
                if isinstance(found, str):
                    r.add("bad-argument", body_at, f"{found}: it is withheld")
                else:
                    calls.append(found)
                if close != h.call_close:
                    r.add("bad-close", t, f"a call closed by {r.token(close)!r}")
        else:
            (reasoning if head.kind == "reasoning" else content).append(text)
            if not close and t >= n:
                r.add("truncated", n, "the answer ends inside a message")
            elif not close:
                r.add("unclosed", t, "a message that is not closed: read up to the next one")
            elif close == h.call_close:
                r.add("bad-close", t, f"a message that is not a call closed by {r.token(close)!r}")
        last = head.kind
        if close in h.ends:
            break
        pos = t + 1 if close else t
    else:
        if last != "content" and not (r.list and r.list[-1]["kind"] == "truncated"):
            r.add("truncated", n, "the answer ends before a message that ends it")
    if 0 <= stop < len(s) - 1:
        r.add("after-end", stop + 1, "ids after the stop token are not read")
    message: dict[str, Any] = {"role": "assistant", "content": JOIN.join(content)}
    if reasoning:
        message["reasoning_content"] = JOIN.join(reasoning)
    if calls:
        message["tool_calls"] = calls
    if r.list:
        message["diagnostics"] = r.list
    return message


def authored(h: Harmony, s: str, pos: int) -> bool:
    """Whether the header at ``pos`` starts with the assistant's author."""
    k = pos + len(h.author)
    return s.startswith(h.author, pos) and s[k:k + 1] in ("", " ", h.channel, h.message)


def _next_token(s: str, pos: int) -> int:
    m = _TOKEN.search(s, pos)
    return len(s) if m is None else m.start()


def reasoning_length_harmony(d: LayoutDialect, lx: Lexed, count: int) -> int:
    """How many of an answer's ids (``count`` in all) are reasoning: the
    reasoning messages it opens with, up to and with the close of the last
    of them (all the ids when it is cut off in one); none when it opens
    otherwise."""
    h = harmony(d)
    s = lx.text
    n = len(s)
    pos = end = 0
    first = True
    while pos < n:
        if not first:
            if s[pos] != h.start or not s.startswith(h.author, pos + 1):
                break
            pos += 1 + len(h.author)
        first = False
        mi = _next_token(s, pos)
        while mi < n and s[mi] not in (h.message, h.start) and s[mi] not in h.closes:
            mi = _next_token(s, mi + 1)
        if mi >= n or s[mi] != h.message:
            break
        head = read_header(h, s[pos:mi])
        if head.kind != "reasoning" or head.problems:
            break
        t = _next_token(s, mi + 1)
        while t < n and s[t] not in h.closes and s[t] != h.start:
            t = _next_token(s, t + 1)
        if t >= n:
            return count
        if s[t] == h.start:
            break
        end = lx.offset(t) + 1
        if s[t] in h.ends:
            break
        pos = t + 1
    return end
