"""The text between two markers of a streamed completion, decoded as it
comes: characters out as soon as they are whole, placeholders spelled as text
found in it, and at its end the text the batch parser decodes from the same
ids, with whatever the stream has not yet sent of it.
"""

from __future__ import annotations

import re
from codecs import utf_8_decode as _utf8
from dataclasses import dataclass, field
from typing import Any

from ..vocab.vocabulary import Vocabulary
from .stream_events import Sink

__all__ = ["CHUNK", "TextRun", "byte_fallback_ids"]

# A run's text is gathered in pieces and joined into chunks of this many, so
# that ending a long run joins a few chunks rather than one piece per token.
CHUNK = 1024


@dataclass(slots=True, eq=False)
class TextRun:
    """The run of text being read: the ids since the last marker, one text
    lexeme for the tree builder when the next marker (or the end) comes.

    Where it goes is settled when it starts: ``sink``, or None for text that
    does not stream (a tag's header, an embed, text outside the message),
    decoded once, when it ends. One object serves every run of a parser
    (``restart`` after each marker): a marker costs no allocation of it.
    """

    vocab: Vocabulary
    table: list[bytes]
    """The bytes of each id (:meth:`Vocabulary.byte_table`); empty for a
    tokenizer that is not byte-level, whose own decoder streams the text."""
    byte_ids: frozenset[int]
    """Byte-fallback ids (a tokenizer that is not byte-level)."""
    marks: tuple[str, ...]
    """Placeholders the vocabulary spells as text."""
    sink: Sink | None = None
    ids: list[int] | None = field(default_factory=list)
    """Its ids, for the decode of the whole run at its end; None when its
    text is only streamed, not kept (a channel's text without keep, when
    nothing else needs the ids)."""
    blank: bool = False
    """Its lexeme goes to the tree empty (a channel's text without keep)."""
    header: bool = False
    """It follows a tag marker: a header, where no placeholder is looked for."""
    at: int = -1
    """Offset of its first id; -1 while it has none."""
    pieces: list[str] = field(default_factory=list)
    """Its text so far, as streamed, joined into ``chunks`` every CHUNK."""
    chunks: list[str] = field(default_factory=list)
    lossy: bool = False
    """It held invalid UTF-8: the vocabulary's own decode settles the text."""
    pend: bytes = b""
    """Bytes of a character cut across tokens, waiting for the rest."""
    group: list[int] = field(default_factory=list)
    """Byte-fallback ids, decoded together (a tokenizer that is not byte-level)."""
    hold: str = ""
    """A tail that may begin a placeholder spelled as text."""
    stream: Any = None
    """The tokenizer's incremental decoder (a tokenizer that is not byte-level)."""
    firsts: frozenset[str] = field(init=False)
    """The first characters of ``marks``."""

    def __post_init__(self) -> None:
        self.firsts = frozenset(m[0] for m in self.marks)

    def restart(self, sink: Sink | None, ids: list[int] | None, blank: bool, header: bool) -> None:
        """The next run, empty, going to ``sink``."""
        self.sink = sink
        self.ids = ids
        self.blank = blank
        self.header = header
        self.at = -1
        self.pieces = []
        self.chunks = []
        self.lossy = False
        self.pend = b""
        self.group = []
        self.hold = ""
        if sink is not None and not self.table:
            from tokenizers.decoders import DecodeStream

            self.stream = DecodeStream(skip_special_tokens=False)

    def step(self, t: int) -> str:
        """The characters one more id of a streamed run completes (``""``
        while they wait: a character cut across ids, a byte of byte
        fallback)."""
        table = self.table
        if table:
            # Incremental UTF-8: the bytes of a character cut across tokens
            # wait for the rest.
            b = table[t]
            pend = self.pend
            if pend:
                b = pend + b
            s, used = _utf8(b, "replace", False)
            self.pend = b[used:] if used < len(b) else b""
        elif t in self.byte_ids:
            # A byte of a byte-fallback tokenizer: its decoder reads a run of
            # them together (invalid UTF-8 replaces every byte of it), so the
            # run goes to the decoder whole, when it ends.
            self.group.append(t)
            return ""
        elif self.group:
            self.group.append(t)
            s = self.stream.step(self.vocab.tokenizer, self.group) or ""
            self.group = []
        else:
            s = self.stream.step(self.vocab.tokenizer, t) or ""
        if not s:
            return s
        if "\ufffd" in s:
            self.lossy = True
        if self.ids is not None:
            pieces = self.pieces
            pieces.append(s)
            if len(pieces) >= CHUNK:
                self.chunks.append("".join(pieces))
                pieces.clear()
        return s

    def split(self, s: str) -> list[tuple[str, bool]]:
        """Streamed text with placeholders that the vocabulary spells as
        text, in pieces: each placeholder (True), found in the text as the
        batch lexer finds it, and the text around it (False). A tail that
        may begin one is held until it is known."""
        if not self.hold and self.firsts.isdisjoint(s):
            # Most text holds no character a placeholder starts with.
            return [(s, False)] if s else []
        found: list[tuple[str, bool]] = []
        buf = self.hold + s
        marks = self.marks
        while True:
            hits = [(buf.find(m), m) for m in marks if m in buf]
            if not hits:
                break
            pos, m = min(hits)
            if pos:
                found.append((buf[:pos], False))
            found.append((m, True))
            buf = buf[pos + len(m) :]
        cut = len(buf)
        for c in self.firsts:
            p = buf.find(c, max(0, len(buf) - max(map(len, marks)) + 1))
            while 0 <= p < cut:
                if any(m.startswith(buf[p:]) for m in marks):
                    cut = p
                    break
                p = buf.find(c, p + 1)
        self.hold = buf[cut:]
        if cut:
            found.append((buf[:cut], False))
        return found

    def end(self) -> tuple[list[str], str]:
        """The run ends (at a marker or the end of the output): what is
        still to stream of it, in order, and its text as the batch decodes
        the run."""
        sent: list[str] = []
        if self.sink is None:
            # A run that does not stream keeps its ids.
            assert self.ids is not None
            return sent, self.vocab.decode_batch([self.ids])[0]
        text = ""
        if self.table:
            tail = _utf8(self.pend, "replace", True)[0] if self.pend else ""
            self.pend = b""
            if tail:
                self.lossy = True
                self.pieces.append(tail)
                sent.append(tail)
            if self.ids is not None:
                text = "".join([*self.chunks, *self.pieces])
                if self.lossy:
                    # Invalid UTF-8: the vocabulary's own replacement rules.
                    text = self._settle(text, sent)
        else:
            if self.group:
                s = self.stream.step(self.vocab.tokenizer, self.group) or ""
                self.group = []
                if s:
                    self.pieces.append(s)
                    sent.append(s)
            # Incremental decoding is the tokenizer's own guess; the run
            # decoded whole is the batch's text, and what is missing of it
            # is sent now.
            text = self._settle("".join([*self.chunks, *self.pieces]), sent)
        return sent, text

    def _settle(self, streamed: str, sent: list[str]) -> str:
        """The run decoded whole, as the batch decodes it; what was not
        streamed of it goes to ``sent``."""
        ids = self.ids
        # Only a run whose text streams without being kept drops its ids,
        # and it is never settled.
        assert ids is not None
        exact = self.vocab.decode_batch([ids])[0]
        if exact != streamed and exact.startswith(streamed):
            sent.append(exact[len(streamed) :])
        return exact


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def byte_fallback_ids(vocab: Vocabulary) -> frozenset[int]:
    """The ids of byte tokens (``<0xE6>``) of a byte-fallback vocabulary
    (found once per vocabulary, and kept on it)."""
    found: frozenset[int] | None = vocab.derived.get(byte_fallback_ids)
    if found is None:
        tok = vocab.tokenizer
        get_vocab = getattr(tok, "get_vocab", None)
        pairs = get_vocab(with_added_tokens=False).items() if callable(get_vocab) else ()
        found = vocab.derived[byte_fallback_ids] = frozenset(i for s, i in pairs if _BYTE_TOKEN.fullmatch(s))
    return found
