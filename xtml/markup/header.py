"""Tag headers: the text between OPEN/CLOSE and SEP.

``grammar/xtml.lark`` defines the syntax (rule ``header``); this module is the
fast equivalent used on the hot path, and the tests check the two agree.
"""

from __future__ import annotations

import math
import re

NAME_RE = r"[A-Za-z_][A-Za-z0-9_.:-]*"
_NAME = re.compile(NAME_RE + r"\Z")
# Possessive repeats (a header reads only one way): ``re`` then keeps no
# backtracking state per character, which cost 170 bytes per character of a
# long attribute value.
_HEADER = re.compile(rf"({NAME_RE})((?: {NAME_RE}=\"(?:[^\"&]|&amp;|&quot;)*+\")*+)\Z")
_ATTR = re.compile(rf" ({NAME_RE})=\"([^\"]*)\"")
_ENTITY = re.compile(r"&(amp|quot);")

Header = tuple[str, tuple[tuple[str, str], ...]]


def is_name(s: str) -> bool:
    """Whether ``s`` is a valid tag name or attribute key."""
    return _NAME.match(s) is not None


def escape(value: str) -> str:
    """Escape an attribute value: ``&`` first, then ``"``; nothing else."""
    return value.replace("&", "&amp;").replace('"', "&quot;")


def _unescape_match(m: re.Match[str]) -> str:
    return "&" if m.group(1) == "amp" else '"'


def unescape(value: str) -> str:
    """Invert :func:`escape` in one left-to-right pass."""
    if "&" not in value:
        return value
    return _ENTITY.sub(_unescape_match, value)


_cache: dict[str, Header | None] = {}
# Header caches keep only headers up to this length, so that hostile input
# cannot fill memory through them (a cache holds at most 65,536 entries).
CACHEABLE = 256


def parse_header(text: str) -> Header | None:
    """``tag k="v" ...`` → ``(tag, ((k, v), ...))``, or None if malformed."""
    # Headers recur constantly (every message, channel and argument).
    try:
        return _cache[text]
    except KeyError:
        pass
    hdr = _parse_header(text)
    if len(text) <= CACHEABLE:
        if len(_cache) >= 65536:
            _cache.clear()
        _cache[text] = hdr
    return hdr


def _parse_header(text: str) -> Header | None:
    m = _HEADER.match(text)
    if m is None:
        return None
    rest = m.group(2)
    attrs = tuple((k, unescape(v)) for k, v in _ATTR.findall(rest)) if rest else ()
    return m.group(1), attrs


# Numbers in attribute values are spelled as JSON spells them, in ASCII.
# int() and float() read more: "+5", " 5 ", "1_000", Unicode digits ("١٢"),
# "1e999" (an infinity), which one writer spells and the next cannot read.
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")


def int_value(text: str) -> int | None:
    """An attribute value as an integer: ASCII digits, no leading zero, an
    optional minus sign; None for anything else, or for more digits than
    Python converts (``sys.get_int_max_str_digits``)."""
    if _INT.match(text) is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def number_value(text: str) -> float | None:
    """An attribute value as a finite number, in JSON's number syntax; None
    for anything else, or for a number too large for a float."""
    if _NUMBER.match(text) is None:
        return None
    v = float(text)
    return v if math.isfinite(v) else None


def salvage_header(text: str) -> Header:
    """Best effort for a malformed header: a name up to the first space and
    every well-formed attribute after it. Used only by lenient parses."""
    name, _, rest = text.strip().partition(" ")
    attrs = tuple((k, unescape(v)) for k, v in _ATTR.findall(" " + rest))
    return name, attrs
