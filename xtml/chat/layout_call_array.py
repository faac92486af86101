"""Answers whose calls are one JSON array after a token
(``[TOOL_CALLS] [{"name": …, "arguments": …, "id": …}, …]``): the parse
of a completion, the reading of such an answer as a prompt writes it, and
what the stream reads as it comes.

A completion is read as JSON, as a model writes it: content up to the
token, then the array (keys in any order, an id optional, arguments an
object or a string that holds one). An answer of a prompt is read as the
format's patterns write it (an id is as many characters as the format
keeps, written as it is: it may hold a quote).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..errors import ParseError, shown
from ..lru import Lru
from ..plugins import jsonfmt
from .layout import LayoutDialect
from .layout_parse import Lexed, _made, _Repairs, _Shape, _text, first_of
from .layout_pattern import TOKEN_BASE, Builder, Pattern, slot_codec

__all__ = ["array_shape", "lexed_text", "parse_completion_array", "read_answer"]

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"
_TOKEN = re.compile("[\ud800-\udfff]")
"""A token's character in a lexed string."""

# Stand-ins for a pattern's slots, written to learn the literal text around
# them: private-use characters no pattern of a dialect file holds.
_NAME, _ARGS, _ID, _CALLS, _CONTENT = "\ue001", "\ue002", "\ue003", "\ue004", "\ue005"
_STAND_INS = re.compile("[\ue001-\ue005]")


def lexed_text(d: LayoutDialect, p: Pattern, values: Mapping[str, str], conds: Mapping[str, bool]) -> str:
    """A pattern written with ``values``, as a parse reads it: each token
    its character."""
    b = Builder()
    p.render(values, conds, b)
    chars = d.chars()
    return "".join(chars[seg.text] if seg.special else seg.text for seg in b.finish())


def _pieces(text: str, units: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Text of stand-ins cut into (literal, slot) steps: each slot's unit
    (its stand-in, or its stand-in as the slot's codec writes it) and the
    literal text before it; the last step's slot is ""."""
    out: list[tuple[str, str]] = []
    pos = 0
    rx = re.compile("|".join(re.escape(u) for u in units.values()))
    names = {u: n for n, u in units.items()}
    for m in rx.finditer(text):
        out.append((text[pos:m.start()], names[m.group()]))
        pos = m.end()
    out.append((text[pos:], ""))
    return tuple(out)


class _Array(NamedTuple):
    opener: str
    """The token that opens the calls (its character)."""
    section: tuple[tuple[str, str], ...]
    """The section around the calls: before ``calls``, after it."""
    first: tuple[tuple[str, str], ...]
    """The first call's steps; ``more``: each later call's."""
    more: tuple[tuple[str, str], ...]
    body: tuple[tuple[str, str], ...]
    """The answer's body: content, then calls."""
    close: str
    """What closes an answer (the frame's close)."""
    stops: str
    name_json: bool
    """The name is written as a JSON string (``tojson``)."""
    id_len: int


def _array(d: LayoutDialect) -> _Array:
    each, section = d.calls_each, d.calls_section
    if each is None or section is None or "assistant" not in d.role_frames:
        raise ParseError(f"the layout dialect {d.name!r} writes calls its reader does not read", offset=0)
    name_json = slot_codec(each, "name") == "tojson"
    units = {"name": json.dumps(_NAME, ensure_ascii=False) if name_json else _NAME, "arguments": _ARGS, "id": _ID}

    def steps(first: bool) -> tuple[tuple[str, str], ...]:
        return _pieces(lexed_text(d, each, {"name": _NAME, "arguments": _ARGS, "id": _ID},
                                  {**d.options, "first": first, "has_content": False}), units)

    sec = _pieces(lexed_text(d, section, {"calls": _CALLS}, d.options), {"calls": _CALLS})
    body = _pieces(lexed_text(d, d.roles["assistant"].body, {"content": _CONTENT, "calls": _CALLS},
                              {**d.options, "show_reasoning": False, "has_text": False}),
                   {"content": _CONTENT, "calls": _CALLS})
    close = lexed_text(d, d.role_frames["assistant"].close, {}, d.options)
    opener = sec[0][0][:1]
    if len(sec) != 2 or not opener or _TOKEN.match(opener) is None or [s for _, s in body] != ["content", "calls", ""] \
            or body[0][0] or body[1][0] or body[2][0] or not close:
        raise ParseError(f"the layout dialect {d.name!r} writes calls its reader does not read", offset=0)
    chars = d.chars()
    return _Array(opener, sec, steps(True), steps(False), body, close, "".join(chars[t] for t in d.stops),
                  name_json, d.id_tail)


_arrays: Lru[int, tuple[LayoutDialect, _Array]] = Lru()


def _reader(d: LayoutDialect) -> _Array:
    return _made(_arrays, d, _array)


def array_shape(d: LayoutDialect) -> _Shape:
    """What a stream reads as it comes: content as written, up to the token
    that opens the calls (the calls go out with the message)."""
    a = _reader(d)
    return _made(_shapes, d, lambda _: _Shape(frozenset(a.stops), None, (a.opener, "", re.compile(""), ""),
                                              exact=True))


_shapes: Lru[int, tuple[LayoutDialect, _Shape]] = Lru()


# -- an answer as a prompt writes it ---------------------------------------------------------


def read_answer(d: LayoutDialect, lx: Lexed, at: int) -> tuple[dict[str, Any], int]:
    """The assistant message at ``at`` of a prompt, as the format writes
    one (strictly: a ParseError at the first place it is not), and where
    the text after its close starts."""
    a = _reader(d)
    s = lx.text
    end = s.find(a.close, at)
    if end < 0:
        raise ParseError("an assistant message that is not closed", offset=lx.offset(at))
    j = s.find(a.opener, at, end)
    r = _Repairs(d, lx, False)
    message: dict[str, Any] = {"role": "assistant", "content": _text(r, s[at:end if j < 0 else j], at)}
    if j >= 0:
        message["tool_calls"] = _written_calls(d, a, lx, j, end)
    return message, end + len(a.close)


def _written_calls(d: LayoutDialect, a: _Array, lx: Lexed, at: int, end: int) -> list[dict[str, Any]]:
    s = lx.text[:end]
    before, after = a.section[0][0], a.section[1][0]
    if not s.startswith(before, at):
        raise ParseError("tool calls that are not written as the format writes them", offset=lx.offset(at))
    pos = at + len(before)
    bad = _TOKEN.search(s, pos)
    if bad is not None:
        raise ParseError(f"{d.tokens[ord(bad.group()) - TOKEN_BASE]!r} does not belong in tool calls",
                         offset=lx.offset(bad.start()))
    calls: list[dict[str, Any]] = []
    while not (calls and s.startswith(after, pos) and pos + len(after) == end):
        call, pos = _written_call(a, lx, s, pos, a.more if calls else a.first)
        calls.append(call)
    return calls


def _written_call(a: _Array, lx: Lexed, s: str, pos: int, steps: tuple[tuple[str, str], ...]) -> tuple[
        dict[str, Any], int]:
    values: dict[str, str] = {}
    for k, (lit, slot) in enumerate(steps):
        if not s.startswith(lit, pos):
            raise ParseError("a tool call that is not written as the format writes one", offset=lx.offset(pos))
        pos += len(lit)
        if slot == "id":
            if a.id_len:
                stop = pos + a.id_len
            else:
                # As given, up to the literal after it.
                stop = s.find(steps[k + 1][0], pos) if steps[k + 1][0] else len(s)
            if stop < 0 or stop > len(s):
                raise ParseError("a call id that is not written as the format writes one", offset=lx.offset(pos))
            values["id"], pos = s[pos:stop], stop
        elif slot == "name" and not a.name_json:
            stop = s.find(steps[k + 1][0], pos) if steps[k + 1][0] else len(s)
            if stop < 0:
                raise ParseError("a call name that is not written as the format writes one", offset=lx.offset(pos))
            values["name"], pos = s[pos:stop], stop
        elif slot:
            value, stop = _decoded(s, pos)
            if value is None or (slot == "name" and not isinstance(value, str)):
                raise ParseError(f"a call {slot} that is not JSON", offset=lx.offset(pos))
            # Arguments as written: an object's JSON text, a string's value.
            values[slot] = value if isinstance(value, str) else s[pos:stop]
            pos = stop
    call: dict[str, Any] = {"type": "function", "function": {"name": values.get("name", ""),
                                                              "arguments": values.get("arguments", "")}}
    if "id" in values:
        call["id"] = values["id"]
    return call, pos


def _decoded(s: str, pos: int) -> tuple[Any, int]:
    """The JSON value at ``pos`` and where it ends; (None, pos) where there
    is none (or it nests past Python's reader)."""
    try:
        value, end = jsonfmt.read(s, lambda t: _DECODER.raw_decode(t, pos))
    except ValueError:
        return None, pos
    return value, end


# -- a completion ----------------------------------------------------------------------------


def parse_completion_array(d: LayoutDialect, lx: Lexed, *, lenient: bool) -> dict[str, Any]:
    """What a model generated: its content up to the token that opens the
    calls, then one JSON array of calls, then the stop token. Strict raises
    at the first problem; lenient repairs, each located (a call that is cut
    off or malformed is withheld, never half read)."""
    a = _reader(d)
    s = lx.text
    r = _Repairs(d, lx, lenient)
    stop_at = first_of(s, a.stops)
    body = s if stop_at < 0 else s[:stop_at]
    j = body.find(a.opener)
    message: dict[str, Any] = {"role": "assistant", "content": _text(r, body if j < 0 else body[:j], 0)}
    if j >= 0:
        calls = _array_calls(r, body, j + 1, cut=stop_at < 0)
        if calls:
            message["tool_calls"] = calls
    r.ended(stop_at)
    if r.list:
        message["diagnostics"] = r.list
    return message


def _array_calls(r: _Repairs, body: str, base: int, *, cut: bool) -> list[dict[str, Any]]:
    """The calls of the array after the token (at ``base``): tokens in it
    left out (a repair each), then each element read as JSON."""
    region = body[base:]
    where: list[int] = []
    pieces: list[str] = []
    pos = 0
    for t in _TOKEN.finditer(region):
        r.add("stray-token", base + t.start(), f"{r.token(t.group())!r} does not belong in tool calls: left out")
        pieces.append(region[pos:t.start()])
        where += range(pos, t.start())
        pos = t.end()
    text = "".join(pieces) + region[pos:] if pieces else region
    where += range(pos, len(region))

    def at(k: int) -> int:
        return base + (where[k] if k < len(where) else len(region))

    ended = "truncated" if cut else "bad-call"
    n = len(text)
    p = _skip(text, 0)
    if p >= n:
        r.add(ended, at(p), "no tool-call array after the token that opens the calls")
        return []
    if text[p] != "[":
        r.add("bad-call", at(p), "the tool calls are not a JSON array: they are withheld")
        return []
    p += 1
    calls: list[dict[str, Any]] = []
    k = 0
    while True:
        p = _skip(text, p)
        if p < n and text[p] == "]" and k == 0:
            r.add("bad-call", at(p), "an empty tool-call array")
            p += 1
            break
        if k and p < n and text[p] == "]":
            p += 1
            break
        if k and p < n and text[p] == ",":
            p = _skip(text, p + 1)
        elif k and p < n:
            r.add("bad-call", at(p), f"expected ',' or ']' after tool call {k}: what follows is withheld")
            return calls
        if p >= n:
            r.add(ended, at(p), "the tool-call array is not closed" + (": the answer is cut off" if cut else ""))
            return calls
        value, end = _decoded(text, p)
        k += 1
        if end == p:
            r.add(ended, at(p), f"tool call {k} is {'cut off' if cut else 'not JSON'}: it and what follows are "
                                "withheld")
            return calls
        found = _call(value)
        if isinstance(found, str):
            r.add("bad-argument" if found.startswith("the arguments") else "bad-call", at(p),
                  f"{found.replace('#', str(k))}: it is withheld")
        else:
            calls.append(found)
        p = end
    rest = _skip(text, p)
    if rest < n:
        r.add("stray-content", at(rest), "what follows the tool-call array is left out")
    return calls


def _skip(text: str, p: int) -> int:
    n = len(text)
    while p < n and text[p] in _WS:
        p += 1
    return p


_KEYS = frozenset({"name", "arguments", "id"})


def _call(value: Any) -> dict[str, Any] | str:
    """A call read out of its JSON value, or what is wrong with it (``#``
    for its number)."""
    if not isinstance(value, dict):
        return "tool call # is not a JSON object"
    extra = [k for k in value if k not in _KEYS]
    if extra:
        return f"tool call # has a key the format does not write ({shown(extra[0])})"
    name, args = value.get("name"), value.get("arguments")
    if not isinstance(name, str) or not name:
        return "tool call # needs a name (a non-empty string)"
    if "id" in value and not isinstance(value["id"], str):
        return "tool call # has an id that is not a string"
    if isinstance(args, dict):
        text = json.dumps(args, ensure_ascii=False)
    elif isinstance(args, str):
        try:
            held = jsonfmt.read(args)
        except ValueError:
            held = None
        if not isinstance(held, dict):
            return "the arguments of tool call # are a string that holds no JSON object"
        text = args
    else:
        return "the arguments of tool call # are not a JSON object" + ("" if "arguments" in value else " (none given)")
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": text}}
    if "id" in value:
        call["id"] = value["id"]
    return call

