"""A vocabulary bound to a layout format's tokens: pieces → ids, ids → a
lexed string.

A layout format names its tokens in two kinds: *special* ones must each be
one special id (text never makes one); *added* ones must each be one id,
special or not. Text between tokens is encoded as one run, whole, as
engines tokenize a rendered prompt (so the ids equal theirs wherever no
content spells a token); a token never comes from text. On the way back a
run of ordinary ids is decoded whole, and each token id becomes the one
character that stands for it (``chr(base + k)``, a lone surrogate no decoded
text holds).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from itertools import accumulate, compress
from operator import itemgetter
from typing import Any

from ..errors import ParseError, TokenizerError, shown
from ..lru import Lru
from ..markup.segments import Segment
from .vocabulary import Vocabulary

__all__ = ["TokenBinding", "tokens_bound"]

_INT = {int}


class TokenBinding:
    """A vocabulary bound to the tokens of a layout format."""

    def __init__(self, special: tuple[str, ...], added: tuple[str, ...], stops: tuple[str, ...], base: int,
                 vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.tokens = special + added
        self.token_ids: dict[str, int] = {}
        problems: list[str] = []
        for t in special:
            sid = vocab.special_id(t)
            if sid is None:
                problems.append(f"{t!r} is an added token but not a special one" if vocab.added_id(t) is not None
                                else f"{t!r} is not a special token")
            else:
                self.token_ids[t] = sid
        text_tokens: list[str] = []
        for t in added:
            hit = vocab.added_id(t)
            if hit is None:
                # A vocabulary without it spells it as text, as a model
                # trained on that vocabulary writes it: found in text.
                text_tokens.append(t)
            else:
                self.token_ids[t] = hit[0]
        problems += [f"{t!r}, a stop token, is not a token of it" for t in stops if t in text_tokens]
        self.text_tokens = tuple(text_tokens)
        """Added tokens this vocabulary lacks: written and read as text."""
        self._text_finder = re.compile("|".join(re.escape(t) for t in sorted(text_tokens, key=len, reverse=True))) \
            if text_tokens else None
        self._text_chars = {t: chr(base + k) for k, t in enumerate(self.tokens) if t in text_tokens}
        if problems:
            raise TokenizerError(f"tokenizer {vocab.source!r} does not fit the format's tokens: "
                                 + "; ".join(problems))
        self.char_of_id: dict[int, str] = {self.token_ids[t]: chr(base + k) for k, t in enumerate(self.tokens)
                                           if t in self.token_ids}
        self.stop_ids = tuple(self.token_ids[t] for t in stops)
        self._text_table: list[bytes | None] | None = None
        self._char_list: list[str | None] | None = None
        self._text_strs: list[str | None] | None = None
        self._whole_table: list[str | None] | None = None
        self.derived: dict[Any, Any] = {}

    # -- pieces → ids ------------------------------------------------------------------

    def encode_segments(self, segments: Sequence[Segment]) -> list[int]:
        """Ids of segments: a special segment is its token's id, each run of
        text between them is encoded whole (all runs in one batch); a token
        this vocabulary spells as text is part of the run it stands in."""
        ids = self.token_ids
        runs: list[str] = []
        plan: list[int] = []  # a token id, or -1 - the index of a run
        pending: list[str] = []
        for s in segments:
            if s.special and s.text in ids:
                if pending:
                    plan.append(-1 - len(runs))
                    runs.append("".join(pending))
                    pending = []
                plan.append(ids[s.text])
            else:
                pending.append(s.text)
        if pending:
            plan.append(-1 - len(runs))
            runs.append("".join(pending))
        encoded = self.vocab.ids_of(runs) if runs else []
        out: list[int] = []
        for p in plan:
            if p >= 0:
                out.append(p)
            else:
                out.extend(encoded[-1 - p])
        return out

    def text_ids(self, text: str, finder: re.Pattern[str]) -> list[int]:
        """Ids of text as a model would have generated it: each token's
        string is its id, the text between encoded whole."""
        segs: list[Segment] = []
        pos = 0
        for m in finder.finditer(text):
            if m.start() > pos:
                segs.append(Segment(text[pos:m.start()], False))
            segs.append(Segment(m.group(), True))
            pos = m.end()
        if pos < len(text):
            segs.append(Segment(text[pos:], False))
        return self.encode_segments(segs)

    # -- ids → a lexed string ----------------------------------------------------------

    def lex(self, ids: Sequence[int]) -> tuple[str, list[int], list[int]]:
        """The lexed string of ids, and where each piece of it starts: in the
        string, and in the ids (for locating a character)."""
        n = len(ids)
        # Each id's token character or None, and where the tokens are, in C
        # loops over the ids (an id past the vocabulary fails the lookup);
        # the Python loop below goes over the tokens only.
        chars = self._chars_by_id()
        try:
            if n and not _plain_ints(ids):
                raise IndexError
            # One C call for all the lookups (a map would call a method per id).
            marks = itemgetter(*ids)(chars) if n > 1 else [chars[i] for i in ids]
        except IndexError:
            size = self.vocab.size
            for k, t in enumerate(ids):  # the bad one, for its offset
                if type(t) is not int or not 0 <= t < size:
                    raise ParseError(f"{shown(t)} is not a token id of this tokenizer", offset=k) from None
            raise
        pieces: list[str] = []
        starts: list[int] = []
        offsets: list[int] = []
        runs: list[Sequence[int]] = []
        slots: list[int] = []
        end = 0
        for k in compress(range(n), marks):
            if k > end:
                slots.append(len(pieces))
                runs.append(ids[end:k])
                pieces.append("")
                offsets.append(end)
            c = marks[k]
            assert c is not None
            pieces.append(c)
            offsets.append(k)
            end = k + 1
        if end < n:
            slots.append(len(pieces))
            runs.append(ids[end:])
            pieces.append("")
            offsets.append(end)
        finder = self._text_finder
        for slot, text in zip(slots, self.decode_runs(runs), strict=True):
            pieces[slot] = text if finder is None else self.lexed_run(text)
        if pieces:
            starts += accumulate(map(len, pieces[:-1]), initial=0)
        return "".join(pieces), starts, offsets

    def lex_whole(self, ids: Sequence[int]) -> str | None:
        """The lexed string of ids in one join, where each id is a token or
        text that is whole UTF-8 on its own (most ids of most prompts); None
        where :meth:`lex` must say (a bad id, a character cut across ids, a
        token this vocabulary spells as text). The same string: text whole
        on each side of a cut decodes as the run decodes."""
        if len(ids) < 2 or self._text_finder is not None:
            return None
        table = self._whole_table
        if table is None:
            strs = self.text_strs()
            if not strs:
                return None
            # A token's id is its character, any other id its whole text.
            table = [s if c is None else c for s, c in zip(strs, self._chars_by_id(), strict=True)]
            self._whole_table = table
        try:
            s = "".join(itemgetter(*ids)(table))
        except (TypeError, IndexError):
            return None  # a character cut across ids (or a bad id): lex checks the ids once
        # A bool or a negative id has text in the table: only lex reads it
        # (and refuses it).
        return s if _plain_ints(ids) else None

    def lexed_run(self, text: str) -> str:
        """A decoded run of ordinary ids as a lexed string has it: each
        token this vocabulary spells as text is its token's character."""
        finder = self._text_finder
        if finder is None or finder.search(text) is None:
            return text
        return finder.sub(lambda m: self._text_chars[m.group()], text)

    def _chars_by_id(self) -> list[str | None]:
        """:attr:`char_of_id` as a list over the whole vocabulary."""
        table = self._char_list
        if table is None:
            table = [None] * self.vocab.size
            for i, c in self.char_of_id.items():
                table[i] = c
            self._char_list = table
        return table

    def decode_runs(self, runs: list[Sequence[int]]) -> list[str]:
        """Each run of ordinary ids decoded whole: its bytes as UTF-8, a bad
        sequence replaced (what the stream does, token by token)."""
        table = self.text_table()
        if not table:
            return self.vocab.decode_batch(runs)
        # A None (a token's id) fails the join, and is then read as no bytes.
        out: list[str] = []
        for run in runs:
            try:
                raw = b"".join(itemgetter(*run)(table)) if len(run) > 1 else table[run[0]] or b""
            except TypeError:
                raw = b"".join(table[i] or b"" for i in run)
            out.append(raw.decode("utf-8", "replace"))
        return out

    def text_table(self) -> list[bytes | None]:
        """The bytes of every id of ordinary text, None for the token ids
        (empty if the vocabulary has no byte table)."""
        table = self._text_table
        if table is None:
            table = list(self.vocab.byte_table())
            if table:
                for i in self.char_of_id:
                    table[i] = None
            self._text_table = table
        return table

    def text_strs(self) -> list[str | None]:
        """The text of every id whose bytes are whole UTF-8 on their own,
        None for the rest (tokens, parts of a character)."""
        strs = self._text_strs
        if strs is None:
            strs = []
            for b in self.text_table():
                try:
                    s = b.decode() if b else None
                except UnicodeDecodeError:
                    s = None
                strs.append(s)
            self._text_strs = strs
        return strs


def _plain_ints(ids: Sequence[Any]) -> bool:
    """Every id an ``int`` (not a bool or another integer type) and none
    negative, in C loops; the range above is the lookups' to check."""
    return set(map(type, ids)) == _INT and min(ids) >= 0


def locate(starts: list[int], offsets: list[int], ids_len: int, text: str) -> Any:
    """A function from a character of a lexed string to its token offset."""
    def offset(at: int) -> int:
        if at >= len(text):
            return ids_len
        k = bisect.bisect_right(starts, at) - 1
        return offsets[k] if k >= 0 else 0
    return offset


def tokens_bound(special: tuple[str, ...], added: tuple[str, ...], stops: tuple[str, ...], base: int,
                 vocab: Vocabulary) -> TokenBinding:
    """The binding of a format's tokens to ``vocab``, made once and kept on
    the vocabulary (as :func:`~.binding.bound` keeps XTML bindings)."""
    table: Lru[Any, TokenBinding] | None = vocab.derived.get(TokenBinding)
    if table is None:
        table = vocab.derived.setdefault(TokenBinding, Lru())
    key = (special, added, stops, base)
    found = table.get(key)
    return found if found is not None else table.put(key, TokenBinding(special, added, stops, base, vocab))
