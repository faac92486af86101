"""Segments ↔ token ids for a concrete tokenizer.

:class:`Vocabulary` wraps a Hugging Face ``tokenizers.Tokenizer`` (loaded from
a ``tokenizer.json`` file or a model folder; never from the network), or a
``tiktoken.Encoding`` (:mod:`xtml.tiktoken_vocab`), and encodes ordinary text
so that it can never turn into a special id: literal ``<|open|>`` in user
text stays plain text. :class:`Binding` joins a
vocabulary to a template's markers, checks that every marker is exactly one
special id, and turns markup into ids and back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .errors import ParseError, TokenizerError
from .markup.header import CACHEABLE
from .markup.markers import CLOSE, EMBED_MARK, OPEN, TEXT, Markers
from .markup.nodes import Document, Element, Embed, EndOfMessage, Node, Text
from .markup.parse import Lexemes, build, build_ids_fast, lex_ids
from .markup.segments import Segment, close_tag, open_tag

__all__ = ["Binding", "Vocabulary", "load_tokenizer"]

# Constant pieces (headers, template prose) are cached per binding; the cap
# keeps a long-running server's memory bounded whatever its traffic.
_CACHE_LIMIT = 65536
# Texts up to this many characters have their ids cached by the vocabulary
# (at most _SHORT_LIMIT of them, a few MB).
SHORT_TEXT = 32
_SHORT_LIMIT = 16384


class Vocabulary:
    """A tokenizer, used injection-safely.

    ``encode_texts`` treats every string as ordinary text (special-token
    literals included); marker ids only ever come from :class:`Binding`.
    """

    def __init__(self, tokenizer: Any, source: str = "<tokenizer>", *, _copy: bool = True) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover - a declared dependency
            raise TokenizerError("the 'tokenizers' package is required") from e
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError("expected a tokenizers.Tokenizer; use xtml.load_tokenizer(path) for files")
        # A private copy: the flag below changes how the instance encodes, and
        # the caller's tokenizer must keep behaving as they set it up. (A
        # tokenizer made here for this vocabulary alone is not copied: a
        # large vocabulary takes seconds to copy.)
        self._tok = Tokenizer.from_str(tokenizer.to_str()) if _copy else tokenizer
        self._tok.encode_special_tokens = True
        # Text is encoded piece by piece and the pieces joined, so a saved
        # tokenizer's truncation or padding would cut or pad every piece. Its
        # post-processor only adds special tokens, which are never asked for
        # here, and moves offsets, which are not used: dropping it leaves the
        # ids as they are and saves a pass over every encoding.
        self._tok.no_truncation()
        self._tok.no_padding()
        self._tok.post_processor = None
        self.source = source
        self._size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self._bytes: list[bytes] | None = None
        self._short: dict[str, list[int]] = {}
        self._added = {
            t.content: (i, bool(t.special)) for i, t in self._tok.get_added_tokens_decoder().items()
        }

    @property
    def size(self) -> int:
        """Number of ids, added tokens included."""
        return self._size

    def special_id(self, text: str) -> int | None:
        """The id of the special token spelled ``text``, if there is one."""
        hit = self._added.get(text)
        return hit[0] if hit is not None and hit[1] else None

    def added_id(self, text: str) -> tuple[int, bool] | None:
        """(id, is_special) of an added token spelled ``text``."""
        return self._added.get(text)

    def special_ids(self) -> frozenset[int]:
        """The ids of every special token."""
        return frozenset(i for i, special in self._added.values() if special)

    def encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text encoded on its own as ordinary text (new lists)."""
        return [list(ids) for ids in self.ids_of(texts)]

    def ids_of(self, texts: Sequence[str]) -> list[list[int]]:
        """:meth:`encode_texts` without the copies: a list returned may be
        shared with a cache or with another text of the call, and must not
        be changed. What the encoders use."""
        if not texts:
            return []
        # Short texts (argument values, names, numbers, "true") recur across
        # requests, and the tokenizer's cost per text (a few microseconds)
        # outweighs what they hold; their ids are kept. Only short ones: a
        # cache of whole messages would hold the conversations themselves.
        short = self._short
        out: list[list[int]] = []
        miss: list[str] = []
        where: list[int] = []
        for t in texts:
            ids = short.get(t) if len(t) <= SHORT_TEXT else None
            if ids is None:
                where.append(len(out))
                miss.append(t)
                out.append(_NO_IDS)
            else:
                out.append(ids)
        if not miss:
            return out
        if len(short) >= _SHORT_LIMIT:
            short.clear()
        # A text that comes twice in one call is encoded once.
        uniq = list(dict.fromkeys(miss))
        got: dict[str, list[int]] = {}
        for t, e in zip(uniq, self._tok.encode_batch_fast(uniq, add_special_tokens=False)):
            ids = got[t] = e.ids
            if len(t) <= SHORT_TEXT:
                short[t] = ids
        for j, t in zip(where, miss):
            out[j] = got[t]
        return out

    def decode_batch(self, runs: list[Sequence[int]]) -> list[str]:
        """Each run of ordinary ids decoded on its own."""
        table = self._bytes if self._bytes is not None else self._byte_table()
        if not table:
            return list(self._tok.decode_batch(runs, skip_special_tokens=False))
        out: list[str] = []
        for run in runs:
            try:
                out.append(b"".join(map(table.__getitem__, run)).decode("utf-8"))
            except (UnicodeDecodeError, IndexError, TypeError):
                # Invalid UTF-8 (a cut or random ids): the library's own
                # replacement rules decide.
                out.append(self._tok.decode(list(run), skip_special_tokens=False))
        return out

    def byte_table(self) -> list[bytes]:
        """The bytes of every id (byte-level BPE only; empty otherwise)."""
        return self._bytes if self._bytes is not None else self._byte_table()

    def _byte_table(self) -> list[bytes]:
        """The bytes of every id, for byte-level BPE vocabularies.

        Decoding a run is then a join of bytes and one UTF-8 decode, several
        times faster than the library's decoder; the table is checked against
        the library on a sample of ids before it is used, and left empty (so
        unused) for other kinds of decoder.
        """
        from tokenizers import decoders

        self._bytes = []
        if not isinstance(self._tok.decoder, decoders.ByteLevel):
            return self._bytes
        unbyte = {c: b for b, c in _byte_to_char().items()}
        added = {t.content for t in self._tok.get_added_tokens_decoder().values()}
        table = [b""] * self._size
        for token, i in self._tok.get_vocab(with_added_tokens=True).items():
            if i >= self._size:
                return self._bytes
            if token in added:
                table[i] = token.encode("utf-8")
                continue
            try:
                table[i] = bytes([unbyte[c] for c in token])
            except KeyError:
                return self._bytes
        sample = list(range(0, self._size, max(1, self._size // 4000)))
        for k in range(0, len(sample), 50):
            chunk = sample[k : k + 50]
            mine = b"".join(table[i] for i in chunk).decode("utf-8", "replace")
            if mine != self._tok.decode(chunk, skip_special_tokens=False):
                return self._bytes
        self._bytes = table
        return table

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def id_to_token(self, i: int) -> str | None:
        t = self._tok.id_to_token(i)
        return None if t is None else str(t)

    def with_special_tokens(self, tokens: Iterable[str]) -> Vocabulary:
        """A copy with ``tokens`` added as special tokens (for fine-tuning a
        base model on XTML: the new ids need training)."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(self._tok.to_str())
        tok.encode_special_tokens = False
        _add_special(tok, [t for t in tokens if self.special_id(t) is None])
        return Vocabulary(tok, self.source, _copy=False)

    @property
    def tokenizer(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``, set up for pieces of
        ordinary text: special-token literals encode as text, and there is
        no truncation, padding or post-processor."""
        return self._tok


def _byte_to_char() -> dict[int, str]:
    """The byte-level BPE alphabet: each byte as the character that stands
    for it in token strings (printable Latin-1 as itself, the rest shifted
    past U+0100)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


def byte_vocabulary(special_tokens: Iterable[str] = ()) -> Vocabulary:
    """A byte-level vocabulary with no merges (one id per byte) and
    ``special_tokens``: built in memory, for checking a template's round trip
    on token ids when no model tokenizer is at hand."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = _byte_to_char()
    tok = Tokenizer(models.BPE(vocab={alphabet[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(special_tokens)])
    return Vocabulary(tok, "<byte-level vocabulary>", _copy=False)


def load_tokenizer(
    path: str | os.PathLike[str],
    *,
    add_special_tokens: Iterable[str] = (),
    pattern: str | None = None,
) -> Vocabulary:
    """Load a tokenizer from local files (never from the network).

    ``path`` is one of:

    * a Hugging Face ``tokenizer.json`` file;
    * a tiktoken BPE file (a base64 token, a space and its rank on each
      line), which has no added tokens (give the folder instead to get the
      ones its ``tokenizer_config.json`` declares);
    * a model folder holding a ``tokenizer.json`` (used first), or else a
      tiktoken vocabulary (``tiktoken.model``, or its one ``*.tiktoken`` file)
      with an optional ``tokenizer_config.json`` whose
      ``added_tokens_decoder`` (id → ``{"content", "special", ...}``) gives
      the added tokens, as Kimi's models ship their tokenizer. Added ids come
      after the ranks; unnamed ids between the ranks and the highest added
      id are reserved special tokens (``<|reserved_token_ID|>``).

    A tiktoken vocabulary does not record its pre-tokenizer regex, so
    ``pattern`` gives it; the default is Kimi's
    (:data:`xtml.tiktoken_vocab.KIMI_PATTERN`). Other tiktoken models need
    their own (cl100k, Qwen, ...). ``pattern`` is refused for a
    ``tokenizer.json``, which records its own pre-tokenizer.

    ``add_special_tokens`` adds markers the vocabulary lacks, as special
    tokens: use it to fine-tune a base model on XTML, never to serve a model
    that was trained with other ids.
    """
    p = Path(path)
    vocab_file: Path | None = None
    config: Path | None = None
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            p = p / "tokenizer.json"
        else:
            from .tiktoken_vocab import find_vocab_file

            vocab_file = find_vocab_file(p)
            if vocab_file is None:
                raise TokenizerError(f"no tokenizer.json, tiktoken.model or *.tiktoken file in {str(path)!r}")
            if (p / "tokenizer_config.json").is_file():
                config = p / "tokenizer_config.json"
    elif not p.is_file():
        raise TokenizerError(f"no tokenizer.json or tiktoken vocabulary at {str(path)!r}")
    else:
        from .tiktoken_vocab import is_tiktoken_file

        if is_tiktoken_file(p):
            vocab_file = p
    if vocab_file is not None:
        from .tiktoken_vocab import load_tiktoken

        return load_tiktoken(vocab_file, config, pattern, add_special_tokens)
    if pattern is not None:
        raise TokenizerError(f"pattern= is for tiktoken vocabularies; {str(p)!r} records its own pre-tokenizer")
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises plain Exception subclasses
        raise TokenizerError(f"cannot load tokenizer {str(p)!r}: {e}") from None
    extra = list(add_special_tokens)
    if extra:
        added = {t.content: bool(t.special) for t in tok.get_added_tokens_decoder().values()}
        _add_special(tok, [t for t in extra if not added.get(t)])
    return Vocabulary(tok, str(p), _copy=False)


def _add_special(tok: Any, tokens: list[str]) -> None:
    """Add ``tokens`` to a ``tokenizers.Tokenizer`` as special tokens."""
    if tokens:
        from tokenizers import AddedToken

        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(tokens)])


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
        chunks: list[list[int]] = []
        texts: list[str] = []
        slots: list[int] = []
        nodes = doc.nodes if isinstance(doc, Document) else doc
        self._walk(nodes, chunks, texts, slots)
        if texts:
            for slot, ids in zip(slots, self.vocab.ids_of(texts)):
                chunks[slot] = ids
        return join_ids(chunks)

    def _walk(self, nodes: Sequence[Node], chunks: list[list[int]], texts: list[str], slots: list[int]) -> None:
        for node in nodes:
            if type(node) is Text:
                if not node.text:
                    continue
                if node.stable:
                    chunks.append(self._stable_ids(node.text))
                else:
                    slots.append(len(chunks))
                    chunks.append([])
                    texts.append(node.text)
            elif type(node) is Element:
                chunks.append(self._open_ids(node.tag, node.attrs))
                if node.children:
                    self._walk(node.children, chunks, texts, slots)
                if node.closed:
                    chunks.append(self._close_ids(node.tag))
            elif type(node) is EndOfMessage:
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
            lx = _split_text_marks(lx, self.text_marks)
        return lx

    def document(self, ids: Sequence[int], *, lenient: bool = False) -> Document:
        """The markup tree of token ids: the one-pass fast path for
        well-formed input, else the general lexer and driver."""
        self._check_ids(ids)
        if len(self._tags) > _CACHE_LIMIT:
            self._tags.clear()
        try:
            doc = build_ids_fast(ids, self.kind_of_id, self.vocab.decode_batch, self._tags)
        except (TypeError, ValueError, OverflowError):
            self._bad_id(ids)
        if doc is not None and not self.text_marks:
            return doc
        return build(self._lex(ids), lenient=lenient)  # ids were checked above

    def _bad_id(self, ids: Sequence[int]) -> NoReturn:
        for i, t in enumerate(ids):
            if type(t) is not int or not 0 <= t < self.vocab.size:
                raise ParseError(f"{t!r} is not a token id of this tokenizer", offset=i)
        raise ParseError("token ids could not be decoded", offset=0)


def _split_text_marks(lx: Lexemes, marks: tuple[str, ...]) -> Lexemes:
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

    __slots__ = ("_b", "_chunks", "_close", "_end", "_open", "_slots", "_tags", "_texts")

    def __init__(self, binding: Binding) -> None:
        self._b = binding
        self._chunks: list[list[int]] = []
        self._texts: list[str] = []
        self._slots: list[int] = []
        self._tags: list[str] = []
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
        ids = self._close(tag)
        chunks.append(ids if ids is not None else self._b._close_ids(tag))

    def embed(self, raw: str) -> None:
        if raw:
            self._chunks.append(self._b._segment_ids(Segment(raw, True)))

    def end(self) -> None:
        self._chunks.append(self._end)

    def _fill(self) -> list[list[int]]:
        """The chunks of ids, body text encoded in one batch."""
        chunks = self._chunks
        if self._texts:
            for slot, ids in zip(self._slots, self._b.vocab.ids_of(self._texts)):
                chunks[slot] = ids
            self._texts = []
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
