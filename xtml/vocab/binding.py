"""A vocabulary bound to a template's markers: markup → ids and ids → markup.

:class:`Binding` checks that every marker is exactly one special id, encodes
trees and segments (markers as their ids, all text as ordinary text), and
lexes ids back into markup. :class:`IdSink` takes markup events and gives ids.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..errors import ParseError, TokenizerError, shown
from ..lru import Lru
from ..markup.collector import collector_paused
from ..markup.header import CACHEABLE
from ..markup.markers import CLOSE, EMBED_MARK, OPEN, TEXT, Markers
from ..markup.nodes import Document, Element, Embed, EndOfMessage, Node, Text
from ..markup.parse import Lexemes, build, build_ids_fast, ids_as_text, lex_ids
from ..markup.segments import Segment, close_tag, open_tag
from .vocabulary import Vocabulary

__all__ = ["Binding", "IdSink", "TreeMarks", "bound", "join_ids"]

# Constant pieces (headers, template prose) are cached per binding; the cap
# keeps a long-running server's memory bounded whatever its traffic.
_CACHE_LIMIT = 65536

# Characters of body text a sink gathers before it hands them to the encoding
# thread, where that gains time (see Vocabulary.overlaps and ids_later):
# several milliseconds of tokenizer work, against tens of microseconds for
# the handoff. A chat-sized request never reaches it and is encoded in one
# batch.
_HANDOFF = 1 << 15


@dataclass(slots=True)
class TreeMarks:
    """Where a walk of a tree put each element (see :meth:`Binding.chunks`)."""

    elements: list[Element] = field(default_factory=list)
    """The elements, in document order."""
    records: list[list[int]] = field(default_factory=list)
    """Per element: its parent's index (-1 at the top), its depth, and the
    piece indexes of its open tag, its close tag and the piece after it."""
    end_chunks: list[int] = field(default_factory=list)
    """The piece index of each end marker."""


class Binding:
    """A vocabulary bound to a template's markers.

    Every marker must be exactly one special id of the vocabulary (optional
    markers may instead be spelled as text, as some vocabularies do).
    """

    def __init__(self, markers: Markers, vocab: Vocabulary) -> None:
        self.markers = markers
        self.vocab = vocab
        self.marker_ids: dict[str, int] = {}
        problems: list[str] = []
        for s in markers.kinds():
            sid = vocab.special_id(s)
            if sid is None:
                if s in markers.optional:
                    continue
                added = vocab.added_id(s)
                if added is not None:
                    problems.append(f"{s!r} is an added token but not a special one")
                else:
                    problems.append(f"{s!r} is not a special token")
                continue
            self.marker_ids[s] = sid
        if problems:
            raise TokenizerError(
                f"tokenizer {vocab.source!r} does not fit the template's markers: "
                + "; ".join(problems)
                + " (to fine-tune a base model on XTML, add them with --add-markers / add_special_tokens=)"
            )
        kinds = markers.kinds()
        self.kind_of_id: dict[int, tuple[str, str]] = {i: (kinds[s], s) for s, i in self.marker_ids.items()}
        # Optional markers spelled as text are found in decoded text instead.
        self.text_marks = tuple(s for s in markers.embed_mark if s not in self.marker_ids)
        self.stop_ids = tuple(self.marker_ids[s] for s in markers.stop if s in self.marker_ids)
        self._splitter = markers.splitter()
        self._piece: dict[str, list[int]] = {}
        self._open: dict[tuple[str, tuple[tuple[str, str], ...]], list[int]] = {}
        self._close: dict[str, list[int]] = {}
        self._stable: dict[str, list[int]] = {}
        self._headers: dict[str, str] = {}
        self._tags: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}
        self._beyond_pat: re.Pattern[str] | None = None
        self._text_table: list[bytes | None] | None = None
        self._text_strs: list[str | None] | None = None
        self.derived: dict[Any, Any] = {}
        """What other modules make from this binding (a stream's prompt
        lexemes, a grammar's tables), each under the key of the code that
        makes it: it goes when the binding does."""

    # -- segments → ids ------------------------------------------------------

    def encode_segments(self, segments: Iterable[Segment]) -> list[int]:
        """Ids of segments: each segment encoded on its own, concatenated."""
        out: list[int] = []
        for seg in segments:
            out.extend(self._segment_ids(seg))
        return out

    def _segment_ids(self, seg: Segment) -> list[int]:
        if not seg.special:
            return self.vocab.ids_of([seg.text])[0] if seg.text else []
        # A special segment is markers and the text between them (an image
        # prompt, say). Its text is trusted template output, never user text.
        out: list[int] = []
        pos = 0
        for m in self._splitter.finditer(seg.text):
            if m.start() > pos:
                out.extend(self.vocab.ids_of([seg.text[pos : m.start()]])[0])
            mid = self.marker_ids.get(m.group())
            out.extend([mid] if mid is not None else self.vocab.ids_of([m.group()])[0])
            pos = m.end()
        if pos < len(seg.text):
            out.extend(self.vocab.ids_of([seg.text[pos:]])[0])
        return out

    def _pieces(self, segments: list[Segment]) -> list[int]:
        out: list[int] = []
        for seg in segments:
            if seg.special:
                out.extend(self._segment_ids(seg))
                continue
            ids = self._piece.get(seg.text)
            if ids is None:
                ids = self.vocab.ids_of([seg.text])[0]
                if len(self._piece) < _CACHE_LIMIT and len(seg.text) <= CACHEABLE:
                    self._piece[seg.text] = ids
            out.extend(ids)
        return out

    # -- tree → ids ----------------------------------------------------------

    def encode(self, doc: Document | Sequence[Node]) -> list[int]:
        """Ids of a markup tree. Equal to ``encode_segments(to_segments(doc))``,
        but constant pieces come from caches and all body text is encoded in
        one batch."""
        return join_ids(self.chunks(doc))

    def chunks(self, doc: Document | Sequence[Node], marks: TreeMarks | None = None) -> list[list[int]]:
        """The ids of a tree as a list of pieces (a tag, a body, a marker),
        in document order; with ``marks``, also where each element's tags
        and each end marker fall among the pieces. The one walk of a tree
        into ids: :meth:`encode` joins the pieces, spans sum their lengths."""
        chunks: list[list[int]] = []
        texts: list[str] = []
        slots: list[int] = []
        nodes = doc.nodes if isinstance(doc, Document) else doc
        self._walk(nodes, chunks, texts, slots, marks, -1, 0)
        if texts:
            for slot, ids in zip(slots, self.vocab.ids_of(texts)):
                chunks[slot] = ids
        return chunks

    def attributed(self, doc: Document | Sequence[Node]) -> list[tuple[list[int], int, tuple[str, ...]]]:
        """The pieces of :meth:`chunks`, each with its message (the index of
        the top-level element it is in, or follows) and its element path
        (tags from the message down to the innermost element holding it):
        each token attributed, as ``xtml inspect`` and the playground show
        them."""
        marks = TreeMarks()
        chunks = self.chunks(doc, marks)
        owner = [-1] * len(chunks)
        paths: list[tuple[str, ...]] = []
        tops: list[int] = []
        message = -1
        # Elements come in document order, so an inner one's pieces are
        # claimed after its parent's.
        for k, (el, rec) in enumerate(zip(marks.elements, marks.records, strict=True)):
            parent, _, first, _, after = rec
            if parent < 0:
                message += 1
                paths.append((el.tag,))
                tops.append(message)
            else:
                paths.append((*paths[parent], el.tag))
                tops.append(tops[parent])
            for p in range(first, after):
                owner[p] = k
        out: list[tuple[list[int], int, tuple[str, ...]]] = []
        last = 0
        for p, ids in enumerate(chunks):
            k = owner[p]
            if k >= 0:
                last = tops[k]
                out.append((ids, last, paths[k]))
            else:
                out.append((ids, last, ()))
        return out

    def _walk(self, nodes: Sequence[Node], chunks: list[list[int]], texts: list[str], slots: list[int],
              marks: TreeMarks | None, parent: int, depth: int) -> None:
        for node in nodes:
            if type(node) is Text:
                if not node.text:
                    continue
                if node.stable:
                    chunks.append(self._stable_ids(node.text))
                else:
                    # Filled after the walk: all body text in one batch.
                    slots.append(len(chunks))
                    chunks.append([])
                    texts.append(node.text)
            elif type(node) is Element:
                rec: list[int] | None = None
                me = parent
                if marks is not None:
                    rec = [parent, depth, len(chunks), 0, 0]
                    me = len(marks.records)
                    marks.elements.append(node)
                    marks.records.append(rec)
                chunks.append(self._open_ids(node.tag, node.attrs))
                if node.children:
                    self._walk(node.children, chunks, texts, slots, marks, me, depth + 1)
                if rec is not None:
                    rec[3] = len(chunks)
                if node.closed:
                    chunks.append(self._close_ids(node.tag))
                if rec is not None:
                    rec[4] = len(chunks)
            elif type(node) is EndOfMessage:
                if marks is not None:
                    marks.end_chunks.append(len(chunks))
                chunks.append([self.marker_ids[self.markers.end]])
            elif type(node) is Embed:
                chunks.append(self._segment_ids(Segment(node.raw, True)))
            else:
                raise TypeError(f"not a markup node: {type(node).__name__}")

    def sink(self) -> IdSink:
        """A markup sink that writes ids directly (see
        :mod:`xtml.markup.sink`): what :meth:`encode` gives for the tree the
        same events would build, without building it."""
        return IdSink(self)

    def _open_ids(self, tag: str, attrs: tuple[tuple[str, str], ...]) -> list[int]:
        key = (tag, attrs)
        ids = self._open.get(key)
        if ids is None:
            ids = self._pieces(open_tag(Element(tag, attrs), self.markers))
            if len(self._open) < _CACHE_LIMIT and sum(len(k) + len(v) for k, v in attrs) <= CACHEABLE:
                self._open[key] = ids
        return ids

    def _close_ids(self, tag: str) -> list[int]:
        ids = self._close.get(tag)
        if ids is None:
            ids = self._close[tag] = self._pieces(close_tag(tag, self.markers))
        return ids

    def _stable_ids(self, text: str) -> list[int]:
        ids = self._stable.get(text)
        if ids is None:
            ids = self.vocab.ids_of([text])[0]
            if len(self._stable) < 1024:
                self._stable[text] = ids
        return ids

    def text_table(self) -> list[bytes | None]:
        """The bytes of every id of ordinary text, None for the marker ids
        (empty if the vocabulary has no byte table): one lookup tells a
        streamed token's text from a marker. Built once per binding."""
        table = self._text_table
        if table is None:
            table = list(self.vocab.byte_table())
            if table:
                for i in self.kind_of_id:
                    table[i] = None
            self._text_table = table
        return table

    def text_strs(self) -> list[str | None]:
        """The text of every id of ordinary text whose bytes are whole
        UTF-8 on their own (no replacement character in it), None for the
        rest: the marker ids, the ids of part of a character, the empty
        ones. A streamed token found here needs no decoding. Built once per
        binding."""
        strs = self._text_strs
        if strs is None:
            strs = []
            add = strs.append
            for b in self.text_table():
                try:
                    s = b.decode() if b else None
                except UnicodeDecodeError:
                    s = None
                add(s if s is None or "\ufffd" not in s else None)
            self._text_strs = strs
        return strs

    # -- ids → lexemes -------------------------------------------------------

    def _check_ids(self, ids: Sequence[int]) -> None:
        if ids:
            try:
                ok = max(ids) < self.vocab.size and min(ids) >= 0
            except TypeError:
                ok = False
            if not ok:
                self._bad_id(ids)

    def lex(self, ids: Sequence[int]) -> Lexemes:
        """Lexemes of token ids: marker ids become terminals, runs of
        ordinary ids TEXT (decoded; header runs through a cache)."""
        self._check_ids(ids)
        return self._lex(ids)

    def _lex(self, ids: Sequence[int]) -> Lexemes:
        if len(self._headers) > _CACHE_LIMIT:
            self._headers.clear()
        try:
            lx = lex_ids(ids, self.kind_of_id, self.vocab.decode_batch, self._headers)
        except (TypeError, ValueError, OverflowError):
            self._bad_id(ids)
        if self.text_marks:
            lx = split_text_marks(lx, self.text_marks)
        return lx

    def document(self, ids: Sequence[int], *, lenient: bool = False) -> Document:
        """The markup tree of token ids: the one-pass fast path for
        well-formed input, else the general lexer and driver."""
        # The ids as characters serve the range check (a regular expression
        # over them is several times faster than max() and min() over the
        # ints) and then the fast path.
        as_text = ids_as_text(ids) if ids else None
        if as_text is None or self._beyond(as_text):
            self._check_ids(ids)
        try:
            doc = self._one_pass(ids, as_text)
        except (TypeError, ValueError, OverflowError):
            self._bad_id(ids)
        if doc is not None and not self.text_marks:
            return doc
        with collector_paused():
            return build(self._lex(ids), lenient=lenient)  # ids were checked above

    def well_formed(self, ids: Sequence[int]) -> Document | None:
        """The markup tree of ids, or None unless they are well-formed and
        in range (the one-pass fast path alone; the caller then runs the
        general lexer, which reports and repairs)."""
        as_text = ids_as_text(ids) if ids else None
        if as_text is None or self._beyond(as_text) or self.text_marks:
            return None
        return self._one_pass(ids, as_text)

    def _one_pass(self, ids: Sequence[int], as_text: str | None) -> Document | None:
        if len(self._tags) > _CACHE_LIMIT:
            self._tags.clear()
        with collector_paused():
            return build_ids_fast(ids, self.kind_of_id, self.vocab.decode_runs, self._tags, as_text=as_text)

    def end_after_close(self, ids: Sequence[int], tag: str) -> int | None:
        """The end marker's id when ``ids`` end with the close tag of ``tag``
        as the template writes it (a completion whose stop token the engine
        stripped), else None."""
        close = self._close_ids(tag)
        return self.marker_ids[self.markers.end] if ids[-len(close):] == close else None

    def _beyond(self, as_text: str) -> bool:
        """Whether ids given as characters (:func:`ids_as_text`) hold one
        past the vocabulary."""
        pat = self._beyond_pat
        if pat is None:
            size = self.vocab.size
            pat = self._beyond_pat = re.compile(f"[^\\x00-{re.escape(chr(size - 1))}]" if 0 < size <= 0x110000
                                                else "(?!)" if size > 0x110000 else "(?s:.)")
        return pat.search(as_text) is not None

    def _bad_id(self, ids: Sequence[int]) -> NoReturn:
        for i, t in enumerate(ids):
            if type(t) is not int or not 0 <= t < self.vocab.size:
                raise ParseError(f"{shown(t)} is not a token id of this tokenizer", offset=i)
        raise ParseError("token ids could not be decoded", offset=0)


def bound(markers: Markers, vocab: Vocabulary) -> Binding:
    """The binding of ``markers`` to ``vocab``: made once, and kept on the
    vocabulary (see :attr:`Vocabulary.derived`), so that templates with the
    same markers share it and it goes when the vocabulary goes. A vocabulary
    keeps the bindings of the last few sets of markers it was bound to
    (templates pasted into a server may each bring their own)."""
    table: Lru[Markers, Binding] | None = vocab.derived.get(Binding)
    if table is None:
        table = vocab.derived.setdefault(Binding, Lru())
    found = table.get(markers)
    return found if found is not None else table.put(markers, Binding(markers, vocab))


def split_text_marks(lx: Lexemes, marks: tuple[str, ...]) -> Lexemes:
    """Where a vocabulary spells a placeholder as ordinary text, find it in
    decoded body text, as the model's own processor does."""
    out = Lexemes(end=lx.end)
    for k, t, o in zip(lx.kinds, lx.texts, lx.offsets):
        header = bool(out.kinds) and out.kinds[-1] in (OPEN, CLOSE)
        if k != TEXT or header or not any(m in t for m in marks):
            out.kinds.append(k)
            out.texts.append(t)
            out.offsets.append(o)
            continue
        pos = 0
        while pos < len(t):
            hits = [(t.find(m, pos), m) for m in marks if t.find(m, pos) >= 0]
            if not hits:
                break
            at, m = min(hits)
            if at > pos:
                out.kinds.append(TEXT)
                out.texts.append(t[pos:at])
                out.offsets.append(o)
            out.kinds.append(EMBED_MARK)
            out.texts.append(m)
            out.offsets.append(o)
            pos = at + len(m)
        if pos < len(t):
            out.kinds.append(TEXT)
            out.texts.append(t[pos:])
            out.offsets.append(o)
    return out



class IdSink:
    """Markup events → ids, with the binding's caches (see :meth:`Binding.sink`)."""

    __slots__ = ("_b", "_chars", "_chunks", "_close", "_end", "_later", "_limit", "_open", "_slots", "_tags",
                 "_texts")

    def __init__(self, binding: Binding) -> None:
        self._b = binding
        self._chunks: list[list[int]] = []
        self._texts: list[str] = []
        self._slots: list[int] = []
        self._tags: list[str] = []
        # Characters of body text waiting in _texts; past the limit (_HANDOFF
        # where handing off gains time, else never) they go to the encoding
        # thread, and the rest of the request renders meanwhile.
        self._chars = 0
        self._limit = _HANDOFF if binding.vocab.overlaps() else sys.maxsize
        self._later: list[tuple[list[int], Callable[[], list[list[int]]]]] = []
        self._end = [binding.marker_ids[binding.markers.end]]
        # Bound lookups of the binding's caches: render emits thousands of
        # events per request, and these are the hot ones.
        self._open = binding._open.get
        self._close = binding._close.get

    def open(self, tag: str, attrs: tuple[tuple[str, str], ...] = ()) -> None:
        ids = self._open((tag, attrs))
        self._chunks.append(ids if ids is not None else self._b._open_ids(tag, attrs))
        self._tags.append(tag)

    def close(self) -> None:
        tag = self._tags.pop()
        ids = self._close(tag)
        self._chunks.append(ids if ids is not None else self._b._close_ids(tag))

    def text(self, text: str, stable: bool = False) -> None:
        if not text:
            return
        if stable:
            self._chunks.append(self._b._stable_ids(text))
        else:
            self._slots.append(len(self._chunks))
            self._chunks.append(_NO_IDS)
            self._texts.append(text)
            self._chars += len(text)
            if self._chars > self._limit:
                self._hand_off()

    def element(self, tag: str, attrs: tuple[tuple[str, str], ...], text: str, stable: bool = False) -> None:
        chunks = self._chunks
        ids = self._open((tag, attrs))
        chunks.append(ids if ids is not None else self._b._open_ids(tag, attrs))
        if text:
            if stable:
                chunks.append(self._b._stable_ids(text))
            else:
                self._slots.append(len(chunks))
                chunks.append(_NO_IDS)
                self._texts.append(text)
                self._chars += len(text)
                if self._chars > self._limit:
                    self._hand_off()
        ids = self._close(tag)
        chunks.append(ids if ids is not None else self._b._close_ids(tag))

    def embed(self, raw: str) -> None:
        if raw:
            self._chunks.append(self._b._segment_ids(Segment(raw, True)))

    def end(self) -> None:
        self._chunks.append(self._end)

    def _hand_off(self) -> None:
        """Send the waiting texts to the encoding thread."""
        self._later.append((self._slots, self._b.vocab.ids_later(self._texts)))
        self._slots = []
        self._texts = []
        self._chars = 0

    def _fill(self) -> list[list[int]]:
        """The chunks of ids, body text encoded in one batch (a long request's
        in several, on the encoding thread while it was rendered)."""
        chunks = self._chunks
        if self._texts:
            for slot, ids in zip(self._slots, self._b.vocab.ids_of(self._texts)):
                chunks[slot] = ids
            self._slots = []
            self._texts = []
            self._chars = 0
        if self._later:
            for slots, result in self._later:
                for slot, ids in zip(slots, result()):
                    chunks[slot] = ids
            self._later = []
        return chunks

    def finish(self) -> list[int]:
        """The ids: body text encoded in one batch, then everything joined."""
        return join_ids(self._fill())


def join_ids(chunks: list[list[int]]) -> list[int]:
    # list.extend copies a list in C; chain.from_iterable would go id by id
    # through the iterator protocol, about three times slower here.
    out: list[int] = []
    extend = out.extend
    for c in chunks:
        extend(c)
    return out


# A slot's placeholder until its text is encoded; never mutated.
_NO_IDS: list[int] = []
