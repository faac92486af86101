"""Gemma 4's call arguments as GBNF (llama.cpp's grammar syntax) and as
xgrammar's EBNF: the language of :mod:`.gemma_values`'s Lark grammar, in
rules alone.

Neither syntax has llguidance's intersection and negation of terminals, nor
its bounded JSON numbers, so what the Lark grammar writes with them is
spelled out here as automata, one rule per state:

* the text of a string spells neither its delimiter ``<|"|>`` nor any other
  token of the format the vocabulary has as one id (llama.cpp matches a
  grammar's characters against a control token's text too), and holds
  between ``minLength`` and ``maxLength`` characters: the states are the
  longest token prefix the text ends with, times the characters counted;
* a number within bounds is a decimal numeral compared digit by digit with
  the bounds (aligned at the point), as Python's ``int`` reads one without a
  point and its ``float`` one with a point (so a bound is moved to the
  floats that read back within it), besides the exponent forms the Lark
  grammar adds where every number they spell is within the bounds;
* a key a closed set of keys leaves out is a key that is none of them (a
  trie of the listed keys).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from ..errors import RequestError, shown
from .api import ebnf_literal
from .gemma_read import KEY_ENDS, QUOTE
from .gemma_write import BOUNDS, LarkGrammar, holds

__all__ = ["EbnfGrammar"]

_KEY_OUT = "".join(sorted(KEY_ENDS)) + "<"
"""What a bare key never holds: what ends it, and the start of every token."""
_INT_DIGITS = 4300
"""Python's int() reads at most this many digits."""
_FLOAT_DIGITS = 308
"""Digits before the point of a numeral read back finite by float()."""


def _cls_char(ch: str, wide: bool) -> str:
    """``ch`` in a character class (``wide`` as for
    :func:`.api.ebnf_literal`)."""
    if ch.isalnum() and ord(ch) < 0x80:
        return ch
    if ord(ch) < 0x100 and not wide:
        return f"\\x{ord(ch):02x}"
    return f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}"


def _digits(ds: Iterable[int]) -> str:
    """A class of the digits ``ds``, as runs."""
    got = sorted(set(ds))
    runs: list[tuple[int, int]] = []
    for d in got:
        if runs and runs[-1][1] == d - 1:
            runs[-1] = (runs[-1][0], d)
        else:
            runs.append((d, d))
    if len(runs) == 1 and runs[0][0] == runs[0][1]:
        return f'"{runs[0][0]}"'
    return "[" + "".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs) + "]"


def _times(expr: str, lo: int, hi: int) -> str:
    """``expr`` ``lo`` to ``hi`` times."""
    if hi == 0:
        return ""
    return expr if lo == hi == 1 else f"{expr}{{{lo}}}" if lo == hi else f"{expr}{{{lo},{hi}}}"


def _below(digits: str) -> str:
    """The digit strings that, read after ``0.``, are at most ``0.digits``
    followed by any digits."""
    alts = [" ".join([*([f'"{digits[:i]}"'] if i else []), f"[0-{int(digits[i]) - 1}]", "[0-9]*"])
            for i in range(len(digits)) if digits[i] != "0"]
    alts += [f'"{digits[:i]}"' for i in range(1, len(digits))]
    return "(" + " | ".join([*alts, f'"{digits}" [0-9]*']) + ")"


_MANTISSA = '[1-9] ("." [0-9]+)?'
_MAX_308 = '"1" ("." ' + _below("7976931348623157") + ')? [eE] "+"? "308"'
_TINY = f'{_MANTISSA} [eE] "-" ("0"? [5-9] | [1-9] [0-9] | [12] [0-9] [0-9] | "3" [01] [0-9] | "32" [0-3])'
_DEEP = f'{_MANTISSA} [eE] "-" ("32" [4-9] | "3" [3-9] [0-9])'
_HUGE = f'({_MANTISSA} [eE] "+"? ("1" [6-9] | [2-9] [0-9] | [12] [0-9] [0-9] | "30" [0-7]) | {_MAX_308})'
_EXPONENT_FORMS = ((_TINY, 1e-323, 1e-4), ('"-" ' + _TINY, -1e-4, -1e-323), (_DEEP, 0.0, 1e-323),
                   ('"-" ' + _DEEP, -1e-323, 0.0), (_HUGE, 1e16, math.inf), ('"-" ' + _HUGE, -math.inf, -1e16))
"""The Lark grammar's exponent forms, each with the range of what it spells."""
_FREE_EXPONENT = (f'"-"? {_MANTISSA} [eE] ("-" [0-9]{{1,3}} | "+"? ("0"{{0,2}} [0-9] | "0"? [1-9] [0-9] '
                  f'| [12] [0-9] [0-9] | "30" [0-7])) | "-"? {_MAX_308}')
_FREE_INTEGER = f'"-"? ("0" | [1-9] [0-9]{{0,{_INT_DIGITS - 1}}})'
_FREE_FRACTION = f'"-"? ("0" | [1-9] [0-9]{{0,{_FLOAT_DIGITS - 1}}}) "." [0-9]+'


def _plain(d: Decimal) -> tuple[str, str]:
    """A non-negative decimal's digits before the point (at least one, no
    leading zero) and after it (no trailing zero)."""
    whole, _, frac = format(d.copy_abs(), "f").partition(".")
    return whole.lstrip("0") or "0", frac.rstrip("0")


def _float_at(b: int | float, up: bool, strict: bool) -> float | None:
    """The least float at or above ``b`` (``up``; above it if ``strict``),
    or the greatest at or below it; None past the floats."""
    try:
        f = float(b)
    except OverflowError:
        return None
    if (f < b if up else f > b) or (strict and f == b):
        f = math.nextafter(f, math.inf if up else -math.inf)
    return f if math.isfinite(f) else None


class EbnfGrammar(LarkGrammar):
    """The rules of one tool's arguments in ``syntax`` (``gbnf`` or
    ``xgrammar``): rule names of letters, digits and ``-``, definitions
    ``NAME ::= BODY``; ``quote`` the delimiter token's reference, ``tokens``
    the spellings free text never holds."""

    def __init__(self, syntax: str, rule: str, quote: str | None, tokens: Iterable[str]) -> None:
        super().__init__(rule, quote)
        self.wide = syntax == "xgrammar"
        self.spelled = sorted({QUOTE, *tokens})
        self.strings: dict[tuple[int, int | None], str] = {}

    def lit(self, s: str) -> str:
        return ebnf_literal(s, self.wide)

    def cls(self, chars: Iterable[str], negate: bool = False) -> str:
        """A class of ``chars`` (``negate``: of every character but them)."""
        # xgrammar takes a surrogate's UTF-8 bytes as one character, which a
        # decoder reads as three replacement characters: not text.
        no = "\\ud800-\\udfff" if negate and self.wide else ""
        return "[" + "^" * negate + "".join(_cls_char(c, self.wide) for c in sorted(set(chars))) + no + "]"

    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"{self.rule}-{hint}{self.count}"

    def terminal(self, name: str, body: str) -> str:
        name = f"{self.rule}-{name}"
        self.terminals[name] = body
        return name

    def literal(self, text: str) -> str:
        parts = text.split(QUOTE)
        for part in parts:
            if any(t in part for t in self.spelled):
                # llama.cpp would match the token's text there: a parse then reads the token.
                raise RequestError(f"{shown(text)} spells a token of the format", location="grammar")
        if self.quote is None:
            return self.lit(text)
        out = [self.lit(parts[0])] if parts[0] else []
        for part in parts[1:]:
            out.append(self.quote)
            if part:
                out.append(self.lit(part))
        return "(" + " ".join(out) + ")" if len(out) > 1 else out[0]

    # -- strings -------------------------------------------------------------------------------

    def string(self, lo: int = 0, hi: int | None = None) -> str:
        q = self.quote if self.quote is not None else self.lit(QUOTE)
        inner = self.strings.get((lo, hi))
        if inner is None:
            inner = self.strings[(lo, hi)] = self.inner(lo, hi)
        return f"({q} {inner} {q})"

    def inner(self, lo: int, hi: int | None) -> str:
        """A rule of text of ``lo`` to ``hi`` characters that spells no token:
        states (the longest token prefix it ends with, the characters
        counted, at most ``lo`` where no ``hi`` bounds them)."""
        prefixes = sorted({t[:k] for t in self.spelled for k in range(len(t))}, key=lambda p: (len(p), p))
        index = {p: k for k, p in enumerate(prefixes)}
        chars = sorted({ch for t in self.spelled for ch in t})
        top = lo if hi is None else hi
        base = f"{self.rule}-s{lo}-{'n' if hi is None else hi}"

        def step(p: str, ch: str) -> str | None:
            s = p + ch
            if any(s.endswith(t) for t in self.spelled):
                return None
            return next(s[k:] for k in range(len(s) + 1) if s[k:] in index)

        for p, k in index.items():
            moves: dict[str, list[str]] = {}
            own: list[str] = []
            for ch in chars:
                nxt = step(p, ch)
                if nxt != "":
                    own.append(ch)
                    if nxt is not None:
                        moves.setdefault(nxt, []).append(ch)
            for c in range(top + 1):
                alts = ['""'] if c >= lo else []
                if hi is None or c < hi:
                    after = min(c + 1, top) if hi is None else c + 1
                    for nxt, cs in moves.items():
                        one = self.lit(cs[0]) if len(cs) == 1 else self.cls(cs)
                        alts.append(f"{one} {base}-{index[nxt]}-{after}")
                    alts.append(f"{self.cls(own, True)} {base}-0-{after}")
                self.terminals[f"{base}-{k}-{c}"] = " | ".join(alts)
        return f"{base}-0-0"

    # -- keys and values of any kind -----------------------------------------------------------

    def any(self) -> str:
        name = f"{self.rule}-any"
        if name not in self.rules:
            self.rules[name] = ""  # taken before its body refers to it
            key = self.terminal("key", f"{self.cls(_KEY_OUT, True)}+")
            self.rules[name] = " | ".join([
                self.string(), self.free_number(), '"true"', '"false"', '"None"',
                f'"[" ({name} ("," {name})*)? "]"', f'"{{" ({key} ":" {name} ("," {key} ":" {name})*)? "}}"'])
        return name

    def other_key(self, declared: Iterable[str]) -> str:
        """A bare key that is none of ``declared``: a trie of them, leaving
        it at the first character none of them has there."""
        keys = [k for k in declared if k and not any(c in _KEY_OUT for c in k)]
        base = self.fresh("xkey")
        rest = self.terminal("key-rest", f"{self.cls(_KEY_OUT, True)}*")
        prefixes = sorted({"", *(k[:i] for k in keys for i in range(len(k) + 1))}, key=lambda p: (len(p), p))
        index = {p: i for i, p in enumerate(prefixes)}
        for p, i in index.items():
            nexts = sorted({k[len(p)] for k in keys if len(k) > len(p) and k.startswith(p)})
            alts = [f"{self.lit(ch)} {base}-{index[p + ch]}" for ch in nexts]
            alts.append(f"{self.cls([*_KEY_OUT, *nexts], True)} {rest}")
            if p and p not in keys:
                alts.append('""')
            self.terminals[f"{base}-{i}"] = " | ".join(alts)
        return f"{base}-0"

    # -- numbers -------------------------------------------------------------------------------

    def free_number(self) -> str:
        return self.terminal("number", f"{_FREE_INTEGER} | {_FREE_FRACTION} | {_FREE_EXPONENT}")

    def number(self, jt: str, s: Mapping[str, Any], where: str) -> str | None:  # type: ignore[override]
        b = {k: s[k] for k in BOUNDS if k in s}
        for k, v in b.items():
            if type(v) not in (int, float) or not math.isfinite(v):
                raise RequestError(f"{k} is a finite number, not {shown(v)}", location=f"{where}.{k}")
        if not b:
            return self.free_number() if jt == "number" else self.terminal("integer", _FREE_INTEGER)
        # A numeral without a point reads as an int, compared with a bound as it is.
        lo_i: int | None = None
        hi_i: int | None = None
        for k, v in b.items():
            d = Decimal(v)
            if k in ("minimum", "exclusiveMinimum"):
                n = int(d.to_integral_value(ROUND_CEILING if k == "minimum" else ROUND_FLOOR))
                n += k == "exclusiveMinimum"
                lo_i = n if lo_i is None else max(lo_i, n)
            else:
                n = int(d.to_integral_value(ROUND_FLOOR if k == "maximum" else ROUND_CEILING))
                n -= k == "exclusiveMaximum"
                hi_i = n if hi_i is None else min(hi_i, n)
        alts = self.interval(None if lo_i is None else Decimal(lo_i), None if hi_i is None else Decimal(hi_i),
                             False)
        if jt == "number":
            alts += self.fractions(b)
            alts += [form for form, lo, hi in _EXPONENT_FORMS if holds(b, lo, hi)]
        if not alts:
            return None
        return self.terminal(f"num{len(self.terminals)}", " | ".join(f"({a})" for a in alts))

    def fractions(self, b: Mapping[str, int | float]) -> list[str]:
        """Numerals with a point within the bounds: float() rounds them, so
        each bound becomes the float next to it that is within it, and a
        numeral is taken up to that float's shortest spelling (which reads
        back as it, and is as far out as what Python writes of any float
        within the bound)."""
        lo: Decimal | None = None
        hi: Decimal | None = None
        for k, v in b.items():
            up = k in ("minimum", "exclusiveMinimum")
            f = _float_at(v, up, k.startswith("exclusive"))
            if f is None:
                if (v > 0) == up:
                    return []  # past the largest float: none is within
                continue
            d = Decimal(repr(f))
            if up:
                lo = d if lo is None else max(lo, d)
            else:
                hi = d if hi is None else min(hi, d)
        return self.interval(lo, hi, True)

    def interval(self, lo: Decimal | None, hi: Decimal | None, point: bool) -> list[str]:
        """Expressions of the numerals (with a point, or without) whose value
        is from ``lo`` to ``hi`` (None: unbounded), a minus sign before the
        negative ones (and maybe before a zero)."""
        if lo is not None and hi is not None and lo > hi:
            return []
        out = []
        if hi is None or hi >= 0:
            pos = self.magnitudes(max(lo, Decimal(0)) if lo is not None else Decimal(0), hi, point)
            if pos:
                out.append(pos)
        if lo is None or lo <= 0:
            neg = self.magnitudes(max(hi.copy_negate(), Decimal(0)) if hi is not None else Decimal(0),
                                  None if lo is None else lo.copy_negate(), point)
            if neg:
                out.append(f'"-" ({neg})')
        return out

    def magnitudes(self, lo: Decimal, hi: Decimal | None, point: bool) -> str | None:
        """An expression of the numerals ``0``, ``[1-9][0-9]*`` (then a point
        and digits where ``point``) from ``lo`` to ``hi``. Numerals whose
        digits before the point are as many as a bound's are compared with
        it digit by digit; those between are free."""
        most = _FLOAT_DIGITS if point else _INT_DIGITS
        lw, lf = _plain(lo)
        hw, hf = _plain(hi) if hi is not None else ("", "")
        if len(lw) > most:
            return None
        top = len(hw) if hi is not None and len(hw) <= most else most
        bounded_top = hi is not None and len(hw) <= most
        tail = ' "." [0-9]+' if point else ""
        alts = []
        for n in sorted({len(lw), top}):
            if n == len(lw) or (n == top and bounded_top):
                got = self.digits(n, lw if n == len(lw) else None, lf, hw if n == top and bounded_top else None,
                                  hf, point)
                if got is not None:
                    alts.append(got)
        free_lo, free_hi = len(lw) + 1, top - 1 if bounded_top else top
        if free_lo <= free_hi:
            alts.append(f"[1-9] [0-9]{{{free_lo - 1},{free_hi - 1}}}{tail}")
        return " | ".join(alts) if alts else None

    def digits(self, n: int, lw: str | None, lf: str, hw: str | None, hf: str, point: bool) -> str | None:
        """Numerals of ``n`` digits before the point, at least ``lw.lf`` where
        ``lw`` is given and at most ``hw.hf`` where ``hw`` is: one rule per
        (position, still equal to the low bound, still equal to the high)."""
        base = self.fresh("d")
        # Past the bounds' digits every place is alike.
        size = max(len(lf) if lw is not None else 0, len(hf) if hw is not None else 0) + 1
        made: dict[tuple[int, bool, bool], str | None] = {}

        def bound(w: str | None, f: str, at: int) -> int:
            if w is None:
                return 0
            return int(w[at]) if at < n else int(f[at - n]) if at - n < len(f) else 0

        def rest_zero(f: str, at: int) -> bool:
            return all(c == "0" for c in f[at - n:])

        def state(at: int, low: bool, high: bool) -> str | None:
            if not low and not high:
                left = n - at
                if at < n:
                    return f"[0-9]{{{left}}}" + (' "." [0-9]+' if point else "") if left > 1 else \
                        "[0-9]" + (' "." [0-9]+' if point else "")
                if at == n:
                    return '"." [0-9]+' if point else '""'
                return "[0-9]*"
            key = (min(at, n + size), low, high)
            if key in made:
                name = made[key]
                return name
            name = f"{base}-{at}-{int(low)}{int(high)}"
            made[key] = name
            alts: list[str] = []
            if at == n:
                if point:
                    nxt = frac(at, low, high)
                    if nxt is not None:
                        alts.append(f'"." {nxt}')
                elif not low or rest_zero(lf, at):
                    alts.append('""')
            else:
                if at > n and (not low or rest_zero(lf, at)):
                    alts.append('""')
                alts += moves(at, low, high)
            if not alts:
                made[key] = None
                return None
            self.terminals[name] = " | ".join(alts)
            return name

        def frac(at: int, low: bool, high: bool) -> str | None:
            """At least one digit after the point."""
            name = f"{base}-p-{int(low)}{int(high)}"
            got = moves(at, low, high)
            if not got:
                return None
            self.terminals[name] = " | ".join(got)
            return name

        def moves(at: int, low: bool, high: bool) -> list[str]:
            first = 1 if at == 0 and n > 1 else 0
            a, z = bound(lw, lf, at) if low else 0, bound(hw, hf, at) if high else 9
            groups: dict[tuple[bool, bool], list[int]] = {}
            for d in range(first, 10):
                if (low and d < a) or (high and d > z):
                    continue
                groups.setdefault((low and d == a, high and d == z), []).append(d)
            out = []
            for (lt, ht), ds in groups.items():
                nxt = state(at + 1, lt, ht)
                if nxt is not None:
                    out.append(f"{_digits(ds)} {nxt}" if nxt != '""' else _digits(ds))
            return out

        return state(0, lw is not None, hw is not None)

    def text(self) -> str:
        lines = [f"{k} ::= {v}" for k, v in self.rules.items()]
        lines += [f"{k} ::= {v}" for k, v in self.terminals.items()]
        return "\n".join(lines) + "\n"
