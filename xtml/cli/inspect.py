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

from ..template import Template

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
    b = template.bind(tokenizer)
    out: list[Token] = []
    for ids, message, path in b.attributed(template.document(request, **options)):
        for t in ids:
            out.append(Token(len(out), t, b.vocab.decode([t]), t in b.kind_of_id, message, path))
    return out


def _summary(template: Template, toks: Sequence[Token]) -> tuple[str, dict[str, int]]:
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
