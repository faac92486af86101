"""Abstract markers and the strings a template maps them to.

The grammar speaks of OPEN, CLOSE, SEP, END and the embed markers; a template
says which string stands for each; a tokenizer binding says which id stands
for each string. Keeping the three apart is what lets one engine serve many
formats and export the grammar with token references.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import TemplateError

# Terminal names of grammar/xtml.lark, one per marker role.
OPEN = "OPEN"
CLOSE = "CLOSE"
SEP = "SEP"
END = "END"
EMBED_BEGIN = "EMBED_BEGIN"
EMBED_INNER = "EMBED_INNER"
EMBED_END = "EMBED_END"
EMBED_MARK = "EMBED_MARK"
TEXT = "TEXT"



@dataclass(frozen=True, slots=True)
class Markers:
    """The marker strings of one template."""

    open: str
    """Starts an open tag."""
    close: str
    """Starts a close tag."""
    sep: str
    """Ends any tag."""
    end: str
    """Ends a top-level element (a message)."""
    embed_begin: tuple[str, ...] = ()
    """Start an embed span."""
    embed_inner: tuple[str, ...] = ()
    """May appear inside an embed span."""
    embed_end: tuple[str, ...] = ()
    """End an embed span."""
    embed_mark: tuple[str, ...] = ()
    """An embed on its own (a placeholder)."""
    optional: frozenset[str] = frozenset()
    """Markers a vocabulary may spell as ordinary text instead of one id."""
    stop: tuple[str, ...] = ()
    """Markers that end generation."""

    def __post_init__(self) -> None:
        strings = [self.open, self.close, self.sep, self.end, *self.embed_begin, *self.embed_inner,
                   *self.embed_end, *self.embed_mark]
        for s in strings:
            if not s:
                raise TemplateError("a marker string is empty", location="markers")
        seen: set[str] = set()
        for s in strings:
            if s in seen:
                raise TemplateError(f"marker {s!r} is used for two roles", location="markers")
            seen.add(s)
        for a in strings:
            for b in strings:
                if a != b and a in b:
                    raise TemplateError(
                        f"marker {a!r} is contained in marker {b!r}, so text could not be split",
                        location="markers",
                    )
        for s in self.optional | set(self.stop):
            if s not in seen:
                raise TemplateError(f"{s!r} is not one of the markers", location="markers")

    def kinds(self) -> dict[str, str]:
        """Every marker string mapped to its grammar terminal."""
        out = {self.open: OPEN, self.close: CLOSE, self.sep: SEP, self.end: END}
        for kind, group in (
            (EMBED_BEGIN, self.embed_begin),
            (EMBED_INNER, self.embed_inner),
            (EMBED_END, self.embed_end),
            (EMBED_MARK, self.embed_mark),
        ):
            for s in group:
                if s in out:
                    raise TemplateError(f"marker {s!r} is used for two roles", location="markers")
                out[s] = kind
        return out

    def all(self) -> tuple[str, ...]:
        """Every marker string, structural ones first."""
        return tuple(self.kinds())

    def splitter(self) -> re.Pattern[str]:
        """A pattern that finds marker strings in text, longest first."""
        alts = sorted(self.kinds(), key=len, reverse=True)
        return re.compile("|".join(re.escape(a) for a in alts))
