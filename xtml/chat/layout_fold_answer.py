"""Answers of a format that folds tool results into the calling turn and
writes calls' arguments by a value syntax (``<|tool_call>call:NAME{…}
<tool_call|>``): what the format's patterns say an answer holds, and the
parse of a completion. The prompt and the normal form are
:mod:`.layout_fold_read`'s.

Everything is learnt from the dialect: the reasoning block, a call, a
folded result and the pending mark are its patterns written with stand-ins
for their slots; what opens an arguments text is what the value syntax
writes for no arguments; the tokens the syntax writes (a string's quote)
are those it writes for values of every kind. Arguments are read by the
syntax's ``read`` against the schema of the request's tool of that name.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..errors import ParseError, RequestError
from ..lru import Lru
from ..plugins.values import ValueSyntax, load_value_syntax
from .layout import LayoutDialect
from .layout_call_array import _pieces
from .layout_parse import Lexed, _made, _Repairs, _Shape, _text, first_of
from .layout_pattern import TOKEN_BASE, Builder, Pattern

__all__ = ["Fold", "call_schemas", "fold_reader", "fold_shape", "parse_completion_fold", "read_arguments"]

# Stand-ins for the slots of a pattern: private-use characters no pattern
# of a dialect file holds.
_NAME, _ARGS, _REASON, _CALLS, _RESULTS, _CONTENT, _SYSTEM, _TOOLS, _TEXT = (
    "\ue011", "\ue012", "\ue013", "\ue014", "\ue015", "\ue016", "\ue017", "\ue018", "\ue019")


class Fold(NamedTuple):
    """What the format writes, in lexed text (each token its character)."""

    syntax: ValueSyntax
    head: str
    frame_close: str
    opens: dict[str, str]
    """Each role's frame opening → the role."""
    think: tuple[str, str] | None
    """Before and after the reasoning (the block's opening with its label;
    the text before its closing, with the closing)."""
    call: tuple[str, str]
    """Before a call's name; after its arguments (ending with the closing
    token)."""
    string_call: tuple[str, str]
    """Around string arguments, inside the call."""
    args_open: str
    """What an arguments text starts with (after the name)."""
    result: tuple[str, str, str]
    """Before a result's name, between it and the content, after the content."""
    pending: str
    system: list[tuple[dict[str, bool], tuple[tuple[str, str], ...]]]
    """Each value of the options → the system turn's steps (system text,
    tools)."""
    declaration: tuple[str, str, str]
    """Before a declared tool's name; what opens its body; after it."""
    prompts: dict[str, dict[str, bool]]
    """Each generation prompt written → the options it shows."""
    stops: str
    quotes: frozenset[str]
    """The tokens the value syntax writes (characters)."""


def lexed_text(d: LayoutDialect, p: Pattern, values: Mapping[str, str], conds: Mapping[str, bool]) -> str:
    """A pattern written with ``values``, as a parse reads it: each token
    its character; a token the dialect does not have (a mark a copy of it
    holds) left out."""
    b = Builder()
    p.render(values, conds, b)
    chars = d.chars()
    return "".join(chars.get(seg.text, "") if seg.special else seg.text for seg in b.finish())


def _reason(d: LayoutDialect) -> str:
    return f"the layout dialect {d.name!r} writes what the reader of folded results does not read"


def _fold(d: LayoutDialect) -> Fold:
    each, result, st, body = d.calls_each, d.call_result, d.system_turn, d.roles["assistant"].body
    if each is None or result is None or st is None or not d.calls_syntax:
        raise ParseError(_reason(d), offset=0)
    syntax = load_value_syntax(d.calls_syntax)
    chars = d.chars()
    finder = d.finder()

    def lexed(text: str) -> str:
        return finder.sub(lambda m: chars[m.group()], text)

    steps = _pieces(lexed_text(d, body, {"reasoning": _REASON, "calls": _CALLS, "results": _RESULTS,
                                          "content": _CONTENT},
                               {**d.options, "show_reasoning": True, "has_calls": True, "has_text": True,
                                "after_user": True, "after_tool": False}),
                    {"reasoning": _REASON, "calls": _CALLS, "results": _RESULTS, "content": _CONTENT})
    think = None
    names = [s for _, s in steps]
    if names == ["reasoning", "calls", "results", "content", ""]:
        if any(lit for lit, _ in steps[2:]):
            raise ParseError(_reason(d), offset=0)
        think = (steps[0][0], steps[1][0])
    elif names != ["calls", "results", "content", ""] or any(lit for lit, _ in steps):
        raise ParseError(_reason(d), offset=0)

    def call_steps(string: bool) -> tuple[tuple[str, str], ...]:
        return _pieces(lexed_text(d, each, {"name": _NAME, "arguments": _ARGS, "id": ""},
                                  {**d.options, "first": True, "has_content": False, "string": string}),
                       {"name": _NAME, "arguments": _ARGS})

    plain, quoted = call_steps(False), call_steps(True)
    if [s for _, s in plain] != ["name", "arguments", ""] or [s for _, s in quoted] != ["name", "arguments", ""] \
            or plain[1][0] or quoted[0][0] != plain[0][0] or not plain[0][0] or not plain[2][0]:
        raise ParseError(_reason(d), offset=0)
    args_open = lexed(syntax.write({}, {}))[:1]
    rs = _pieces(lexed_text(d, result, {"name": _NAME, "content": _CONTENT}, d.options),
                 {"name": _NAME, "content": _CONTENT})
    if [s for _, s in rs] != ["name", "content", ""] or not rs[0][0] or not rs[1][0] or not rs[2][0]:
        raise ParseError(_reason(d), offset=0)
    pending = lexed_text(d, d.calls_pending, {}, d.options) if d.calls_pending is not None else ""
    system = []
    for values in itertools.product((False, True), repeat=len(d.options)):
        opts = dict(zip(d.options, values, strict=True))
        text = lexed_text(d, st, {"system": _SYSTEM, "tools": _TOOLS},
                          {**opts, "has_system": True, "has_tools": True, "some_tools": True})
        system.append((opts, _pieces(text, {"system": _SYSTEM, "tools": _TOOLS})))
    declaration = ("", "", "")
    if d.tools_syntax:
        dummy = load_value_syntax(d.tools_syntax).declare([{"type": "function", "function": {"name": _NAME}}])
        ds = _pieces(lexed(dummy), {"name": _NAME})
        if len(ds) != 2 or not ds[0][0] or not ds[1][0]:
            raise ParseError(_reason(d), offset=0)
        declaration = (ds[0][0], ds[1][0][:1], ds[1][0][-1:])
    prompts: dict[str, dict[str, bool]] = {}
    for opts, _ in system:
        for after_user in (True, False):
            text = lexed_text(d, d.prompt, {}, {**opts, "after_user": after_user, "after_calls": False})
            prompts.setdefault(text, opts)
    # The syntax's own tokens: those it writes for a value of every kind.
    sample = syntax.write({"a": "s", "b": [1, 2.5, True, None], "c": {"d": "e"}}, {})
    quotes = frozenset(c for c in lexed(sample) if ord(c) >= TOKEN_BASE and ord(c) < TOKEN_BASE + 0x800)
    opens = {lexed_text(d, d.frame_open, {"role": r.text}, d.options): name for name, r in d.roles.items()}
    return Fold(syntax, lexed_text(d, d.head, {}, d.options) if d.head is not None else "",
                lexed_text(d, d.frame_close, {}, d.options), opens, think, (plain[0][0], plain[2][0]),
                (quoted[1][0], quoted[2][0][:len(quoted[2][0]) - len(plain[2][0])]), args_open,
                (rs[0][0], rs[1][0], rs[2][0]), pending, system, declaration, prompts,
                "".join(chars[t] for t in d.stops), quotes)


_folds: Lru[int, tuple[LayoutDialect, Fold]] = Lru()


def fold_reader(d: LayoutDialect) -> Fold:
    return _made(_folds, d, _fold)


def fold_shape(d: LayoutDialect) -> _Shape:
    """The stops and the reasoning block's two tokens, as the reader of
    reasoning lengths asks them."""
    f = fold_reader(d)
    think = (f.think[0][:1], f.think[1][-1:]) if f.think is not None else None
    return _made(_shapes, d, lambda _: _Shape(frozenset(f.stops), think, None, trim=True))


_shapes: Lru[int, tuple[LayoutDialect, _Shape]] = Lru()


def call_schemas(tools: Any) -> dict[str, Any]:
    """Tool name → its parameters schema, from a request's tools."""
    out: dict[str, Any] = {}
    for t in tools if isinstance(tools, list | tuple) else ():
        fn = t.get("function", t) if isinstance(t, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            out.setdefault(fn["name"], fn.get("parameters"))
    return out


def read_arguments(d: LayoutDialect, f: Fold, lexed: str, schema: Any,
                   syntax: ValueSyntax | None = None) -> tuple[dict[str, Any] | None, int, str]:
    """An arguments text as the value syntax (``syntax``, else the calls')
    reads it: (the object, -1, "") or (None, where in ``lexed`` it goes
    wrong, why). Each of the syntax's tokens is its string; text that
    spells one is not it."""
    spelled = {ord(q): d.tokens[ord(q) - TOKEN_BASE] for q in f.quotes}
    text = lexed.translate(spelled)
    for q in f.quotes:
        t = d.tokens[ord(q) - TOKEN_BASE]
        at = lexed.find(t)
        if at >= 0:
            return None, at, f"text that spells {t!r} in arguments, where the format writes it as a token"
    try:
        return (syntax or f.syntax).read(text, schema), -1, ""
    except ParseError as e:
        at = e.offset if isinstance(e.offset, int) else 0
        return None, _lexed_at(lexed, spelled, at), e.msg
    except RequestError as e:
        return None, 0, e.msg


def _lexed_at(lexed: str, spelled: Mapping[int, str], at: int) -> int:
    """Where in ``lexed`` the character ``at`` of its translation by
    ``spelled`` comes from (each of a token's characters is the token's),
    found from the tokens alone: a prompt's string arguments are each tried
    as the syntax's first, so a failed reading is common, not rare."""
    size = len(lexed) + sum((len(t) - 1) * lexed.count(chr(q)) for q, t in spelled.items())
    if at < 0:
        at += size
    if not 0 <= at < size:
        return len(lexed)
    marks = sorted(k for q in spelled for k in _positions(lexed, chr(q)))
    shift = 0  # the translation's extra characters before the mark at hand
    for k in marks:
        if at < k + shift:
            break
        width = len(spelled[ord(lexed[k])])
        if at < k + shift + width:
            return k
        shift += width - 1
    return at - shift


def _positions(s: str, c: str) -> list[int]:
    out: list[int] = []
    k = s.find(c)
    while k >= 0:
        out.append(k)
        k = s.find(c, k + 1)
    return out


def _arguments_text(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False)


def parse_completion_fold(d: LayoutDialect, lx: Lexed, *, lenient: bool, tools: Any = None) -> dict[str, Any]:
    """What a model generated after the generation prompt: an optional
    reasoning block first, content, then calls, then a stop. Strict raises
    at the first problem; lenient repairs, each located (a call that is cut
    off or does not read is withheld, never half read)."""
    f = fold_reader(d)
    s = lx.text
    r = _Repairs(d, lx, lenient)
    stop_at = first_of(s, f.stops)
    end = len(s) if stop_at < 0 else stop_at
    pos = 0
    message: dict[str, Any] = {"role": "assistant"}
    reasoning = ""
    if f.think is not None and s.startswith(f.think[0][:1]):
        closing = f.think[1][-1:]
        ci = s.find(closing, 1, end)
        inner_end = end if ci < 0 else ci
        inner = _text(r, s[1:inner_end], 1)
        label = f.think[0][1:]
        reasoning = inner[len(label):] if inner.startswith(label) else inner
        tail = f.think[1][:-1]
        if ci >= 0 and tail and reasoning.endswith(tail):
            reasoning = reasoning[:-len(tail)]
        if ci < 0:
            if stop_at >= 0:
                r.add("truncated", end, "the reasoning block is not closed before the stop")
            pos = end
        else:
            pos = ci + 1
    opener = f.call[0][:1]
    j = s.find(opener, pos, end)
    # Content: the text outside the reasoning block and the calls (the
    # template writes it after the calls, a model may write it before).
    texts = [_text(r, s[pos:end if j < 0 else j], pos)]
    calls: list[dict[str, Any]] = []
    schemas = call_schemas(tools)
    while j >= 0:
        call, after = _one_call(d, f, r, lx, j, end, schemas, cut=stop_at < 0)
        if call is not None:
            calls.append(call)
        j = s.find(opener, after, end)
        texts.append(_text(r, s[after:end if j < 0 else j], after))
    message["content"] = "".join(texts).strip()
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    r.ended(stop_at)
    if r.list:
        message["diagnostics"] = r.list
    return message


def _one_call(d: LayoutDialect, f: Fold, r: _Repairs, lx: Lexed, at: int, end: int, schemas: Mapping[str, Any],
              *, cut: bool) -> tuple[dict[str, Any] | None, int]:
    """The call whose opening token is at ``at`` (None where it is
    withheld, each problem a repair) and where what follows it starts."""
    s = lx.text
    before, after = f.call
    closing = after[-1:]
    opener = before[:1]
    ci = s.find(closing, at + 1, end)
    nxt = s.find(opener, at + 1, end)
    if ci < 0 or (0 <= nxt < ci):
        stop = end if nxt < 0 else nxt
        r.add("truncated" if cut and nxt < 0 else "bad-call", stop,
              "a call that is not closed" + (": the answer is cut off" if cut and nxt < 0 else "") + ": it is withheld")
        return None, stop
    inner = s[at + 1:ci]
    head = before[1:]
    tail = after[:-1]
    if not inner.startswith(head) or not inner.endswith(tail):
        r.add("bad-call", at + 1, f"a call is written {before!r}NAME…: it is withheld")
        return None, ci + 1
    body = inner[len(head):len(inner) - len(tail)]
    base = at + 1 + len(head)
    for k, c in enumerate(body):
        if ord(c) >= TOKEN_BASE and ord(c) < TOKEN_BASE + 0x800 and c not in f.quotes:
            r.add("stray-token", base + k, f"{r.token(c)!r} does not belong in a call: the call is withheld")
            return None, ci + 1
    k = body.find(f.args_open)
    name = body[:k] if k >= 0 else body
    if k <= 0 or any(c in f.quotes for c in name):
        r.add("bad-call", base, "a call needs a name and its arguments: it is withheld")
        return None, ci + 1
    obj, bad, why = read_arguments(d, f, body[k:], schemas.get(name))
    if obj is None:
        r.add("bad-argument", base + k + bad, f"the arguments of {name!r} do not read: {why}: the call is withheld")
        return None, ci + 1
    return {"type": "function", "function": {"name": name, "arguments": _arguments_text(obj)}}, ci + 1
