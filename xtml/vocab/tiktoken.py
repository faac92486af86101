"""tiktoken vocabularies: a BPE rank file, alone or in a model folder.

A tiktoken BPE file has one token a line: the token's bytes in base64, a
space, and its rank (merge priority, which is also its id). Models built on
tiktoken, Kimi's among them, ship such a file (``tiktoken.model`` or
``*.tiktoken``) next to a ``tokenizer_config.json`` whose
``added_tokens_decoder`` names the special tokens that follow the ranks.

Everything here reads local files only. tiktoken's own loader is not used:
it keeps a cache keyed by the file's path (under ``TIKTOKEN_CACHE_DIR`` or
the temporary folder) and may answer from that cache instead of the file.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import TokenizerError, shown
from ..markup.collector import collector_paused
from .vocabulary import Vocabulary, byte_to_char, join_bytes, refuse_lone_surrogates, usable_cores

__all__ = ["KIMI_PATTERN", "RESERVED_NAME", "TiktokenVocabulary", "find_vocab_file", "load_tiktoken"]

# The pre-tokenizer regex of Kimi's tiktoken tokenizer (it lives in the
# model's Python code, not in any file of the folder). The ids of a text
# depend on every character of it.
KIMI_PATTERN = "|".join((
    # Runs of Han characters, apart from everything else.
    r"[\p{Han}]+",
    # A word: an optional leading symbol, upper-case-like letters, then
    # lower-case-like ones (Han excluded), and an English contraction.
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    # The same with at least one upper-case-like letter and maybe no lower.
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    # Digits, at most three to a piece.
    r"\p{N}{1,3}",
    # Punctuation with an optional leading space and trailing newlines.
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    # Whitespace ending in newlines; whitespace not followed by text; the rest.
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
))

# How Kimi's tokenizer names an id of the special range that the config
# leaves unnamed.
RESERVED_NAME = "<|reserved_token_{}|>"

# Bytes that the UTF-8 of some text can hold. tiktoken aborts the process
# (a Rust panic, not an exception) on a byte without a rank, so a vocabulary
# that lacks one of these is refused when it is loaded.
_UTF8_BYTES = frozenset([*range(0x00, 0xC0), *range(0xC2, 0xF5)])


def find_vocab_file(folder: Path) -> Path | None:
    """The tiktoken vocabulary of a model folder: ``tiktoken.model``, else
    its one ``*.tiktoken`` file."""
    named = folder / "tiktoken.model"
    if named.is_file():
        return named
    found = sorted(p for p in folder.glob("*.tiktoken") if p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise TokenizerError(f"model folder {str(folder)!r} has several tiktoken vocabularies ({names}); "
                             "name the one to use in a tiktoken.model file or pass a folder with one")
    return found[0] if found else None


def is_tiktoken_file(path: Path) -> bool:
    """Whether a file looks like tiktoken ranks rather than JSON (which
    starts with ``{``)."""
    try:
        with path.open("rb") as f:
            head = f.read(256).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError as e:
        raise TokenizerError(f"cannot read tokenizer {str(path)!r}: {e.strerror or e}") from None
    return not head.startswith(b"{")


def read_ranks(path: Path) -> dict[bytes, int]:
    """The ranks of a tiktoken BPE file, checked: every line base64 and a
    rank, no token or rank twice, ranks ``0..n-1``, every byte that UTF-8
    text can hold ranked."""
    where = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenizerError(f"cannot read tiktoken vocabulary {where!r}: {e.strerror or e}") from None

    def bad(line: int, reason: str) -> TokenizerError:
        return TokenizerError(f"not a tiktoken BPE file {where!r}: line {line}: {reason}")

    ranks: dict[bytes, int] = {}
    line_of: dict[int, int] = {}
    for no, raw in enumerate(data.split(b"\n"), 1):
        fields = raw.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise bad(no, f"expected a base64 token, a space and a rank, got {_line(raw)}")
        token_b64, rank_text = fields
        try:
            token = binascii.a2b_base64(token_b64, strict_mode=True)
        except binascii.Error:
            raise bad(no, f"{_line(token_b64)} is not base64") from None
        if not token:
            raise bad(no, "the token is empty")
        if not rank_text.isdigit():
            raise bad(no, f"the rank {_line(rank_text)} is not a non-negative integer")
        rank = int(rank_text)
        if token in ranks:
            raise bad(no, f"token {token!r} already has rank {ranks[token]} (line {line_of[ranks[token]]})")
        if rank in line_of:
            raise bad(no, f"rank {rank} is already given to line {line_of[rank]}")
        ranks[token] = rank
        line_of[rank] = no
    if not ranks:
        raise TokenizerError(f"not a tiktoken BPE file {where!r}: it holds no tokens")
    n = len(ranks)
    if max(line_of) != n - 1:
        # Ranks are also ids, and the added tokens are numbered after them.
        gap = next(r for r in range(n) if r not in line_of)
        raise TokenizerError(f"tiktoken vocabulary {where!r} skips rank {gap}: the ranks must be 0..{n - 1}")
    missing = sorted(b for b in _UTF8_BYTES if bytes([b]) not in ranks)
    if missing:
        shown = " ".join(f"0x{b:02X}" for b in missing[:8]) + (" …" if len(missing) > 8 else "")
        raise TokenizerError(f"tiktoken vocabulary {where!r} has no token for the single bytes {shown}: "
                             "text holding them could not be encoded")
    return ranks


def _line(raw: bytes) -> str:
    # A line of a vocabulary file, as text: the file is read as bytes.
    return shown(raw.decode("utf-8", "replace").strip(), 60)


def read_added(config: Path, base: int) -> dict[int, tuple[str, bool]]:
    """id → (content, special) of the added tokens a ``tokenizer_config.json``
    declares, every one at or past the ``base`` ranks. An entry without a
    ``special`` flag counts as special: in a tiktoken vocabulary every added
    id is a special token of the encoding."""
    where = str(config)
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except OSError as e:
        raise TokenizerError(f"cannot read {where!r}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TokenizerError(f"cannot read {where!r}: not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise TokenizerError(f"cannot read {where!r}: invalid JSON at line {e.lineno}, column {e.colno}: "
                             f"{e.msg}") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{where!r} is not a JSON object")
    decoder = data.get("added_tokens_decoder", {})
    if not isinstance(decoder, dict):
        raise TokenizerError(f"{where!r}: added_tokens_decoder is not an object of id → token")
    added: dict[int, tuple[str, bool]] = {}
    seen: dict[str, int] = {}
    for key, entry in decoder.items():
        at = f"{where!r}: added_tokens_decoder[{key!r}]"
        if not (isinstance(key, str) and key.isdigit()):
            raise TokenizerError(f"{at}: the key is not a token id")
        i = int(key)
        if isinstance(entry, str):
            content, special = entry, True
        elif isinstance(entry, dict) and isinstance(entry.get("content"), str):
            content, special = entry["content"], bool(entry.get("special", True))
        else:
            raise TokenizerError(f"{at}: expected an object with a string 'content'")
        if not content:
            raise TokenizerError(f"{at}: the content is empty")
        if i < base:
            raise TokenizerError(f"{at}: id {i} is a BPE rank of the vocabulary, which has ranks 0..{base - 1}")
        if content in seen:
            raise TokenizerError(f"{at}: {content!r} is also token {seen[content]}")
        seen[content] = i
        added[i] = (content, special)
    return added


class TiktokenVocabulary(Vocabulary):
    """A vocabulary over a ``tiktoken.Encoding``, built from ranks as
    :func:`read_ranks` checks them (ranks ``0..n-1``, every UTF-8 byte).

    Ordinary text goes through ``encode_ordinary``, so it gets exactly the
    ids tiktoken gives and no special-token literal in it is matched. Ids
    ``0..n-1`` are the ranks; the added tokens follow, and ids between the
    ranks and the highest added id that no token names are reserved special
    tokens (as Kimi's tokenizer names them), so the ids stay contiguous.
    """

    def __init__(
        self,
        ranks: dict[bytes, int],
        added: Mapping[int, tuple[str, bool]],
        pattern: str,
        source: str = "<tiktoken>",
    ) -> None:
        try:
            import tiktoken
        except ImportError as e:  # pragma: no cover - a declared dependency
            raise TokenizerError("the 'tiktoken' package is required for tiktoken vocabularies") from e
        base = len(ranks)
        low = [i for i in added if i < base]
        if low:
            raise TokenizerError(f"{source!r}: added token id {min(low)} is a BPE rank (ranks are 0..{base - 1})")
        names = {content for content, _ in added.values()}
        full: dict[int, tuple[str, bool]] = {}
        for i in range(base, max(added, default=base - 1) + 1):
            entry = added.get(i)
            if entry is None:
                name = RESERVED_NAME.format(i)
                if name in names:
                    raise TokenizerError(f"{source!r}: the added token {name!r} is not at id {i}, "
                                         "the id its name reserves")
                entry = (name, True)
            full[i] = entry
        try:
            self._enc = tiktoken.Encoding(
                Path(source).name,
                pat_str=pattern,
                mergeable_ranks=ranks,
                special_tokens={content: i for i, (content, _) in full.items()},
            )
        except ValueError as e:
            raise TokenizerError(f"cannot load tokenizer {source!r}: the pre-tokenizer pattern does not "
                                 f"compile: {e}") from None
        self.source = source
        self.pattern = pattern
        self._ranks = ranks
        self._full = full
        self._size = base + len(full)
        self._added = {content: (i, special) for i, (content, special) in full.items()}
        table = [b""] * self._size
        for token, i in ranks.items():
            table[i] = token
        for i, (content, _) in full.items():
            table[i] = content.encode("utf-8")
        self._table = self._bytes = table
        self._encode_one = self._enc.encode_ordinary

    @property
    def ranks(self) -> Mapping[bytes, int]:
        """The BPE ranks: token bytes → id."""
        return self._ranks

    def added_tokens(self) -> list[str]:
        """The added tokens (reserved ones included), in id order from the
        last rank on."""
        return [self._full[i][0] for i in sorted(self._full)]

    def ids_of(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text encoded on its own as ordinary text (new lists)."""
        # tiktoken replaces a lone surrogate with U+FFFD without a word, and
        # the ids would no longer decode to the text.
        refuse_lone_surrogates(texts, self.source)
        # One call per text: encode_ordinary_batch starts a thread pool per
        # call, which costs far more than the encoding of chat-sized texts.
        enc = self._encode_one
        with collector_paused():
            return [enc(t) for t in texts]

    def fast_bpe(self) -> Any:
        """False: the text is tiktoken's already."""
        return False

    def overlaps(self) -> bool:
        """tiktoken encodes each text on the calling thread without the GIL:
        another core can always take a batch while the caller renders."""
        return usable_cores() > 1

    def decode_batch(self, runs: list[Sequence[int]]) -> list[str]:
        """Each run of ids decoded on its own (invalid UTF-8 replaced, as
        tiktoken's ``decode`` does)."""
        table = self._table
        n = self._size
        out: list[str] = []
        for run in runs:
            if run and (min(run) < 0 or max(run) >= n):
                bad = next(t for t in run if not 0 <= t < n)
                raise ValueError(f"{shown(bad)} is not a token id of this tokenizer")
            out.append(join_bytes(table, run).decode("utf-8", "replace"))
        return out

    def decode_runs(self, runs: list[Sequence[int]]) -> list[str]:
        """:meth:`decode_batch` of ids known to be in range."""
        # tiktoken's own decode_bytes (one call into Rust a run) is faster
        # than joining bytes from the table once a run has a dozen ids.
        db = self._enc.decode_bytes
        table = self._table
        return [(db(run) if len(run) > 12 else join_bytes(table, run)).decode("utf-8", "replace") for run in runs]

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_batch([ids])[0]

    def byte_table(self) -> list[bytes]:
        """The bytes of every id (an added token's are its UTF-8)."""
        return self._table

    def id_to_token(self, i: int) -> str | None:
        """The token of an id: an added token's content, or a rank's bytes
        in the byte-level alphabet (as Hugging Face tokenizers spell them)."""
        if not 0 <= i < self._size:
            return None
        entry = self._full.get(i)
        if entry is not None:
            return entry[0]
        alphabet = _alphabet()
        return "".join(alphabet[b] for b in self._table[i])

    def encode_with_specials(self, text: str) -> list[int]:
        """Ids of ``text`` with every added token's literal matched, as an
        engine that tokenizes rendered text does (never used for user text)."""
        refuse_lone_surrogates((text,), self.source)
        return list(self._enc.encode(text, allowed_special="all"))

    def with_special_tokens(self, tokens: Iterable[str]) -> TiktokenVocabulary:
        """A copy with ``tokens`` as special tokens: new ones get the ids after
        the last one, an added token that is not special becomes special."""
        return TiktokenVocabulary(self._ranks, _with_specials(self._full, len(self._ranks), tokens), self.pattern,
                                  self.source)

    @property
    def tokenizer(self) -> Any:
        """The underlying ``tiktoken.Encoding``. Its ``encode`` refuses text
        that holds a special-token literal unless told otherwise."""
        return self._enc


@cache
def _alphabet() -> dict[int, str]:
    return byte_to_char()


def _with_specials(
    added: Mapping[int, tuple[str, bool]], base: int, tokens: Iterable[str]
) -> dict[int, tuple[str, bool]]:
    """``added`` with ``tokens`` special: new ones after the highest id."""
    out = dict(added)
    by_content = {content: i for i, (content, _) in out.items()}
    nxt = max(out, default=base - 1) + 1
    for t in dict.fromkeys(tokens):
        i = by_content.get(t)
        if i is None:
            out[nxt] = (t, True)
            by_content[t] = nxt
            nxt += 1
        else:
            out[i] = (t, True)
    return out


def load_tiktoken(
    vocab_file: Path, config: Path | None, pattern: str | None, add_special_tokens: Iterable[str] = ()
) -> TiktokenVocabulary:
    """A vocabulary from tiktoken ranks, the added tokens of a
    ``tokenizer_config.json`` if given, and ``add_special_tokens`` after them;
    ``pattern`` defaults to :data:`KIMI_PATTERN`."""
    ranks = read_ranks(vocab_file)
    added = read_added(config, len(ranks)) if config is not None else {}
    added = _with_specials(added, len(ranks), add_special_tokens)
    return TiktokenVocabulary(ranks, added, KIMI_PATTERN if pattern is None else pattern, str(vocab_file))
