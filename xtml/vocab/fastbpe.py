"""tiktoken's BPE under a ``tokenizers`` byte-level BPE vocabulary, where it
gives the same ids.

tiktoken encodes ordinary text 3 to 4 times faster than ``tokenizers`` on
the same vocabulary (it keeps no offsets, no normalized string, no
alignment), and encoding is most of what a render costs. The two libraries
merge differently, though: ``tokenizers`` merges a pair only when the
vocabulary's merge list names it, tiktoken any adjacent pair whose bytes are
a token, lowest rank first. :func:`build` takes tiktoken only where that
cannot change an id:

- the model is BPE over the byte-level alphabet, with no dropout, no
  word prefix or suffix and no byte fallback; the normalizer is none or NFC;
- the pre-tokenizer is a sequence of regex splits that keep every piece
  (``Isolated``), ending in ``ByteLevel`` without a prefix space;
- every token is made by one listed merge (a list converted from tiktoken
  with every split of a token, as Llama 3's is, orders a token's merges
  among themselves, which tiktoken cannot), and tiktoken's own BPE on the
  token's bytes ends with exactly that merge (so tiktoken can never join
  two parts the list does not pair: see :func:`_merges_agree`); the ranks
  are the merges' order.

A text holding a non-special added token (the library matches those in
text), a character whose bytes have no token, or a lone surrogate goes to
the library instead; so does every text of a vocabulary that fails a
condition. The last split runs inside tiktoken; earlier ones (a digit split
before the word split, as SmolLM2's and DeepSeek's have) run here with the
``regex`` package, each piece then encoded on its own, as the library does.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import regex

from .bytelevel import OneThread, unbyte, usable_cores

__all__ = ["FastBPE", "build"]

# tokenizers' ByteLevel pre-tokenizer with use_regex (GPT-2's split), and
# its head: every branch but the whitespace ones.
_WORDS = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+"
_OTHERS = r" ?[^\s\p{L}\p{N}]+"
_GPT2_HEAD = _WORDS + r"| ?\p{N}+|" + _OTHERS
_GPT2 = _GPT2_HEAD + r"|\s+(?!\S)|\s+"

# GPT-2's split, with or without its last branch (SmolLM2's has none: the
# text it leaves is a piece of its own), read without the lookahead. The
# lookahead keeps the last space of a run of two or more before a word for
# the word, and it alone makes tiktoken's regex backtrack (twice as slow, half
# of a render). Cut at that space instead, each part a text of its own, it
# gives the same pieces: :meth:`FastBPE._cut_encode` says why.
_GPT2_FORMS = (_GPT2, _GPT2_HEAD + r"|\s+(?!\S)")
_LOOKAHEAD_FREE = _GPT2_HEAD + r"|\s+"
# The same after a split that isolates each digit (SmolLM2's, a Split of
# \p{N}): one pattern, the digits its first branch, and the cuts only before
# what is not a digit (a run before a digit ends a piece there). No branch
# but the first takes a digit, and none reaches across one, so the pieces
# between digits are those of the split on its own.
_DIGITS = r"\p{N}"
_DIGITS_LOOKAHEAD_FREE = _DIGITS + "|" + _WORDS + "|" + _OTHERS + r"|\s+"

# Unicode's White_Space, which is \s to tiktoken's regex, to the library's
# (Oniguruma) and to the ``regex`` package, spelled out for ``re`` (whose \s
# also takes U+001C..U+001F).
_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# A run of two or more whitespace characters before one that is not (for an
# ASCII text, then any text); before one that is not a digit either.
_RUN = re.compile(f"[{_WS}]{{2,}}(?=[^{_WS}])")
_RUNS = (_RUN, _RUN)
_DIGIT_RUNS = (re.compile(f"[{_WS}]{{2,}}(?=[^{_WS}0-9])"), regex.compile(f"[{_WS}]{{2,}}(?=[^{_WS}\\p{{N}}])"))

# Bytes that the UTF-8 of some text can hold (a vocabulary that lacks a
# byte's token drops the character in the library, and tiktoken would stop
# the process on it).
_UTF8_BYTES = (*range(0x00, 0xC0), *range(0xC2, 0xF5))

# A batch of this many characters or more, of texts this long on average, is
# encoded in two halves on two threads (60,000 characters in texts of 3,000:
# 1.6x faster). Chat-sized texts stay on one: each call into tiktoken lets
# the GIL go and takes it back, and two threads trading it over texts of a
# few hundred characters took 1.3x the time of one (a conversation of 41
# texts, 6,800 characters).
_PARALLEL_CHARS = 16384
_PARALLEL_MEAN = 1024

# The other half's thread: not the vocabulary's encoding thread, which may
# be the one asking.
_pool = OneThread("xtml-bpe")

# Pieces of one or two characters whose ids are kept, at most.
_SHORT_LIMIT = 1 << 16


class FastBPE:
    """Ordinary text to ids with tiktoken, for one vocabulary."""

    def __init__(self, encoding: Any, to_id: list[int] | None, splits: list[Any], nfc: bool,
                 refuse: _Refusals, runs: tuple[Any, Any] | None = None) -> None:
        #: Whether GPT-2's split runs without its lookahead (cut texts).
        self.cut = runs is not None
        # Where to cut an ASCII text, and any other.
        self._runs = runs
        self._whole: Callable[[str], list[int]] = encoding.encode_ordinary
        self._to_id = to_id
        self._splits = splits
        # One search for any of the earlier splits: most texts hold none of
        # what they cut (a digit, a Han character), and pass whole.
        self._any_split = regex.compile("|".join(f"(?:{rx.pattern[1:-1]})" for rx in splits)) if splits else None
        self._nfc = nfc
        self._refuse = refuse
        self._short: dict[str, list[int]] = {}

    def ids(self, text: str) -> list[int] | None:
        """The ids the library would give ``text``, or None where only the
        library can say."""
        refuse = self._refuse
        if refuse.holds(text):
            return None
        if self._nfc and not text.isascii():
            normal = unicodedata.normalize("NFC", text)
            if normal != text:
                if refuse.holds(normal):
                    return None
                text = normal
        enc = self._whole
        runs = self._runs
        if runs is not None:
            rx = runs[0] if text.isascii() else runs[1]
            # A text without a run to cut at has none in any of its pieces.
            first = rx.search(text)
            if first is not None:
                # (Searched again from the first cut; a piece of the text,
                # from its start.)
                enc = partial(self._cut_encode, rx, 0 if self._any_split is not None else first.start())
        to_id = self._to_id
        if self._any_split is None or self._any_split.search(text) is None:
            return enc(text) if to_id is None else [to_id[r] for r in enc(text)]
        out: list[int] = []
        short = self._short
        for piece in _pieces(text, self._splits):
            if len(piece) <= 2:
                # Digits cut one or three to a piece recur in every number:
                # a dictionary hit costs less than a call.
                got = short.get(piece)
                if got is None:
                    if len(short) >= _SHORT_LIMIT:
                        short.clear()
                    got = short[piece] = self._whole(piece)  # too short to cut
                out += got
            else:
                out += enc(piece)
        return out if to_id is None else [to_id[r] for r in out]

    def _cut_encode(self, runs: Any, start: int, text: str) -> list[int]:
        r"""``text`` encoded by GPT-2's split read without its lookahead, cut
        before the last character of each run of two or more whitespace
        characters that something else follows.

        The pieces are the library's. GPT-2's head (every branch but the
        whitespace ones) takes whitespace only as the first character of a
        match, one space before a word, a number or punctuation. So no head
        match holds two characters of a run, or reaches across a cut, and
        cutting changes none of them. With the lookahead, a run of two or
        more that something follows makes two pieces: the run but its last
        character, then that character (alone, or with what follows where
        it is a space the head takes). Cut before that character, the first
        part ends in the rest of the run, which ``\s+`` takes whole as the
        lookahead did; the second starts with it, one whitespace character
        before something else, where the lookahead branch fails and ``\s+``
        takes the one character (where there is no such branch, SmolLM2's
        split, the library keeps the character left between matches as a
        piece of its own: the same). A run at the end is taken whole by
        both. The head and ``\s+`` match at every character, so nothing is
        left between matches for tiktoken to drop.
        """
        enc = self._whole
        out: list[int] = []
        at = 0
        for m in runs.finditer(text, start):
            k = m.end() - 1
            out += enc(text[at:k])
            at = k
        out += enc(text[at:])
        return out

    def ids_many(self, texts: Sequence[str]) -> list[list[int] | None]:
        """:meth:`ids` of each text; a large batch in two halves, one on
        another core (tiktoken encodes without the GIL)."""
        total = sum(map(len, texts))
        if len(texts) < 2 or total < _PARALLEL_CHARS or total < _PARALLEL_MEAN * len(texts) or usable_cores() < 2:
            return [self.ids(t) for t in texts]
        acc = 0
        cut = len(texts) - 1
        for k, t in enumerate(texts):
            acc += len(t)
            if 2 * acc >= total:
                cut = min(k + 1, len(texts) - 1)
                break
        one = self.ids
        later = _pool().submit(lambda: [one(t) for t in texts[:cut]])
        rest = [one(t) for t in texts[cut:]]
        return later.result() + rest


def _pieces(text: str, splits: list[Any]) -> list[str]:
    """``text`` cut by each split in turn, matches and the text between
    them both kept (tokenizers' ``Isolated``); each split is a pattern in
    one capturing group, so that ``split`` gives both in one call."""
    pieces = [text]
    for rx in splits:
        cut: list[str] = []
        for p in pieces:
            cut += rx.split(p)
        pieces = cut
    return [p for p in pieces if p]


def build(tokenizer_json: str, non_special_added: Sequence[str]) -> FastBPE | str:
    """A :class:`FastBPE` for the tokenizer saved as ``tokenizer_json``, or
    why there is none."""
    try:
        import tiktoken
    except ImportError:  # pragma: no cover - a declared dependency
        return "tiktoken is not installed"
    spec = json.loads(tokenizer_json)
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return "the model is not BPE"
    if model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") \
            or model.get("byte_fallback"):
        return "the BPE model has dropout, a word prefix or suffix, or byte fallback"
    nfc = _normalizer(spec.get("normalizer"))
    if nfc is None:
        return "a normalizer other than NFC"
    patterns = _patterns(spec.get("pre_tokenizer"))
    if isinstance(patterns, str):
        return patterns
    made = _ranks(model)
    if isinstance(made, str):
        return made
    ranks, to_id, missing = made
    *first, last = patterns
    try:
        splits = [regex.compile(f"({p})") for p in first]
        if any(rx.groups != 1 for rx in splits):
            return "a split pattern with groups of its own"
        # An empty match would cut nothing in the library; split would
        # make empty pieces and cut at it all the same.
        if any(regex.fullmatch(p, "") for p in patterns):
            return "a split that matches empty text"
        runs: tuple[Any, Any] | None = None
        if last in _GPT2_FORMS and first == [_DIGITS]:
            splits, pat, runs = [], _DIGITS_LOOKAHEAD_FREE, _DIGIT_RUNS
        elif last in _GPT2_FORMS:
            pat, runs = _LOOKAHEAD_FREE, _RUNS
        else:
            # tiktoken encodes only what its pattern matches; the library
            # keeps the text between matches as pieces too, which the second
            # branch matches (a run of characters where the split does not).
            # (GPT-2's split read without its lookahead matches everywhere.)
            pat = f"(?:{last})|(?:(?!(?:{last}))[\\s\\S])+"
        encoding = tiktoken.Encoding("xtml-bpe", pat_str=pat, mergeable_ranks=ranks, special_tokens={})
        encoding.encode_ordinary("a")
    except Exception as e:  # regex or tiktoken refusing a pattern
        return f"a split pattern tiktoken cannot take ({type(e).__name__})"
    refuse = _Refusals(missing, non_special_added)
    return FastBPE(encoding, to_id, splits, nfc, refuse, runs)


def _normalizer(spec: Any) -> bool | None:
    """True for NFC, False for none, None for any other."""
    if spec is None:
        return False
    kind = spec.get("type")
    if kind == "NFC":
        return True
    if kind == "Sequence":
        inner = [_normalizer(s) for s in spec.get("normalizers", [])]
        if None in inner or sum(map(bool, inner)) > 1:
            return None
        return any(inner)
    return None


def _patterns(spec: Any) -> list[str] | str:
    """The split regexes, in order, or why they cannot be taken."""
    if spec is None:
        return "no pre-tokenizer"
    steps = spec["pretokenizers"] if spec.get("type") == "Sequence" else [spec]
    if not steps or steps[-1].get("type") != "ByteLevel":
        return "the pre-tokenizer does not end in ByteLevel"
    *splits, byte_level = steps
    if byte_level.get("add_prefix_space"):
        return "ByteLevel adds a prefix space"
    out: list[str] = []
    for s in splits:
        if s.get("type") != "Split" or s.get("behavior") != "Isolated" or s.get("invert"):
            return f"a pre-tokenizer step other than an isolating split ({s.get('type')})"
        pattern = s.get("pattern") or {}
        if "Regex" in pattern:
            out.append(pattern["Regex"])
        elif "String" in pattern:
            out.append(regex.escape(pattern["String"]))
        else:
            return "a split without a pattern"
    if byte_level.get("use_regex", True):
        out.append(_GPT2)
    if not out:
        return "no split"
    return out


def _ranks(model: dict[str, Any]) -> tuple[dict[bytes, int], list[int] | None, list[int]] | str:
    """tiktoken's ranks (the merges' order), the ids of the ranks (None
    where they are the ids), and the bytes without a token."""
    table = unbyte()
    vocab: dict[str, int] = model.get("vocab") or {}

    def raw(token: str) -> bytes | None:
        try:
            return token.translate(table).encode("latin-1")
        except UnicodeEncodeError:
            return None  # a character outside the alphabet

    single: dict[bytes, int] = {}
    for token, i in vocab.items():
        b = raw(token)
        if b is not None and len(b) == 1:
            single[b] = i
    missing = [x for x in _UTF8_BYTES if bytes([x]) not in single]
    merges = model.get("merges") or []
    by_id = sorted(single, key=single.__getitem__)
    ranks: dict[bytes, int] = {b: k for k, b in enumerate(by_id)}
    rank_ids = [single[b] for b in by_id]
    listed: dict[bytes, tuple[bytes, bytes]] = {}
    base = len(ranks)
    for k, m in enumerate(merges):
        left, right = m if isinstance(m, list) else m.split(" ", 1)
        a, c = raw(left), raw(right)
        if a is None or c is None:
            return "a merge of a token outside the byte-level alphabet"
        t = a + c
        if t in ranks:
            return "a token made by two merges"
        made_id = vocab.get(left + right)
        if made_id is None:
            return "a merge whose result is not a token"
        ranks[t] = base + k
        rank_ids.append(made_id)
        listed[t] = (a, c)
    # A part may be made by a later merge (a list converted from tiktoken
    # orders merges by their token's rank, and tiktoken merges by rank
    # whatever made the parts): only that it is made at all matters.
    if any(a not in ranks or c not in ranks for a, c in listed.values()):
        return "a merge of a part no merge makes"
    if model.get("ignore_merges"):
        # The library takes a piece that is a token whole; tiktoken too, but
        # only among its ranks: a token no merge makes would differ.
        for token in vocab:
            b = raw(token)
            if b is not None and b not in ranks:
                return "a token no merge makes, under ignore_merges"
    if not _merges_agree(ranks, listed):
        return "tiktoken's BPE would join parts the merge list does not pair"
    if all(a < b for a, b in zip(rank_ids[len(single) - 1 :], rank_ids[len(single) :])):
        # The ids themselves are in the merges' order (as in most byte-level
        # vocabularies), and tiktoken needs ranks only to order the merges:
        # its ids are then the library's, with nothing to translate.
        return {b: rank_ids[r] for b, r in ranks.items()}, None, missing
    return ranks, rank_ids, missing


def _merges_agree(ranks: dict[bytes, int], listed: dict[bytes, tuple[bytes, bytes]]) -> bool:
    """Whether tiktoken's merges are the list's on every text.

    tiktoken joins the adjacent pair of lowest rank whose bytes are a token.
    When it makes a token ``t`` inside a longer text, the merges it made
    within ``t``'s bytes are those it makes on ``t``'s bytes alone (a merge
    across their edge would have left no part ending there), so it is enough
    that on each token's own bytes its last merge is the listed pair: then
    every pair it ever joins is one the list pairs, at the list's priority.
    """
    get = ranks.get
    for t, pair in listed.items():
        if len(t) == 2:
            continue  # two bytes: one way to split them
        parts = [t[i : i + 1] for i in range(len(t))]
        while len(parts) > 2:
            best = -1
            at = -1
            for i in range(len(parts) - 1):
                r = get(parts[i] + parts[i + 1])
                if r is not None and (best < 0 or r < best):
                    best, at = r, i
            if at < 0:
                return False  # the token is never made from its bytes
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        if (parts[0], parts[1]) != pair:
            return False
    return True


class _Refusals:
    """Text the library must encode: a non-special added token (which it
    matches in text), a character with a byte that has no token, a lone
    surrogate."""

    def __init__(self, missing: list[int], added: Sequence[str]) -> None:
        chars: list[str] = ["\ud800-\udfff"]
        for b in missing:
            if b < 0x80:
                chars.append(re.escape(chr(b)))
            elif 0xC2 <= b <= 0xDF:
                lo = (b & 0x1F) << 6
                chars.append(f"{re.escape(chr(lo))}-{re.escape(chr(lo | 0x3F))}")
            elif 0xE0 <= b <= 0xEF:
                lo = (b & 0x0F) << 12
                chars.append(f"{re.escape(chr(max(lo, 0x800)))}-{re.escape(chr(lo | 0xFFF))}")
            elif 0xF0 <= b <= 0xF4:
                lo = (b & 0x07) << 18
                chars.append(f"{re.escape(chr(max(lo, 0x10000)))}-{re.escape(chr(min(lo | 0x3FFFF, 0x10FFFF)))}")
            else:
                # A continuation byte: every character of two bytes or more
                # has some, so all of them go to the library.
                chars.append("\x80-\U0010ffff")
        self._chars = re.compile(f"[{''.join(chars)}]")
        # An ASCII text (a flag of the string) holds none but these, found
        # by substring search, many times faster than a character class.
        self._ascii = tuple(chr(b) for b in missing if b < 0x80)
        added = sorted((a for a in added if a), key=len, reverse=True)
        # The added tokens mostly share a beginning ("<|", or "<" and a
        # full-width bar): a substring test rules out most texts before the
        # alternation runs. (Character by character, as meant.)
        self._prefix = os.path.commonprefix(added) if added else ""  # noqa: RUF071
        self._added = re.compile("|".join(map(re.escape, added))) if added else None

    def holds(self, text: str) -> bool:
        if text.isascii():
            for c in self._ascii:
                if c in text:
                    return True
        elif self._chars.search(text) is not None:
            return True
        found = self._added
        if found is None or (self._prefix and self._prefix not in text):
            return False
        return found.search(text) is not None
