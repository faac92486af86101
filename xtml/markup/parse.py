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
what it repaired. :mod:`xtml.markup.reference` runs the grammar itself.
"""

from __future__ import annotations

import re
import sys
from array import array
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass, field

from ..errors import ParseError, shown
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

# Quoted input in an error message or diagnostic is cut to this many
# characters: a multi-megabyte header must not become a multi-megabyte message.
QUOTE_LIMIT = 60


def excerpt(value: object, limit: int = QUOTE_LIMIT) -> str:
    """:func:`~xtml.errors.shown` at the length markup errors quote."""
    return shown(value, limit)


def check_size(data: object, limit: int | None) -> None:
    """Refuse a parse input longer than ``limit`` (characters of text, or
    token ids) before any work is done on it."""
    if limit is None or not isinstance(data, Sized):
        return
    n = len(data)
    if n <= limit:
        return
    msg = f"the input is {n:,} {'characters' if isinstance(data, str) else 'token ids'} long, more than " \
          f"max_chars={limit:,}"
    raise ParseError(msg, offset=limit, source=data if isinstance(data, str) else None)


LEXEME_LABEL = {
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
    # Tags are input: each is cut, and a deep path keeps its innermost end,
    # so that an error about a megabyte-long tag is still one short line.
    tags = [o.tag if len(o.tag) <= 24 else o.tag[:24] + "…" for o in stack[-6:]]
    return ("…/" if len(stack) > 6 else "") + "/".join(tags)


def build(
    lx: Lexemes,
    *,
    lenient: bool = False,
    source: str | None = None,
    max_depth: int = MAX_DEPTH,
) -> Document:
    """Run the document grammar over lexemes and build the tree.

    Strict mode raises :class:`ParseError` at the first token the grammar does
    not allow (with its line and column when ``source``, the text lexed, is
    given). Lenient mode never raises; every repair becomes a
    :class:`Diagnostic` (see spec.md, "Recovery").
    """
    b = TreeBuilder(lenient=lenient, max_depth=max_depth)
    b.lexemes = lx
    return b.finish(source)


class TreeBuilder:
    """:func:`build` fed lexemes as they come, for parsing a stream.

    Append lexemes to :attr:`lexemes` and call :meth:`advance`: it consumes
    every lexeme it can decide on, and stops at a tag whose header or
    separator, or an embed whose end, has not come yet. :attr:`stack` holds
    the open elements (innermost last; each with ``tag``, ``attrs``,
    ``offset`` and the ``children`` attached so far) and :attr:`diagnostics`
    the repairs so far. :meth:`finish` reads the end of input and returns the
    tree, which is :func:`build`'s for the same lexemes: the driver is the
    same code.
    """

    __slots__ = ("_scan", "diagnostics", "lenient", "lexemes", "max_depth", "need_end", "next", "stack", "top")

    def __init__(self, *, lenient: bool = False, max_depth: int = MAX_DEPTH) -> None:
        self.lexemes = Lexemes()
        self.lenient = lenient
        self.max_depth = max_depth
        self.top: list[Node] = []
        self.stack: list[_Open] = []
        self.diagnostics: list[Diagnostic] = []
        self.need_end = False
        self.next = 0
        """Index of the first lexeme not consumed yet."""
        # How far the lexemes after a waiting embed-begin marker were
        # scanned: an embed fed piece by piece is scanned once, not again at
        # every advance.
        self._scan = 0

    def advance(self) -> None:
        """Consume what can be decided (strict mode raises at an error)."""
        _drive(self, None, final=False)

    def finish(self, source: str | None = None) -> Document:
        """The end of input (at ``lexemes.end``): the tree."""
        doc = _drive(self, source, final=True)
        assert doc is not None
        return doc

    def drop_consumed(self) -> None:
        """Forget the lexemes consumed so far (nothing looks back at them):
        a long stream keeps only what is still undecided."""
        if self.next:
            lx = self.lexemes
            del lx.kinds[: self.next], lx.texts[: self.next], lx.offsets[: self.next]
            self.next = 0
            self._scan = 0

    def _waits(self, i: int, n: int, k: str) -> bool:
        """Whether lexeme ``i`` needs lexemes after it that have not come."""
        kinds = self.lexemes.kinds
        if k == OPEN or k == CLOSE:
            return i + 1 >= n or (kinds[i + 1] == TEXT and i + 2 >= n)
        if k == EMBED_BEGIN:
            j = max(i + 1, self._scan)
            while j < n and kinds[j] in (TEXT, EMBED_INNER):
                j += 1
            self._scan = j
            return j >= n
        return False


def _drive(b: TreeBuilder, source: str | None, final: bool) -> Document | None:
    """The driver of :func:`build` and :class:`TreeBuilder`: consumes
    lexemes from ``b.next``; unless ``final``, stops where it must wait."""
    lx = b.lexemes
    lenient, max_depth = b.lenient, b.max_depth
    kinds, texts, offsets = lx.kinds, lx.texts, lx.offsets
    n = len(kinds)
    top = b.top
    stack = b.stack
    diags = b.diagnostics
    need_end = b.need_end

    def fail(i: int, msg: str, kind: str) -> None:
        off = offsets[i] if i < n else lx.end
        if not lenient:
            raise ParseError(msg, offset=off, source=source, path=_path(stack))
        diags.append(Diagnostic(kind, off, msg))

    def found(i: int) -> str:
        if i >= n:
            return "end of input"
        if kinds[i] == TEXT:
            return f"text {excerpt(texts[i], 40)}"
        return f"{LEXEME_LABEL[kinds[i]]} {excerpt(texts[i])}"

    def attach(node: Node) -> None:
        if stack:
            stack[-1].children.append(node)
        else:
            top.append(node)

    i = b.next
    while i < n:
        k = kinds[i]
        if not final and b._waits(i, n, k):
            break
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
                fail(i + 1, f"expected a tag name after the {LEXEME_LABEL[k]}, found {found(i + 1)}",
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
                fail(i + 1, f"malformed tag header {excerpt(htext)}", "bad-header")
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
                    fail(i + 1, f"a close tag carries no attributes, found {excerpt(htext)}", "bad-header")
                if not stack:
                    fail(i, f"close tag {excerpt(tag)} has no open element", "stray-close")
                elif stack[-1].tag != tag:
                    depth = next((d for d in range(len(stack) - 1, -1, -1) if stack[d].tag == tag), -1)
                    fail(i, f"close tag {excerpt(tag)} does not match open element {excerpt(stack[-1].tag)}",
                         "mismatched-close")
                    if depth >= 0:
                        while len(stack) > depth + 1:
                            o = stack.pop()
                            diags.append(Diagnostic("unclosed", o.offset,
                                                    f"element {excerpt(o.tag)} was never closed"))
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
                fail(i, f"end-of-message marker inside element {excerpt(stack[-1].tag)}", "early-end")
                while stack:
                    o = stack.pop()
                    diags.append(Diagnostic("unclosed", o.offset, f"element {excerpt(o.tag)} was never closed"))
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

    b.next = i
    b.need_end = need_end
    if not final:
        return None
    if need_end:
        fail(n, "expected the end-of-message marker, found end of input", "missing-end")
    if stack:
        # A trailing chain of empty open tags is the generation prompt.
        tail = all(not o.children for o in stack[:-1]) and not stack[-1].children
        if not tail:
            fail(n, f"element {excerpt(stack[-1].tag)} is not closed at end of input", "truncated")
        node: Element | None = None
        while stack:
            o = stack.pop()
            children = tuple(o.children) + ((node,) if node is not None else ())
            node = Element(o.tag, o.attrs, children, closed=False, offset=o.offset)
        assert node is not None
        top.append(node)
    return Document(tuple(top), tuple(diags))


class _Bail(Exception):
    """The fast path met something only the general driver handles."""


_tag_patterns: dict[tuple[tuple[int, str], ...], re.Pattern[str]] = {}


def _tag_pattern(marker_kinds: dict[int, tuple[str, str]]) -> re.Pattern[str] | None:
    """Over ids-as-characters, one of: a whole element that holds text only
    (groups 1, 2, 3: open header, body, close header), a whole open tag
    (group 4 = header), a whole close tag (group 5), the end marker (no
    group), or any other marker (group 6)."""
    # Callers pass the same table on every call (a binding's): by identity
    # first, which skips rebuilding the key, a tenth of a short parse. The
    # entry holds the table, so its id is not reused while cached.
    seen = _by_table.get(id(marker_kinds))
    if seen is not None and seen[0] is marker_kinds:
        return seen[1]
    pat = _build_tag_pattern(marker_kinds)
    if len(_by_table) < 256:
        _by_table[id(marker_kinds)] = (marker_kinds, pat)
    return pat


_by_table: dict[int, tuple[dict[int, tuple[str, str]], re.Pattern[str] | None]] = {}


def _build_tag_pattern(marker_kinds: dict[int, tuple[str, str]]) -> re.Pattern[str] | None:
    by_kind: dict[str, list[int]] = {}
    for i, (kind, _) in marker_kinds.items():
        by_kind.setdefault(kind, []).append(i)
    if any(len(by_kind.get(k, ())) != 1 for k in (OPEN, CLOSE, SEP, END)) or max(marker_kinds) > 0x10FFFF:
        return None
    key = tuple(sorted((i, k) for i, (k, _) in marker_kinds.items()))
    pat = _tag_patterns.get(key)
    if pat is None:
        o, c, s, e = (re.escape(chr(by_kind[k][0])) for k in (OPEN, CLOSE, SEP, END))
        every = _ranges([i for i, _ in key])
        run = f"([^{every}]*)"
        # Most elements hold text only (contents, channels, arguments): one
        # match for the three lexemes, one trip through the loop below.
        pat = re.compile(f"{o}{run}{s}{run}{c}{run}{s}|{o}{run}{s}|{c}{run}{s}|{e}|([{every}])")
        _tag_patterns[key] = pat
    return pat


def _ranges(ids: list[int]) -> str:
    """The inside of a character class of ``ids`` (sorted), consecutive ids
    as ranges: a vocabulary's markers are usually added in a row, and a
    range is one comparison per character where a list of characters is
    one per member."""
    out: list[str] = []
    k = 0
    while k < len(ids):
        j = k
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(re.escape(chr(ids[k])) if j == k else f"{re.escape(chr(ids[k]))}-{re.escape(chr(ids[j]))}")
        k = j + 1
    return "".join(out)


def build_ids_fast(
    ids: Sequence[int],
    marker_kinds: dict[int, tuple[str, str]],
    decode_batch: Callable[[list[Sequence[int]]], list[str]],
    header_cache: dict[str, tuple[str, tuple[tuple[str, str], ...]]],
    max_depth: int = MAX_DEPTH,
    as_text: str | None = None,
) -> Document | None:
    """The tree of well-formed ids in one pass, or None.

    A fast path for the common case: whole tags are matched by one regular
    expression and their headers come from a cache keyed by their ids, so
    tags are neither decoded nor re-parsed. On anything unusual (an error, an
    embed span) it returns None and the caller runs the general lexer and
    driver, which report errors and repairs. Tests check the two agree.
    ``as_text`` is :func:`ids_as_text` of ``ids`` when the caller has it.
    """
    pat = _tag_pattern(marker_kinds)
    if pat is None or not ids:
        return None
    if as_text is None:
        as_text = ids_as_text(ids)
        if as_text is None:
            return None
    try:
        return _fast(ids, as_text, pat, marker_kinds, decode_batch, header_cache, max_depth)
    except _Bail:
        return None


def _header(
    m: re.Match[str],
    g: int,
    ids: Sequence[int],
    decode_batch: Callable[[list[Sequence[int]]], list[str]],
    cache: dict[str, tuple[str, tuple[tuple[str, str], ...]]],
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The header of group ``g``, parsed (and cached) on a cache miss."""
    key = m.group(g)
    b, e = m.span(g)
    parsed = parse_header(decode_batch([ids[b:e]])[0]) if e > b else None
    if parsed is None or len(parsed[1]) > MAX_ATTRIBUTES:
        raise _Bail
    if len(key) <= CACHEABLE:
        cache[key] = parsed
    return parsed


def _fast(
    ids: Sequence[int],
    as_text: str,
    pat: re.Pattern[str],
    marker_kinds: dict[int, tuple[str, str]],
    decode_batch: Callable[[list[Sequence[int]]], list[str]],
    cache: dict[str, tuple[str, tuple[tuple[str, str], ...]]],
    max_depth: int,
) -> Document:
    # The loop runs once per element or tag of the input, so it keeps to
    # locals: the open elements are tuples (tag, attrs, children, offset),
    # ``kids`` is the children list of the innermost one, and body text is
    # decoded in one batch at the end (``holes`` wait for it).
    top: list[Node] = []
    stack: list[tuple[str, tuple[tuple[str, str], ...], list[Node], int]] = []
    kids: list[Node] | None = None
    runs: list[Sequence[int]] = []
    holes: list[Text] = []
    need_end = False
    pos = 0
    end = EndOfMessage()
    get = cache.get
    for m in pat.finditer(as_text):
        a = m.start()
        if a > pos:
            if kids is None:
                raise _Bail
            t = Text("")
            kids.append(t)
            holes.append(t)
            runs.append(ids[pos:a])
        g = m.lastindex
        if g == 3:
            # A whole element holding text only.
            hdr = get(m.group(1)) or _header(m, 1, ids, decode_batch, cache)
            close = get(m.group(3)) or _header(m, 3, ids, decode_batch, cache)
            if close[1] or close[0] != hdr[0] or len(stack) >= max_depth:
                raise _Bail
            b, e = m.span(2)
            if e > b:
                t = Text("")
                holes.append(t)
                runs.append(ids[b:e])
                el = Element(hdr[0], hdr[1], (t,), True, a)
            else:
                el = Element(hdr[0], hdr[1], (), True, a)
            if kids is not None:
                kids.append(el)
            elif need_end:
                raise _Bail
            else:
                top.append(el)
                need_end = True
        elif g == 4:
            hdr = get(m.group(4)) or _header(m, 4, ids, decode_batch, cache)
            if need_end or len(stack) >= max_depth:
                raise _Bail
            kids = []
            stack.append((hdr[0], hdr[1], kids, a))
        elif g == 5:
            hdr = get(m.group(5)) or _header(m, 5, ids, decode_batch, cache)
            if hdr[1] or not stack or stack[-1][0] != hdr[0]:
                raise _Bail
            tag, attrs, children, at = stack.pop()
            el = Element(tag, attrs, tuple(children), True, at)
            if stack:
                kids = stack[-1][2]
                kids.append(el)
            else:
                kids = None
                top.append(el)
                need_end = True
        elif g is None:
            if kids is not None or not need_end:
                raise _Bail
            top.append(end)
            need_end = False
        else:
            kind, marker = marker_kinds[ids[a]]
            if kind != EMBED_MARK or kids is None:
                raise _Bail
            kids.append(Embed(marker))
        pos = m.end()
    if pos < len(ids):
        if kids is None:
            raise _Bail
        t = Text("")
        kids.append(t)
        holes.append(t)
        runs.append(ids[pos:])
    if need_end:
        raise _Bail
    if stack:
        if any(children for _, _, children, _ in stack):
            raise _Bail
        node: Element | None = None
        while stack:
            tag, attrs, _, at = stack.pop()
            node = Element(tag, attrs, (node,) if node is not None else (), False, at)
        assert node is not None
        top.append(node)
    if runs:
        for t, s in zip(holes, decode_batch(runs)):
            t.text = s
    return Document(tuple(top))
