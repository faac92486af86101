"""Training examples of a layout dialect: ids (equal to the template's
``encode``), a loss mask and spans, with the API and result of
:func:`~xtml.codec.training.encode_example`.

A trained assistant message trains what the model generates after the
generation prompt: where the message's render starts with the prompt of
the request's options (the frame opening, and for Qwen3 with thinking off
the closed reasoning block the prompt writes), the ids after it, up to and
with the first stop token of the frame's close. Everything is found in the
dialect's own patterns: the request is rendered by the same code as
``encode``, with every frame, body and assistant slot of a copy of the
dialect wrapped in marks (tokens no dialect has), so the marks fall where
the patterns were written.

The text between two tokens is tokenized whole, as ``encode`` does; where
a mark falls inside such a run (the frame opening's ``\\n`` and the
content after it), a token of the tokenizer may hold characters of both
sides. Such a token is trained when it holds any trained character, as
transformers' assistant masks do (``char_to_token``).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..chat.dialect import Training
from ..chat.fields import dump
from ..chat.layout import LayoutDialect, RoleFrame
from ..chat.layout_engine import render
from ..chat.layout_pattern import Builder, Cond, Item, Pattern, Slot, Tok
from ..chat.request import request_size
from ..errors import OptionError, RequestError
from ..lru import Lru
from ..markup.segments import Segment
from ..vocab.tokens import TokenBinding
from .training import Span, Train, TrainingExample, _chosen, _example

__all__ = ["encode_layout_example"]


_MARK = "\udfff"
"""What every mark's text starts with: a lone surrogate, which no request
(they are refused) and no dialect file (TOML has none) holds."""

_HOLDS = {"reasoning": "reasoning", "content": "content", "calls": "tool_calls"}
"""An assistant body's slot → what it holds (its channel's name is the
dialect's :meth:`~xtml.chat.layout.LayoutDialect.channel_tag`)."""


class _Marked(NamedTuple):
    dialect: LayoutDialect
    marks: dict[str, tuple[str, str]]
    """A mark's token text → (kind, role or slot)."""


def _mark_dialect(d: LayoutDialect) -> _Marked:
    marks: dict[str, tuple[str, str]] = {}

    def tok(kind: str, what: str) -> Tok:
        text = f"{_MARK}{len(marks)}"
        marks[text] = (kind, what)
        return Tok(text)

    def around(p: Pattern, kind: str, what: str, items: tuple[Item, ...] | None = None) -> Pattern:
        return Pattern(p.source, (tok(kind, what), *(p.items if items is None else items), tok(f"/{kind}", what)))

    def slots(items: Sequence[Item]) -> tuple[Item, ...]:
        out: list[Item] = []
        for i in items:
            if isinstance(i, Slot) and i.name in _HOLDS:
                out += [tok("slot", i.name), i, tok("/slot", i.name)]
            elif isinstance(i, Slot) and i.name == "results":
                # Tool results folded into the answer: the tools', not the model's.
                out += [tok("results", i.name), i, tok("/results", i.name)]
            elif isinstance(i, Cond):
                out.append(Cond(i.name, i.negate, slots(i.body)))
            else:
                out.append(i)
        return tuple(out)

    roles = {name: dataclasses.replace(r, body=around(r.body, "body", name,
                                                      slots(r.body.items) if name == "assistant" else None))
             for name, r in d.roles.items()}
    frames = {name: RoleFrame(around(f.open, "open", name), around(f.close, "close", name), f.group)
              for name, f in d.role_frames.items()}
    # Turns the template writes itself (a tools declaration, the system
    # messages gathered in one turn): spans of no message but the first
    # system message a tools turn holds.
    turns: dict[str, Any] = {name: around(getattr(d, name), "turn", name) for name in _TURNS
                             if getattr(d, name, None) is not None}
    if d.calls_pending is not None:
        # Written in place of the close of a turn whose calls wait for results.
        turns["calls_pending"] = around(d.calls_pending, "close", "")
    marked = dataclasses.replace(d, roles=roles, role_frames=frames, frame_open=around(d.frame_open, "open", ""),
                                 frame_close=around(d.frame_close, "close", ""), **turns)
    return _Marked(marked, marks)


_TURNS = ("system_with_tools", "tools_turn", "system_hoist")
"""The fields of a layout dialect that write a turn of no one message."""


# The marked copy of each dialect, by the dialect's identity, the dialect
# kept beside it (an id reused by another object misses).
_marked: Lru[int, tuple[LayoutDialect, _Marked]] = Lru()


def _marked_of(d: LayoutDialect) -> _Marked:
    hit = _marked.get(id(d))
    if hit is not None and hit[0] is d:
        return hit[1]
    return _marked.put(id(d), (d, _mark_dialect(d)))[1]


class _Message:
    """Where one written message lies, in characters of the lexed render
    (each bound token one character)."""

    __slots__ = ("body_end", "body_start", "close", "end", "index", "results", "role", "slots", "start", "turn")

    def __init__(self, role: str, start: int, body_start: int, turn: bool) -> None:
        self.role = role
        self.turn = turn
        self.start = start
        self.body_start = body_start
        self.body_end = -1
        self.close = -1
        self.end = -1
        self.index: int | None = None
        self.slots: list[tuple[str, int, int]] = []
        self.results: tuple[int, int] | None = None


class _Lexed:
    """The render with its marks taken out: the lexed string (each bound
    token one character, other text as it is), its pieces (a token id, or
    a run of text encoded whole) and the marks' places."""

    def __init__(self, segments: Sequence[Segment], marks: Mapping[str, tuple[str, str]],
                 binding: TokenBinding, chars: Mapping[str, str]) -> None:
        ids = binding.token_ids
        lexed: list[str] = []
        self.found: list[tuple[str, str, int]] = []
        self.runs: list[str] = []
        self.piece_at: list[int] = []  # where each piece starts in the lexed string
        self.plan: list[int] = []  # a token id, or -1 - the index of a run
        pending: list[str] = []
        pos = 0

        def flush() -> None:
            if pending:
                text = "".join(pending)
                self.piece_at.append(pos - len(text))
                self.plan.append(-1 - len(self.runs))
                self.runs.append(text)
                pending.clear()

        for s in segments:
            if s.special:
                mark = marks.get(s.text)
                if mark is not None:
                    self.found.append((mark[0], mark[1], pos))
                    continue
                if s.text in ids:
                    flush()
                    self.piece_at.append(pos)
                    self.plan.append(ids[s.text])
                    lexed.append(chars[s.text])
                    pos += 1
                    continue
            pending.append(s.text)
            lexed.append(s.text)
            pos += len(s.text)
        flush()
        self.text = "".join(lexed)


def _prompts(d: LayoutDialect, options: Mapping[str, bool], binding: TokenBinding,
             chars: Mapping[str, str]) -> list[str]:
    """Every generation prompt the dialect writes under the request's
    options, lexed, longest first: the conditions that are not options (the
    role of the message before, say) take each value."""
    names = sorted({w for c in _conds(d.prompt.items) for w in c.split(" ") if w not in ("not", "and", "or")}
                   - set(options))[:_FREE_CONDS]
    found: set[str] = set()
    for values in itertools.product((False, True), repeat=len(names)):
        b = Builder()
        try:
            d.prompt.render({}, {**options, **dict(zip(names, values))}, b)
        except KeyError:  # a condition of more than these names: that prompt is not known here
            continue
        found.add(_lex(b.finish(), binding, chars))
    return sorted(found, key=len, reverse=True)


_FREE_CONDS = 6
"""At most this many of a prompt's conditions take each value (2**6 renders)."""


def _conds(items: Sequence[Item]) -> list[str]:
    out: list[str] = []
    for i in items:
        if isinstance(i, Cond):
            out.append(i.name)
            out += _conds(i.body)
    return out


def _lex(segments: Sequence[Segment], binding: TokenBinding, chars: Mapping[str, str]) -> str:
    ids = binding.token_ids
    return "".join(chars[s.text] if s.special and s.text in ids else s.text for s in segments)


class _Tokens:
    """The ids of a lexed render, and the id offset of any of its places."""

    def __init__(self, lx: _Lexed, binding: TokenBinding) -> None:
        self.lx = lx
        self.binding = binding
        encoded = binding.vocab.ids_of(lx.runs) if lx.runs else []
        self.encoded = encoded
        ids: list[int] = []
        self.first: list[int] = []  # the id offset of each piece
        for p in lx.plan:
            self.first.append(len(ids))
            if p >= 0:
                ids.append(p)
            else:
                ids.extend(encoded[-1 - p])
        self.ids = ids
        self._starts: dict[int, list[int]] = {}

    def _run_starts(self, run: int) -> list[int]:
        """Where each id of a run starts: in bytes of its UTF-8 with a byte
        table, else in characters (the tokenizer's offsets)."""
        hit = self._starts.get(run)
        if hit is not None:
            return hit
        ids = self.encoded[run]
        vocab = self.binding.vocab
        table = vocab.byte_table()
        starts: list[int] = []
        if table:
            at = 0
            for t in ids:
                starts.append(at)
                at += len(table[t])
        else:
            enc = vocab.tokenizer.encode(self.lx.runs[run], add_special_tokens=False)
            if list(enc.ids) == list(ids):
                starts = [int(a) for a, _ in enc.offsets]
            else:  # another tokenizer's split: the decoded prefixes say where each id starts
                starts = [len(vocab.decode(ids[:k])) for k in range(len(ids))]
        self._starts[run] = starts
        return starts

    def at(self, pos: int, end: bool) -> int:
        """The id offset of a place: the id that holds its character (for a
        start) or the first id that starts at or after it (for an end)."""
        lx = self.lx
        if pos >= len(lx.text):
            return len(self.ids)
        k = bisect.bisect_right(lx.piece_at, pos) - 1
        off = pos - lx.piece_at[k]
        if off == 0:
            return self.first[k]
        run = -1 - lx.plan[k]
        starts = self._run_starts(run)
        if self.binding.vocab.byte_table():
            off = len(lx.runs[run][:off].encode("utf-8", "surrogatepass"))
        j = bisect.bisect_left(starts, off) if end else bisect.bisect_right(starts, off) - 1
        return self.first[k] + j


def _messages(lx: _Lexed) -> list[_Message]:
    out: list[_Message] = []
    opened = -1
    for kind, what, pos in lx.found:
        if kind == "open":
            opened = pos
        elif kind in ("body", "turn"):
            if out and out[-1].end < 0:  # a message of a group that shares one close
                out[-1].end = out[-1].body_end
            turn = kind == "turn"
            out.append(_Message(what, pos if turn or opened < 0 else opened, pos, turn))
            opened = -1
        elif kind in ("/body", "/turn"):
            out[-1].body_end = pos
            if kind == "/turn":
                out[-1].close = out[-1].end = pos
        elif kind == "close":
            out[-1].close = pos
        elif kind == "/close":
            out[-1].end = pos
        elif kind == "slot":
            out[-1].slots.append((what, pos, -1))
        elif kind == "results":
            out[-1].results = (pos, pos)
        elif kind == "/results" and out[-1].results is not None:
            out[-1].results = (out[-1].results[0], pos)
        elif kind == "/slot":
            name, start, _ = out[-1].slots[-1]
            out[-1].slots[-1] = (name, start, pos)
    if out and out[-1].end < 0:
        out[-1].end = out[-1].body_end
    return out


def _roles(request: Any) -> list[str]:
    """The role of each message of a request that rendered."""
    if not isinstance(request, list | tuple):
        if not isinstance(request, Mapping):
            request = dump(request, unset=True)
        request = request["messages"]
    out: list[str] = []
    for m in request:
        role = m.get("role") if isinstance(m, Mapping) else getattr(m, "role", None)
        out.append(str(role))
    return out


def _assign(msgs: list[_Message], roles: list[str]) -> None:
    """Which request message each written body is: bodies are written in
    the order of the messages, but for messages a turn of the template's
    holds (system messages), and after a default system message. Matched
    from the end by role; a tools turn holding the first message is its."""
    j = len(roles) - 1
    bodies = [m for m in msgs if not m.turn]
    for m in reversed(bodies):
        while j >= 0 and roles[j] != m.role:
            j -= 1
        if j < 0:
            break  # written by the template before the request's messages
        m.index = j
        j -= 1
    held = {m.index for m in bodies if m.index is not None}
    for m in msgs:
        if m.turn and m.role == "system_with_tools" and roles[:1] == ["system"] and 0 not in held:
            m.index = 0
            m.role = "system"
        elif m.turn:
            m.role = "system"


def encode_layout_example(d: LayoutDialect, binding: TokenBinding, request: Any, *, train: Train = None,
                          options: Mapping[str, Any] | None = None, max_chars: int | None = None) -> TrainingExample:
    """Ids (equal to the template's ``encode``), loss mask and spans of a
    request for a layout dialect, ``train`` as
    :func:`~xtml.codec.training.encode_example` reads it. With the default
    rules every assistant message trains what the model generates after the
    generation prompt (its stop token included); a :class:`Training` with
    ``channels`` trains those of its slots (``think``, ``response``,
    ``tools``), and ``end=False`` leaves the close out. A message the
    template writes itself and the generation prompt are never trained."""
    rules = train if isinstance(train, Training) else Training()
    if rules.exclude:
        raise OptionError(f"a layout format has no elements to exclude (the {d.name} format); "
                          f"train has exclude={list(rules.exclude)}", option="train")
    if max_chars is not None:
        size = request_size(request, max_chars)
        if size > max_chars:
            raise RequestError(f"the request is too large: at least {size:,} characters, more than "
                               f"max_chars={max_chars:,}")
    marked = _marked_of(d)
    r = render(marked.dialect, request, dict(options or {}))
    chars = d.chars()
    lx = _Lexed(r.segments, marked.marks, binding, chars)
    tokens = _Tokens(lx, binding)
    msgs = _messages(lx)
    roles = _roles(request)
    _assign(msgs, roles)
    chosen = _chosen(train, rules, list(enumerate(roles)))

    prompts = _prompts(d, {k: v for k, v in r.options.items() if k in d.options}, binding, chars)
    stops = {chars[t] for t in d.stops if t in binding.token_ids}
    trained_tags = {d.channel_tag(_HOLDS[name]) for name in _HOLDS} & set(rules.channels)
    mask = bytearray(len(tokens.ids))
    text = lx.text

    def train_range(a: int, z: int) -> None:
        if z > a:
            i, j = tokens.at(a, False), tokens.at(z, True)
            mask[i:j] = b"\x01" * (j - i)

    for m in msgs:
        if m.index is None or m.index not in chosen:
            continue
        start = m.body_start
        if m.role == "assistant":
            # The longest generation prompt the message's render starts with:
            # what follows it is what the model generates.
            for prompt in prompts:
                if m.body_start <= m.start + len(prompt) <= m.body_end and text.startswith(prompt, m.start):
                    start = m.start + len(prompt)
                    break
        if rules.channels:
            for name, a, z in m.slots:
                if d.channel_tag(_HOLDS[name]) in trained_tags:
                    train_range(max(a, start), z)
        elif m.results is not None and m.results[1] > m.results[0]:
            # The answer's calls and the token that opens their results (the
            # model's stop), then what it writes after the results.
            train_range(start, m.results[0] + 1)
            train_range(m.results[1], m.body_end)
        else:
            train_range(start, m.body_end)
        if rules.end and m.close >= 0:
            stop = next((k for k in range(m.close, m.end) if text[k] in stops), -1)
            train_range(m.body_end, stop + 1 if stop >= 0 else m.end)
            if d.open_turns and m.role == "assistant" and m.end < len(text) and text[m.end] in stops:
                # No marker closes the turn: the model ends it by writing
                # the token that opens the next (the user's, the results').
                train_range(m.end, m.end + 1)

    spans: list[Span] = []
    for m in msgs:
        span = Span(m.index, m.role, None, tokens.at(m.start, False), tokens.at(m.end, True),
                    tokens.at(m.body_start, False), tokens.at(m.body_end, True))
        spans.append(span)
        for name, a, z in m.slots:
            if z > a:  # an empty slot writes no channel
                i, j = tokens.at(a, False), tokens.at(z, True)
                spans.append(Span(m.index, m.role, d.channel_tag(_HOLDS[name]), i, j, i, j))
    return _example(tokens.ids, bytes(mask), None, rules, tuple(spans))
