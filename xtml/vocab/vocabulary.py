"""A tokenizer, used injection-safely.

:class:`Vocabulary` wraps a Hugging Face ``tokenizers.Tokenizer`` (loaded from
a ``tokenizer.json`` file or a model folder; never from the network) and
encodes ordinary text so that it can never turn into a special id: literal
``<|open|>`` in user text stays plain text. :mod:`xtml.vocab.tiktoken` gives
the same for tiktoken files; :mod:`xtml.vocab.binding` joins a vocabulary to a
template's markers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import TokenizerError

__all__ = ["Vocabulary", "byte_vocabulary"]

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


def _add_special(tok: Any, tokens: list[str]) -> None:
    """Add ``tokens`` to a ``tokenizers.Tokenizer`` as special tokens."""
    if tokens:
        from tokenizers import AddedToken

        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(tokens)])


# A text's placeholder until it is encoded; never mutated.
_NO_IDS: list[int] = []
