"""A rendered request, token by token, for people: ``xtml inspect``
(``xtml render --format tokens`` is the plain form, for programs).

Each top-level message gets a header with its role, its token count and the
count per channel; each token a row with its offset, id and piece, markers
highlighted. Colour only when the output is a terminal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from ..chat.layout_pattern import Tok
from ..markup.segments import Segment
from ..template import LayoutTemplate, Template

__all__ = ["Token", "tokens", "write"]


@dataclass(frozen=True, slots=True)
class Token:
    offset: int
    id: int
    piece: str
    """The token decoded on its own (a partial UTF-8 character shows as U+FFFD)."""
    marker: bool
    message: int
    """Index of the top-level message it belongs to."""
    path: tuple[str, ...]
    """Element names from the message down to the token's element."""


def tokens(template: Template, request: Any, tokenizer: Any, **options: Any) -> list[Token]:
    """Every token of a rendered request with its message and element path.
    The ids are those of :meth:`Template.encode`: each segment encodes on its
    own, so encoding segment by segment gives the same ids, attributed."""
    if isinstance(template, LayoutTemplate):
        return _layout_tokens(template, request, tokenizer, **options)
    b = template.bind(tokenizer)
    out: list[Token] = []
    for ids, message, path in b.attributed(template.document(request, **options)):
        for t in ids:
            out.append(Token(len(out), t, b.vocab.decode([t]), t in b.kind_of_id, message, path))
    return out


def _layout_tokens(template: LayoutTemplate, request: Any, tokenizer: Any, **options: Any) -> list[Token]:
    """:func:`tokens` of a layout dialect, whose render has no elements: a
    message starts at each token that opens a frame, and its path is its
    role, read from the role text its frame writes. Each token and each run
    of text between tokens is encoded on its own, as :meth:`Template.encode`
    encodes them, so the ids are the same."""
    b = template.bind(tokenizer)
    d = template.layout
    opens = {p.items[0].token for p in (d.frame_open, *(f.open for f in d.role_frames.values()))
             if p.items and isinstance(p.items[0], Tok)}
    texts = sorted(((r.text, r.name) for r in d.roles.values()), key=lambda x: -len(x[0]))
    groups: list[list[Segment]] = []
    for s in template.render(request, **options).segments:
        token = s.special and s.text in b.token_ids
        if token or not groups or (groups[-1][0].special and groups[-1][0].text in b.token_ids):
            groups.append([s])
        else:
            groups[-1].append(s)
    out: list[Token] = []
    message, start, role, opened = 0, 0, "", False
    for g in groups:
        token = g[0].special and g[0].text in b.token_ids
        if token and g[0].text in opens:
            if out:
                message, start = message + 1, len(out)
            role, opened = "?", True
        elif not token and opened:
            text = "".join(s.text for s in g)
            role = next((name for spelled, name in texts if text.startswith(spelled)), "?")
            opened = False
            for before in out[start:]:
                object.__setattr__(before, "path", (role,))
        for t in b.encode_segments(g):
            out.append(Token(len(out), t, b.vocab.decode([t]), token, message, (role,)))
    return out


def _summary(template: Template, toks: Sequence[Token]) -> tuple[str, dict[str, int]]:
    if isinstance(template, LayoutTemplate):
        return "message", {}
    n = template.dialect.names
    channels = set(template.dialect.channels())
    counts: dict[str, int] = {}
    for t in toks:
        if len(t.path) > 1 and t.path[1] in channels:
            counts[t.path[1]] = counts.get(t.path[1], 0) + 1
    return n["message"], counts


def write(out: TextIO, template: Template, toks: Sequence[Token], *, colour: bool | None = None) -> None:
    """Print ``toks`` grouped by message; colour defaults to whether ``out``
    is a terminal."""
    from rich.console import Console
    from rich.text import Text as RichText

    tty = out.isatty() if colour is None else colour
    console = Console(file=out, force_terminal=tty, no_color=not tty, highlight=False, soft_wrap=True,
                      width=10_000 if not tty else None)
    by_message: dict[int, list[Token]] = {}
    for t in toks:
        by_message.setdefault(t.message, []).append(t)
    roles = _roles(template, toks)
    for k, group in by_message.items():
        _, counts = _summary(template, group)
        detail = ", ".join(f"{c} {v}" for c, v in counts.items())
        head = f"message {k} · {roles.get(k, '?')} · {len(group)} tokens" + (f" ({detail})" if detail else "")
        console.print(RichText(f"── {head} ──", style="bold"))
        for t in group:
            line = RichText(f"{t.offset:>7} {t.id:>8}  ")
            if t.marker:
                line.append(t.piece, style="bold cyan")
            else:
                line.append(json.dumps(t.piece, ensure_ascii=False), style="green" if tty else "")
            where = "/".join(t.path[1:])
            if where:
                line.append(f"  {where}", style="dim")
            console.print(line)
    console.print(RichText(f"{len(toks)} tokens in {len(by_message)} messages", style="bold"))


def _roles(template: Template, toks: Sequence[Token]) -> dict[int, str]:
    """Role (and internal type) of each message, read from its open tag."""
    doc_roles: dict[int, str] = {}
    if isinstance(template, LayoutTemplate):
        return {t.message: t.path[0] for t in toks if t.path}
    n = template.dialect.names
    text: dict[int, list[str]] = {}
    for t in toks:
        if len(t.path) == 1:
            text.setdefault(t.message, []).append(t.piece)
    for k, pieces in text.items():
        header = "".join(pieces)
        role = _attr(header, n["role"])
        typ = _attr(header, n["type"])
        doc_roles[k] = f"{role} ({typ})" if role and typ else (role or "?")
    return doc_roles


def _attr(header: str, key: str) -> str | None:
    at = header.find(f' {key}="')
    if at < 0:
        return None
    start = at + len(key) + 3
    end = header.find('"', start)
    return header[start:end] if end >= 0 else None
