"""A tokenizer, used injection-safely.

:class:`Vocabulary` wraps a Hugging Face ``tokenizers.Tokenizer`` (loaded from
a ``tokenizer.json`` file or a model folder; never from the network) and
encodes ordinary text so that it can never turn into a special id: literal
``<|open|>`` in user text stays plain text. :mod:`xtml.vocab.tiktoken` gives
the same for tiktoken files; :mod:`xtml.vocab.binding` joins a vocabulary to a
template's markers.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Any, cast

from ..errors import TokenizerError
from ..lru import Lru
from ..markup.collector import collector_paused
from .bytelevel import OneThread, byte_to_char, unbyte, usable_cores

__all__ = ["Vocabulary", "byte_to_char", "byte_vocabulary", "usable_cores"]

# Texts up to this many characters have their ids cached by the vocabulary
# (at most _SHORT_LIMIT of them, a few MB).
SHORT_TEXT = 32
_SHORT_LIMIT = 16384
# A batch of two texts or more goes to the library's thread pool, and the
# handoff (waking a worker, waiting on it) costs 30-60 us; for a few texts
# under about 1,000 characters in all, encoding them one call each on this
# thread is faster (2 cores; 2 to 4 texts of 100 characters: 48-52 against
# 75-84 us, 500: 140-173 against 186-206; 4,000: the pool 1.3x faster). Past
# a handful of texts the pool's parallel work wins even on short ones (16
# texts of 480 characters: 454 against 275-334 us). A serving path's new
# turn mostly ends here: a user turn, a tool result or two.
_SERIAL_CHARS = 512
_SERIAL_TEXTS = 4

# Ids decoded through the library before the byte table is built (see
# Vocabulary._table_for).
_TABLE_AFTER = 1 << 20
# Up to this many runs and ids, runs decode one call each (measured on a
# 129k byte-level vocabulary: 16 runs of 3 ids 22 µs against 40 µs batched;
# past a few hundred ids the pool's threads win).
_EACH_RUNS = 16
_EACH_IDS = 320

# Characters encoded through the library before tiktoken's BPE is set up for
# the vocabulary (see Vocabulary._fast_for): setting it up costs one to two
# seconds for a vocabulary of 50k to 130k merges, what the library takes to
# encode a few million characters, so a command-line render never pays it.
_FAST_AFTER = 1 << 20

# Held while a byte table or tiktoken's BPE is made (a fraction of a second
# to two seconds, once per vocabulary): a thread that asks meanwhile waits
# for it instead of seeing a half-made one. One lock for all vocabularies
# keeps them picklable.
_TABLE_LOCK = threading.Lock()


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
        self._decoded = 0
        self._encoded = 0
        self._fast: Any = None  # a FastBPE, False where there is none
        self._short: dict[str, list[int]] = {}
        self._added = {
            t.content: (i, bool(t.special)) for i, t in self._tok.get_added_tokens_decoder().items()
        }

    @property
    def size(self) -> int:
        """Number of ids, added tokens included."""
        return self._size

    @property
    def derived(self) -> dict[Any, Any]:
        """What the rest of xtml makes from this vocabulary (its bindings to
        templates' markers, tables of its ids), each under the key of the
        code that makes it. It lives as long as the vocabulary does: kept
        anywhere else, keyed by the vocabulary, a binding's reference back
        to it would keep the vocabulary alive for the life of the process."""
        # Made on first use, so that subclasses with their own __init__
        # (tiktoken's) have it too; setdefault keeps one for racing threads.
        found: dict[Any, Any] | None = self.__dict__.get("_derived")
        if found is None:
            found = self.__dict__.setdefault("_derived", {})
        return found

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
        fast = self._fast_for(uniq)
        if fast:
            rest: list[str] = []
            for t, ids in zip(uniq, fast.ids_many(uniq)):
                if ids is None:
                    rest.append(t)
                else:
                    got[t] = ids
                    if len(t) <= SHORT_TEXT:
                        short[t] = ids
            uniq = rest
        # A list of ids per text: collections triggered by them would walk
        # the whole process (see xtml.markup.collector).
        with collector_paused():
            try:
                if not uniq:
                    encoded = []
                elif 1 < len(uniq) <= _SERIAL_TEXTS and sum(map(len, uniq)) <= _SERIAL_CHARS:
                    one = self._tok.encode_batch_fast  # one text: the library runs it on this thread
                    encoded = [one([t], add_special_tokens=False)[0] for t in uniq]
                else:
                    encoded = self._tok.encode_batch_fast(uniq, add_special_tokens=False)
            except TypeError:
                # The library takes only text it can pass to Rust as UTF-8.
                refuse_lone_surrogates(uniq, self.source)
                raise
            for t, e in zip(uniq, encoded):
                ids = got[t] = e.ids
                if len(t) <= SHORT_TEXT:
                    short[t] = ids
        for j, t in zip(where, miss):
            out[j] = got[t]
        return out

    def _fast_for(self, texts: list[str]) -> Any:
        """tiktoken's BPE for this vocabulary once it pays (see
        :mod:`xtml.vocab.fastbpe`): a FastBPE, or something false."""
        fast = self._fast
        if fast is None:
            self._encoded += sum(map(len, texts))
            if self._encoded < _FAST_AFTER:
                return None
            fast = self.fast_bpe()
        return fast

    def fast_bpe(self) -> Any:
        """The :class:`~xtml.vocab.fastbpe.FastBPE` that encodes this
        vocabulary's ordinary text, made now if it was not (one to two
        seconds; a server makes it before it takes requests), or False where
        tiktoken would not give the library's ids. Every text it cannot
        encode exactly goes to the library."""
        fast = self._fast
        if fast is not None:
            return fast
        with _TABLE_LOCK:
            if self._fast is None:
                self._fast = _fast_bpe(self._tok)
            return self._fast

    def overlaps(self) -> bool:
        """Whether :meth:`ids_later` can gain time: the tokenizer encodes a
        batch on one core (``TOKENIZERS_PARALLELISM`` off) and there is
        another. When the library spreads a batch over every core itself,
        rendering beside it only competes for them (measured: 1.2 to 1.3x the
        batch's time instead of 1.05 to 1.1x)."""
        flag = os.environ.get("TOKENIZERS_PARALLELISM")
        serial = flag is not None and flag.lower() in ("", "off", "false", "f", "no", "n", "0")
        return serial and usable_cores() > 1

    def ids_later(self, texts: list[str]) -> Callable[[], list[list[int]]]:
        """:meth:`ids_of` on a worker thread: returns at once, and calling
        what it returns waits for the ids (or raises what ``ids_of`` raised).

        The tokenizer runs without the GIL, so whatever the caller does
        meanwhile (rendering the rest of a long request) overlaps it instead
        of leaving a core idle. A handoff costs tens of microseconds, so it
        pays for batches of thousands of characters, not for chat-sized ones.
        """
        return _worker().submit(self.ids_of, texts).result

    def _table_for(self, runs: list[Sequence[int]]) -> list[bytes] | None:
        """The byte table once it pays: building it costs about what the
        library takes to decode a million ids, so a vocabulary that decodes
        less (a command-line parse, a short job) never builds it; decoding
        is the same either way (the table is checked against the library,
        and invalid UTF-8 goes to the library)."""
        table = self._bytes
        if table is None:
            self._decoded += sum(map(len, runs))
            if self._decoded < _TABLE_AFTER:
                return None
            table = self.byte_table()
        return table

    def decode_batch(self, runs: list[Sequence[int]]) -> list[str]:
        """Each run of ordinary ids decoded on its own."""
        return self._decode(runs, (UnicodeDecodeError, IndexError, TypeError))

    def decode_runs(self, runs: list[Sequence[int]]) -> list[str]:
        """:meth:`decode_batch` of runs whose ids are known to be ids of the
        vocabulary (what :class:`~xtml.vocab.Binding` passes, having checked
        them)."""
        return self._decode(runs, (UnicodeDecodeError,))

    def _decode(self, runs: list[Sequence[int]], fallback: tuple[type[Exception], ...]) -> list[str]:
        table = self._table_for(runs)
        if not table:
            if len(runs) <= _EACH_RUNS and sum(map(len, runs)) <= _EACH_IDS:
                # decode_batch hands the runs to a thread pool, about 12 µs
                # whatever the size: a short completion's few runs decode
                # faster one call each.
                dec = self._tok.decode
                return [dec(run, skip_special_tokens=False) for run in runs]
            return list(self._tok.decode_batch(runs, skip_special_tokens=False))
        out: list[str] = []
        for run in runs:
            try:
                out.append(join_bytes(table, run).decode("utf-8"))
            except fallback:
                # Invalid UTF-8 (a cut or random ids): the library's own
                # replacement rules decide.
                out.append(self._tok.decode(list(run), skip_special_tokens=False))
        return out

    def byte_table(self) -> list[bytes]:
        """The bytes of every id (byte-level BPE only; empty otherwise).
        Built on first use, once, whichever threads ask."""
        table = self._bytes
        if table is not None:
            return table
        with _TABLE_LOCK:
            if self._bytes is None:
                self._bytes = self._byte_table()
            return self._bytes

    def _byte_table(self) -> list[bytes]:
        """The bytes of every id, for byte-level BPE vocabularies.

        Decoding a run is then a join of bytes and one UTF-8 decode, several
        times faster than the library's decoder; the table is checked against
        the library on a sample of ids before it is used, and left empty (so
        unused) for other kinds of decoder.
        """
        from tokenizers import decoders

        none: list[bytes] = []
        tok = self._tok
        if not isinstance(tok.decoder, decoders.ByteLevel):
            return none
        # Every token string is one character of the byte-level alphabet per
        # byte: all of them joined, translated to Latin-1 and encoded in one
        # go, then cut at their lengths. (A dictionary walk per character
        # took most of a second for a 129k vocabulary.)
        added = {i: t.content for i, t in tok.get_added_tokens_decoder().items() if i < self._size}
        it = tok.id_to_token
        tokens = [it(i) for i in range(self._size)]
        for i in added:
            tokens[i] = ""
        if None in tokens:
            return none
        strs = cast("list[str]", tokens)
        try:
            data = "".join(strs).translate(unbyte()).encode("latin-1")
        except UnicodeEncodeError:
            return none  # a character outside the alphabet
        table: list[bytes] = []
        pos = 0
        for t in strs:
            n = len(t)
            table.append(data[pos : pos + n])
            pos += n
        for i, content in added.items():
            table[i] = content.encode("utf-8")
        sample = list(range(0, self._size, max(1, self._size // 4000)))
        for k in range(0, len(sample), 50):
            chunk = sample[k : k + 50]
            mine = b"".join(table[i] for i in chunk).decode("utf-8", "replace")
            if mine != tok.decode(chunk, skip_special_tokens=False):
                return none
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
        add_special(tok, [t for t in tokens if self.special_id(t) is None])
        return Vocabulary(tok, self.source, _copy=False)

    @property
    def tokenizer(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``, set up for pieces of
        ordinary text: special-token literals encode as text, and there is
        no truncation, padding or post-processor."""
        return self._tok


_FAST: Lru[str, Any] = Lru()


def _fast_bpe(tok: Any) -> Any:
    """A FastBPE for ``tok``, or False; kept by the tokenizer's content, so
    the vocabularies a process makes over one tokenizer share one."""
    from .fastbpe import build

    saved = tok.to_str()
    # Non-special added tokens are matched in text by the library (special
    # ones are not: encode_special_tokens is set), so text holding one is
    # left to it.
    added = sorted(t.content for t in tok.get_added_tokens_decoder().values() if not t.special)
    key = hashlib.sha256(saved.encode("utf-8", "surrogatepass")).hexdigest()
    found = _FAST.get(key)
    if found is None:
        try:
            made = build(saved, added)
        except (KeyError, TypeError, ValueError, AttributeError):
            # A saved tokenizer shaped otherwise than any tokenizers version
            # this was checked against: the library keeps encoding it, with
            # the same ids as ever (only the speed-up is forgone).
            made = "a tokenizer.json of another shape"
        found = made if not isinstance(made, str) else False
        _FAST.put(key, found)
    return found


# The process's one encoding thread (ids_later).
_worker = OneThread("xtml-encode")


def join_bytes(table: list[bytes], run: Sequence[int]) -> bytes:
    """The bytes of the ids of ``run``, from the byte table of their
    vocabulary (a negative id counts from the end, as in any list)."""
    # itemgetter fetches every item in one C call: half the cost of
    # map(table.__getitem__, run), which calls back for each id.
    if len(run) > 1:
        return b"".join(itemgetter(*run)(table))
    return table[run[0]] if run else b""


def refuse_lone_surrogates(texts: Iterable[str], source: str) -> None:
    """Raise TokenizerError if a text holds a lone surrogate (which a str may
    hold and no UTF encodes): the request check refuses them with their
    place, and this keeps any other caller from a bare TypeError, or from
    tiktoken's silent U+FFFD."""
    for t in texts:
        if t.isascii():
            continue
        try:
            # In C, about a nanosecond a character ("utf-32" skips the codec
            # registry).
            t.encode("utf-32")
        except UnicodeEncodeError as e:
            raise TokenizerError(f"{source}: U+{ord(t[e.start]):04X} at character {e.start:,} of a text is a lone "
                                 "surrogate, which no tokenizer encodes") from None


def byte_vocabulary(special_tokens: Iterable[str] = ()) -> Vocabulary:
    """A byte-level vocabulary with no merges (one id per byte) and
    ``special_tokens``: built in memory, for checking a template's round trip
    on token ids when no model tokenizer is at hand."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = byte_to_char()
    tok = Tokenizer(models.BPE(vocab={alphabet[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(special_tokens)])
    return Vocabulary(tok, "<byte-level vocabulary>", _copy=False)


def add_special(tok: Any, tokens: list[str]) -> None:
    """Add ``tokens`` to a ``tokenizers.Tokenizer`` as special tokens."""
    if tokens:
        from tokenizers import AddedToken

        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(tokens)])


# A text's placeholder until it is encoded; never mutated.
_NO_IDS: list[int] = []
