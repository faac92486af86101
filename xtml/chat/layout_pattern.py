"""The patterns of a layout dialect (spec.md §12): literal text, the
dialect's tokens, ``{slot}``s and ``{?cond}…{/}`` parts, compiled once and
read alike by render (a :class:`Builder` of pieces) and by the parse of
prompts and completions (a regular expression over a *lexed* string).

In a lexed string each token of the dialect stands as one lone surrogate
(:func:`~.layout_pattern.token_char`), a character no decoded text and no request holds
(requests with lone surrogates are refused), so a pattern compiles to one
regular expression over it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import TemplateError, shown
from ..markup.segments import Segment

__all__ = ["ANY_TEXT", "CODECS", "MAX_TOKENS", "TOKEN_BASE", "Builder", "Cond", "Item", "Lit", "Pattern", "Slot",
           "Tok", "Value", "holds", "item_regex", "items_regex", "options_of", "slot_codec", "token_char",
           "token_finder"]


TOKEN_BASE = 0xD800
"""The lone surrogate that stands for a dialect's first token in a lexed
string; token ``k`` (in :attr:`~.layout.LayoutDialect.tokens` order) is
``TOKEN_BASE + k``."""
MAX_TOKENS = 0x800


def token_char(k: int) -> str:
    return chr(TOKEN_BASE + k)


ANY_TEXT = "[^\ud800-\udfff]"
"""A character of text in a lexed string: anything but a token."""


@dataclass(frozen=True, slots=True)
class Lit:
    text: str


@dataclass(frozen=True, slots=True)
class Tok:
    token: str


@dataclass(frozen=True, slots=True)
class Slot:
    name: str
    codec: str = ""
    """How the value is written: one of :data:`CODECS`, or as it is."""


@dataclass(frozen=True, slots=True)
class Cond:
    name: str
    """A condition: a name, or names joined by ``or`` and ``and`` (``and``
    binds tighter), each maybe preceded by ``not``."""
    negate: bool
    body: tuple[Item, ...]

    @property
    def simple(self) -> bool:
        return " " not in self.name


CODECS: dict[str, Callable[[str], str]] = {
    "strip_nl": lambda v: v.strip("\n"),
    "lstrip_nl": lambda v: v.lstrip("\n"),
    "rstrip_nl": lambda v: v.rstrip("\n"),
    "trim": lambda v: v.strip(),
    # transformers' tojson: a string as a quoted JSON string.
    "tojson": lambda v: json.dumps(v, ensure_ascii=False),
}
"""The ways a slot's value may be written (Python's ``str.strip`` family:
what the official templates apply)."""


def slot_codec(p: Pattern, name: str) -> str:
    """How a pattern writes its slot ``name`` (one of :data:`CODECS`), ""
    where it writes it as it is or not at all."""
    def walk(items: Sequence[Item]) -> str | None:
        for i in items:
            if isinstance(i, Slot) and i.name == name:
                return i.codec
            if isinstance(i, Cond):
                found = walk(i.body)
                if found is not None:
                    return found
        return None
    return walk(p.items) or ""


def holds(expr: str, conds: Mapping[str, bool]) -> bool:
    """Whether a condition expression holds."""
    for alternative in expr.split(" or "):
        if all(_term(t, conds) for t in alternative.split(" and ")):
            return True
    return False


def _term(t: str, conds: Mapping[str, bool]) -> bool:
    return not conds[t[4:]] if t.startswith("not ") else conds[t]


_COND = re.compile(r"(?:not )?[A-Za-z_][A-Za-z0-9_]*(?: (?:and|or) (?:not )?[A-Za-z_][A-Za-z0-9_]*)*")


Item = Lit | Tok | Slot | Cond

_PART = re.compile(r"\{\{|\}\}|\{([?!])([a-z _A-Z0-9]+)\}|\{([A-Za-z_][A-Za-z0-9_]*)(?:\|([a-z_]+))?\}|\{/\}")


@dataclass(frozen=True, slots=True)
class Pattern:
    """A compiled pattern: literal text (with the dialect's tokens found in
    it), ``{slot}``, ``{?cond}…{/}`` (written iff ``cond``), ``{!cond}…{/}``
    (iff not), and ``{{`` / ``}}`` for literal braces."""

    source: str
    items: tuple[Item, ...]
    slot_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """The slots, in order: asked per message while a request is read, and
    fixed with the items, so walked once."""

    def __post_init__(self) -> None:
        found: list[str] = []
        _walk_slots(self.items, found)
        object.__setattr__(self, "slot_names", tuple(found))

    @staticmethod
    def compile(source: str, tokens: Sequence[str], slots: frozenset[str], conds: frozenset[str],
                where: str) -> Pattern:
        stack: list[tuple[list[Item], str, bool]] = []
        out: list[Item] = []
        text: list[str] = []
        finder = token_finder(tokens)

        def flush() -> None:
            if text:
                out.extend(_split_tokens("".join(text), finder))
                text.clear()

        pos = 0
        for m in _PART.finditer(source):
            if "{" in source[pos:m.start()] or "}" in source[pos:m.start()]:
                raise TemplateError(f"a lone brace in pattern {shown(source)}: write {{{{ or }}}} for a literal one",
                                    location=where)
            text.append(source[pos:m.start()])
            pos = m.end()
            g = m.group()
            if g in ("{{", "}}"):
                text.append(g[0])
            elif g == "{/}":
                flush()
                if not stack:
                    raise TemplateError(f"{{/}} closes nothing in pattern {shown(source)}", location=where)
                body, name, neg = stack.pop()
                body.append(Cond(name, neg, tuple(out)))
                out = body
            elif m.group(1):
                flush()
                expr = m.group(2)
                words = [w for w in expr.split(" ") if w not in ("not", "and", "or")]
                if not _COND.fullmatch(expr):
                    raise TemplateError(f"a condition is names joined by 'and' and 'or', each maybe after 'not', "
                                        f"not {expr!r}", location=where)
                for w in words:
                    if w not in conds:
                        raise TemplateError(f"unknown condition {w!r} in pattern {shown(source)}",
                                            location=where + (f" (conditions here: {', '.join(sorted(conds))})"
                                                              if conds else " (no condition is known here)"))
                stack.append((out, expr, m.group(1) == "!"))
                out = []
            else:
                flush()
                name, codec = m.group(3), m.group(4) or ""
                if name not in slots:
                    raise TemplateError(f"unknown slot {{{name}}} in pattern {shown(source)}",
                                        location=where + (f" (slots here: {', '.join(sorted(slots))})"
                                                          if slots else " (this pattern takes no slot)"))
                if codec and codec not in CODECS:
                    raise TemplateError(f"unknown codec {codec!r} in pattern {shown(source)}",
                                        location=where + f" (codecs: {', '.join(CODECS)})")
                out.append(Slot(name, codec))
        rest = source[pos:]
        if "{" in rest or "}" in rest:
            raise TemplateError(f"a lone brace in pattern {shown(source)}: write {{{{ or }}}} for a literal one",
                                location=where)
        text.append(rest)
        flush()
        if stack:
            raise TemplateError(f"{{?{stack[-1][1]}}} is not closed by {{/}} in pattern {shown(source)}",
                                location=where)
        return Pattern(source, tuple(out))

    def slots(self) -> list[str]:
        return list(self.slot_names)

    def render(self, values: Mapping[str, Value], conds: Mapping[str, bool], out: Builder) -> None:
        _render_items(self.items, values, conds, out)

    def parseable(self) -> bool:
        """Whether a parse can read this pattern back: each slot once, as it
        is, and each condition one name."""
        return _parseable(self.items, set())

    def regex(self, chars: Mapping[str, str], conds: Mapping[str, bool] | None = None,
              taken: list[tuple[str, bool]] | None = None, *, closed: bool = False) -> str:
        """A regular expression over a lexed string; each slot a named group.
        With ``conds``, conditions are decided; without, each conditional
        part is optional, and with ``taken`` it is a group named ``_c{k}``
        for ``taken[k]``, its condition and whether it is negated (so a
        match says which options the text was written with). ``closed``:
        what follows the pattern in the expression starts with a token."""
        return items_regex(self.items, chars, conds, taken, closed)

    @property
    def opens_with_token(self) -> bool:
        return bool(self.items) and isinstance(self.items[0], Tok)


def _walk_slots(items: Sequence[Item], found: list[str]) -> None:
    for i in items:
        if isinstance(i, Slot):
            found.append(i.name)
        elif isinstance(i, Cond):
            _walk_slots(i.body, found)


Value = str | Callable[["Builder"], None]
"""A slot's value: text, or a writer of pieces (a slot that holds tokens)."""


def _render_items(items: Sequence[Item], values: Mapping[str, Value], conds: Mapping[str, bool],
                  out: Builder) -> None:
    for i in items:
        if isinstance(i, Lit):
            out.text(i.text)
        elif isinstance(i, Tok):
            out.token(i.token)
        elif isinstance(i, Slot):
            v = values[i.name]
            if isinstance(v, str):
                out.text(CODECS[i.codec](v) if i.codec else v)
            else:
                v(out)
        elif (conds[i.name] if i.simple else holds(i.name, conds)) != i.negate:
            _render_items(i.body, values, conds, out)


def _parseable(items: Sequence[Item], seen: set[str]) -> bool:
    for i in items:
        if isinstance(i, Slot):
            if i.codec or i.name in seen:
                return False
            seen.add(i.name)
        elif isinstance(i, Cond) and (not i.simple or not _parseable(i.body, seen)):
            return False
    return True


def items_regex(items: Sequence[Item], chars: Mapping[str, str], conds: Mapping[str, bool] | None,
                taken: list[tuple[str, bool]] | None, closed: bool = False) -> str:
    """The expression of a run of items; ``closed``: what follows the run
    starts with a token.

    A slot before a token, with only literal text between, can only end
    that text's length before the first token after its start (its text
    holds none): it takes all the text there is and gives back that much
    (with none between, it takes it without backtracking, ``*+``). The
    same match as the shortest one, without the shortest match's step per
    character."""
    out: list[str] = []
    n = len(items)
    for k, i in enumerate(items):
        if isinstance(i, Slot):
            j = k + 1
            while j < n and isinstance(items[j], Lit):
                j += 1
            if isinstance(items[j], Tok) if j < n else closed:
                out.append(f"(?P<{i.name}>{ANY_TEXT}*{'+' if j == k + 1 else ''})")
                continue
        out.append(item_regex(i, chars, conds, taken))
    return "".join(out)


def item_regex(i: Item, chars: Mapping[str, str], conds: Mapping[str, bool] | None,
           taken: list[tuple[str, bool]] | None) -> str:
    if isinstance(i, Lit):
        return re.escape(i.text)
    if isinstance(i, Tok):
        return chars[i.token]
    if isinstance(i, Slot):
        return f"(?P<{i.name}>{ANY_TEXT}*?)"
    if conds is not None:
        return items_regex(i.body, chars, conds, taken) if conds[i.name] != i.negate else ""
    if taken is None:
        return f"(?:{items_regex(i.body, chars, conds, taken)})?"
    k = len(taken)
    taken.append((i.name, i.negate))
    return f"(?P<_c{k}>{items_regex(i.body, chars, conds, taken)})?"


def options_of(m: re.Match[str], taken: list[tuple[str, bool]], defaults: Mapping[str, bool]) -> dict[str, bool]:
    """The options a match of a pattern compiled with ``taken`` was written
    with; an option the text does not show keeps its default."""
    out = dict(defaults)
    for k, (name, negate) in enumerate(taken):
        out[name] = (m.group(f"_c{k}") is not None) != negate
    return out


def token_finder(tokens: Sequence[str]) -> re.Pattern[str] | None:
    if not tokens:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def _split_tokens(text: str, finder: re.Pattern[str] | None) -> list[Item]:
    if finder is None:
        return [Lit(text)] if text else []
    out: list[Item] = []
    pos = 0
    for m in finder.finditer(text):
        if m.start() > pos:
            out.append(Lit(text[pos:m.start()]))
        out.append(Tok(m.group()))
        pos = m.end()
    if pos < len(text):
        out.append(Lit(text[pos:]))
    return out


class Builder:
    """Pieces of a render: adjacent text joined (tokenized as one run, as
    engines tokenize the whole text), each token its own piece."""

    __slots__ = ("_text", "segments")

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self._text: list[str] = []

    def text(self, s: str) -> None:
        if s:
            self._text.append(s)

    def token(self, t: str) -> None:
        self._flush()
        self.segments.append(Segment(t, True))

    def _flush(self) -> None:
        if self._text:
            self.segments.append(Segment("".join(self._text), False))
            self._text = []

    def finish(self) -> list[Segment]:
        self._flush()
        return self.segments

