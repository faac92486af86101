"""Ids or text → markup tree.

Two lexers feed one driver:

* :func:`lex_ids` turns marker ids into their terminals and each run of
  ordinary ids into one TEXT lexeme (offsets are token indexes);
* :func:`lex_text` splits text on marker strings (offsets are character
  indexes). Text form is ambiguous where body text holds a marker literal;
  ids are not.

The driver (:func:`build`) is a small state machine equal to the ``document``
rule of ``grammar/xtml.lark`` (``tests/test_grammar.py`` checks the two agree
on random input), with a lenient mode that repairs model output and reports
what it repaired. :mod:`xtml.markup.grammar` runs the grammar itself.
"""

from __future__ import annotations

import re
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import ParseError
from .header import CACHEABLE, parse_header, salvage_header
from .markers import (
    CLOSE,
    EMBED_BEGIN,
    EMBED_END,
    EMBED_INNER,
    EMBED_MARK,
    END,
    OPEN,
    SEP,
    TEXT,
    Markers,
)
from .nodes import Diagnostic, Document, Element, Embed, EndOfMessage, Node, Text

# Deeper nesting than this is refused: no XTML dialect needs it, and it keeps
# every later recursive walk of the tree far from Python's recursion limit.
MAX_DEPTH = 64
# More attributes than this on one tag are refused (strict) or cut (lenient):
# no dialect needs them, and each one costs work in every later layer.
MAX_ATTRIBUTES = 32

_LABEL = {
    OPEN: "open marker",
    CLOSE: "close marker",
    SEP: "separator marker",
    END: "end-of-message marker",
    EMBED_BEGIN: "embed-begin marker",
    EMBED_INNER: "embed marker",
    EMBED_END: "embed-end marker",
    EMBED_MARK: "embed marker",
    TEXT: "text",
}


@dataclass(slots=True)
class Lexemes:
    """Parallel lists: terminal kind, text (decoded, or the marker string), offset."""

    kinds: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    end: int = 0
    """Offset just past the input."""


def lex_text(text: str, markers: Markers) -> Lexemes:
    """Split the text form on marker strings."""
    kinds = markers.kinds()
    out = Lexemes(end=len(text))
    pos = 0
    for m in markers.splitter().finditer(text):
        if m.start() > pos:
            out.kinds.append(TEXT)
            out.texts.append(text[pos : m.start()])
            out.offsets.append(pos)
        out.kinds.append(kinds[m.group()])
        out.texts.append(m.group())
        out.offsets.append(m.start())
        pos = m.end()
    if pos < len(text):
        out.kinds.append(TEXT)
        out.texts.append(text[pos:])
        out.offsets.append(pos)
    return out


def lex_ids(
    ids: Sequence[int],
    marker_kinds: dict[int, tuple[str, str]],
    decode_batch: Callable[[list[Sequence[int]]], list[str]],
    header_cache: dict[str, str] | None = None,
) -> Lexemes:
    """Lex token ids: ``marker_kinds`` maps a marker id to (terminal, string).

    Runs of ordinary ids are decoded in one batch; runs that are tag headers
    (right after OPEN or CLOSE) recur constantly and go through
    ``header_cache``.
    """
    n = len(ids)
    out = Lexemes(end=n)
    if n == 0:
        return out
    finder = _finder(marker_kinds)
    as_text = ids_as_text(ids)
    if as_text is None:
        return _lex_ids_slow(ids, marker_kinds, decode_batch)
    kinds, texts, offsets = out.kinds, out.texts, out.offsets
    cache = header_cache if header_cache is not None else {}
    pending: list[Sequence[int]] = []
    pending_at: list[int] = []
    pending_keys: list[str | None] = []
    start = 0
    after_tag = False
    for i in [*(m.start() for m in finder.finditer(as_text)), n]:
        if i > start:
            kinds.append(TEXT)
            offsets.append(start)
            texts.append("")
            if after_tag:
                key = as_text[start:i]
                hit = cache.get(key)
                if hit is not None:
                    texts[-1] = hit
                else:
                    pending.append(ids[start:i])
                    pending_at.append(len(texts) - 1)
                    pending_keys.append(key)
            else:
                pending.append(ids[start:i])
                pending_at.append(len(texts) - 1)
                pending_keys.append(None)
        if i == n:
            break
        kind, marker = marker_kinds[ids[i]]
        kinds.append(kind)
        texts.append(marker)
        offsets.append(i)
        after_tag = kind == OPEN or kind == CLOSE
        start = i + 1
    if pending:
        for at, hkey, decoded in zip(pending_at, pending_keys, decode_batch(pending)):
            texts[at] = decoded
            if hkey is not None and header_cache is not None and len(hkey) <= CACHEABLE:
                header_cache[hkey] = decoded
    return out


_LE = sys.byteorder == "little"
_U32 = next(t for t in "IL" if array(t).itemsize == 4)


def ids_as_text(ids: Sequence[int]) -> str | None:
    """Each id as one character, so that regular expressions (in C) find
    markers instead of a Python loop over every id. Surrogate code points are
    fine in a str; ids past U+10FFFF, negative or non-integer ids give None."""
    try:
        return array(_U32, ids).tobytes().decode("utf-32-le" if _LE else "utf-32-be", "surrogatepass")
    except (OverflowError, UnicodeDecodeError, TypeError):
        return None
_finders: dict[frozenset[int], re.Pattern[str]] = {}


def _finder(marker_kinds: dict[int, tuple[str, str]]) -> re.Pattern[str]:
    key = frozenset(marker_kinds)
    pat = _finders.get(key)
    if pat is None:
        chars = "".join(chr(i) for i in sorted(key) if i <= 0x10FFFF)
        pat = re.compile("[" + re.escape(chars) + "]" if chars else "(?!)")
        _finders[key] = pat
    return pat


def _lex_ids_slow(
    ids: Sequence[int],
    marker_kinds: dict[int, tuple[str, str]],
    decode_batch: Callable[[list[Sequence[int]]], list[str]],
) -> Lexemes:
    out = Lexemes(end=len(ids))
    runs: list[Sequence[int]] = []
    at: list[int] = []
    start = 0
    for i in [*range(len(ids)), len(ids)]:
        mk = marker_kinds.get(ids[i]) if i < len(ids) else None
        if mk is None and i < len(ids):
            continue
        if i > start:
            out.kinds.append(TEXT)
            out.texts.append("")
            out.offsets.append(start)
            runs.append(list(ids[start:i]))
            at.append(len(out.texts) - 1)
        if mk is not None:
            out.kinds.append(mk[0])
            out.texts.append(mk[1])
            out.offsets.append(i)
        start = i + 1
    for j, decoded in zip(at, decode_batch(runs) if runs else []):
        out.texts[j] = decoded
    return out


class _Open:
    __slots__ = ("attrs", "children", "offset", "tag")

    def __init__(self, tag: str, attrs: tuple[tuple[str, str], ...], offset: int) -> None:
        self.tag = tag
        self.attrs = attrs
        self.children: list[Node] = []
        self.offset = offset


def _path(stack: list[_Open]) -> str:
    return "/".join(o.tag for o in stack)


def build(
    lx: Lexemes,
    *,
    lenient: bool = False,
    line_of: Callable[[int], tuple[int, int]] | None = None,
    max_depth: int = MAX_DEPTH,
) -> Document:
    """Run the document grammar over lexemes and build the tree.

    Strict mode raises :class:`ParseError` at the first token the grammar does
    not allow. Lenient mode never raises; every repair becomes a
    :class:`Diagnostic` (see spec.md, "Recovery").
    """
    kinds, texts, offsets = lx.kinds, lx.texts, lx.offsets
    n = len(kinds)
    top: list[Node] = []
    stack: list[_Open] = []
    diags: list[Diagnostic] = []
    need_end = False

    def fail(i: int, msg: str, kind: str) -> None:
        off = offsets[i] if i < n else lx.end
        if not lenient:
            if line_of is not None:
                line, col = line_of(off)
                raise ParseError(msg, offset=off, line=line, column=col, path=_path(stack))
            raise ParseError(msg, offset=off, path=_path(stack))
        diags.append(Diagnostic(kind, off, msg))

    def found(i: int) -> str:
        if i >= n:
            return "end of input"
        if kinds[i] == TEXT:
            snippet = texts[i] if len(texts[i]) <= 40 else texts[i][:37] + "..."
            return f"text {snippet!r}"
        return f"{_LABEL[kinds[i]]} {texts[i]!r}"

    def attach(node: Node) -> None:
        if stack:
            stack[-1].children.append(node)
        else:
            top.append(node)

    i = 0
    while i < n:
        k = kinds[i]
        if need_end and k != END:
            fail(i, f"expected the end-of-message marker after a top-level element, found {found(i)}",
                 "missing-end")
            need_end = False
        if k == OPEN or k == CLOSE:
            if i + 1 >= n or (kinds[i + 1] == TEXT and i + 2 >= n):
                # Input ends inside the tag.
                fail(i, f"the tag starting here is cut off ({found(i + 1)})", "truncated")
                i = n
                break
            if kinds[i + 1] != TEXT:
                fail(i + 1, f"expected a tag name after the {_LABEL[k]}, found {found(i + 1)}",
                     "bad-tag")
                i += 1
                continue
            if kinds[i + 2] != SEP:
                fail(i + 2, f"expected the separator marker after the tag, found {found(i + 2)}",
                     "bad-tag")
                i += 2
                continue
            htext = texts[i + 1]
            hdr = parse_header(htext)
            if hdr is None:
                fail(i + 1, f"malformed tag header {htext!r}", "bad-header")
                hdr = salvage_header(htext)
                if not hdr[0]:
                    i += 3
                    continue
            tag, attrs = hdr
            if len(attrs) > MAX_ATTRIBUTES:
                fail(i + 1, f"a tag with {len(attrs)} attributes (at most {MAX_ATTRIBUTES})", "too-many-attributes")
                attrs = attrs[:MAX_ATTRIBUTES]
            if k == OPEN:
                if len(stack) >= max_depth:
                    # Even lenient parses refuse this: depth is a resource limit.
                    raise ParseError(
                        f"elements nested deeper than {max_depth}", offset=offsets[i], path=_path(stack)
                    )
                stack.append(_Open(tag, attrs, offsets[i]))
            else:
                if attrs:
                    fail(i + 1, f"a close tag carries no attributes, found {htext!r}", "bad-header")
                if not stack:
                    fail(i, f"close tag {tag!r} has no open element", "stray-close")
                elif stack[-1].tag != tag:
                    depth = next((d for d in range(len(stack) - 1, -1, -1) if stack[d].tag == tag), -1)
                    fail(i, f"close tag {tag!r} does not match open element {stack[-1].tag!r}",
                         "mismatched-close")
                    if depth >= 0:
                        while len(stack) > depth + 1:
                            o = stack.pop()
                            diags.append(Diagnostic("unclosed", o.offset,
                                                    f"element {o.tag!r} was never closed"))
                            attach(Element(o.tag, o.attrs, tuple(o.children), closed=False, offset=o.offset))
                        o = stack.pop()
                        attach(Element(o.tag, o.attrs, tuple(o.children), offset=o.offset))
                        need_end = not stack
                else:
                    o = stack.pop()
                    attach(Element(o.tag, o.attrs, tuple(o.children), offset=o.offset))
                    need_end = not stack
            i += 3
            continue
        if k == END:
            if stack:
                fail(i, f"end-of-message marker inside element {stack[-1].tag!r}", "early-end")
                while stack:
                    o = stack.pop()
                    diags.append(Diagnostic("unclosed", o.offset, f"element {o.tag!r} was never closed"))
                    attach(Element(o.tag, o.attrs, tuple(o.children), closed=False, offset=o.offset))
                top.append(EndOfMessage())
            elif not need_end:
                fail(i, "end-of-message marker with no message before it", "stray-end")
            else:
                top.append(EndOfMessage())
                need_end = False
            i += 1
            continue
        if k == TEXT:
            if not stack:
                fail(i, f"text outside any element: {found(i)}", "stray-text")
                top.append(Text(texts[i]))
            else:
                stack[-1].children.append(Text(texts[i]))
            i += 1
            continue
        if k == EMBED_MARK:
            if not stack:
                fail(i, f"embed outside any element: {found(i)}", "stray-text")
            attach(Embed(texts[i]))
            i += 1
            continue
        if k == EMBED_BEGIN:
            if not stack:
                fail(i, f"embed outside any element: {found(i)}", "stray-text")
            parts = [texts[i]]
            j = i + 1
            while j < n and kinds[j] in (TEXT, EMBED_INNER):
                parts.append(texts[j])
                j += 1
            if j < n and kinds[j] == EMBED_END:
                parts.append(texts[j])
                j += 1
            else:
                fail(j, f"embed not closed by an embed-end marker, found {found(j)}", "unterminated-embed")
            attach(Embed("".join(parts)))
            i = j
            continue
        # SEP, EMBED_INNER or EMBED_END where none may stand.
        fail(i, f"unexpected {found(i)}", "stray-marker")
        if lenient and stack:
            stack[-1].children.append(Text(texts[i]))
        i += 1

    if need_end:
        fail(n, "expected the end-of-message marker, found end of input", "missing-end")
    if stack:
        # A trailing chain of empty open tags is the generation prompt.
        tail = all(not o.children for o in stack[:-1]) and not stack[-1].children
        if not tail:
            fail(n, f"element {stack[-1].tag!r} is not closed at end of input", "truncated")
        node: Element | None = None
        while stack:
            o = stack.pop()
            children = tuple(o.children) + ((node,) if node is not None else ())
            node = Element(o.tag, o.attrs, children, closed=False, offset=o.offset)
        assert node is not None
        top.append(node)
    return Document(tuple(top), tuple(diags))


def line_col(text: str) -> Callable[[int], tuple[int, int]]:
    """A function from character offset to 1-based (line, column) in ``text``."""

    def at(off: int) -> tuple[int, int]:
        line = text.count("\n", 0, off) + 1
        col = off - (text.rfind("\n", 0, off) + 1) + 1
        return line, col

    return at


class _Bail(Exception):
    """The fast path met something only the general driver handles."""


_tag_patterns: dict[tuple[int, ...], re.Pattern[str]] = {}


def _tag_pattern(marker_kinds: dict[int, tuple[str, str]]) -> re.Pattern[str] | None:
    """Over ids-as-characters: a whole open tag (group 1 = header), a whole
    close tag (group 2), the end marker, or any other marker (group 3)."""
    by_kind: dict[str, list[int]] = {}
    for i, (kind, _) in marker_kinds.items():
        by_kind.setdefault(kind, []).append(i)
    if any(len(by_kind.get(k, ())) != 1 for k in (OPEN, CLOSE, SEP, END)) or max(marker_kinds) > 0x10FFFF:
        return None
    o, c, s, e = (re.escape(chr(by_kind[k][0])) for k in (OPEN, CLOSE, SEP, END))
    key = tuple(sorted(marker_kinds))
    pat = _tag_patterns.get(key)
    if pat is None:
        every = "".join(re.escape(chr(i)) for i in key)
        pat = re.compile(f"{o}([^{every}]*){s}|{c}([^{every}]*){s}|{e}|([{every}])")
        _tag_patterns[key] = pat
    return pat


def build_ids_fast(
    ids: Sequence[int],
    marker_kinds: dict[int, tuple[str, str]],
    decode_batch: Callable[[list[Sequence[int]]], list[str]],
    header_cache: dict[str, tuple[str, tuple[tuple[str, str], ...]]],
    max_depth: int = MAX_DEPTH,
) -> Document | None:
    """The tree of well-formed ids in one pass, or None.

    A fast path for the common case: whole tags are matched by one regular
    expression and their headers come from a cache keyed by their ids, so
    tags are neither decoded nor re-parsed. On anything unusual (an error, an
    embed span) it returns None and the caller runs the general lexer and
    driver, which report errors and repairs. Tests check the two agree.
    """
    pat = _tag_pattern(marker_kinds)
    if pat is None or not ids:
        return None
    as_text = ids_as_text(ids)
    if as_text is None:
        return None
    try:
        return _fast(ids, as_text, pat, marker_kinds, decode_batch, header_cache, max_depth)
    except _Bail:
        return None


def _fast(
    ids: Sequence[int],
    as_text: str,
    pat: re.Pattern[str],
    marker_kinds: dict[int, tuple[str, str]],
    decode_batch: Callable[[list[Sequence[int]]], list[str]],
    cache: dict[str, tuple[str, tuple[tuple[str, str], ...]]],
    max_depth: int,
) -> Document:
    top: list[Node] = []
    stack: list[_Open] = []
    runs: list[Sequence[int]] = []
    holes: list[Text] = []
    need_end = False
    pos = 0
    end = EndOfMessage()
    for m in pat.finditer(as_text):
        a = m.start()
        if a > pos:
            if not stack:
                raise _Bail
            t = Text("")
            stack[-1].children.append(t)
            holes.append(t)
            runs.append(ids[pos:a])
        g = m.lastindex
        if g == 1 or g == 2:
            key = m.group(g)
            hdr = cache.get(key)
            if hdr is None:
                b, e = m.span(g)
                parsed = parse_header(decode_batch([ids[b:e]])[0]) if e > b else None
                if parsed is None or len(parsed[1]) > MAX_ATTRIBUTES:
                    raise _Bail
                hdr = parsed
                if len(key) <= CACHEABLE:
                    cache[key] = parsed
            if g == 1:
                if need_end or len(stack) >= max_depth:
                    raise _Bail
                stack.append(_Open(hdr[0], hdr[1], a))
            else:
                if hdr[1] or not stack or stack[-1].tag != hdr[0]:
                    raise _Bail
                o = stack.pop()
                el = Element(o.tag, o.attrs, tuple(o.children), offset=o.offset)
                if stack:
                    stack[-1].children.append(el)
                else:
                    top.append(el)
                    need_end = True
        elif g is None:
            if stack or not need_end:
                raise _Bail
            top.append(end)
            need_end = False
        else:
            kind, marker = marker_kinds[ids[a]]
            if kind != EMBED_MARK or not stack:
                raise _Bail
            stack[-1].children.append(Embed(marker))
        pos = m.end()
    if pos < len(ids):
        if not stack:
            raise _Bail
        t = Text("")
        stack[-1].children.append(t)
        holes.append(t)
        runs.append(ids[pos:])
    if need_end:
        raise _Bail
    if stack:
        if any(o.children for o in stack):
            raise _Bail
        node: Element | None = None
        while stack:
            o = stack.pop()
            node = Element(o.tag, o.attrs, (node,) if node is not None else (), closed=False, offset=o.offset)
        assert node is not None
        top.append(node)
    if runs:
        for t, s in zip(holes, decode_batch(runs)):
            t.text = s
    return Document(tuple(top))
