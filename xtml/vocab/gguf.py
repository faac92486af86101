"""The vocabulary inside a GGUF model file, as llama.cpp serves it.

A GGUF file carries its tokenizer as metadata: the tokens, their types
(normal, control, user-defined, ...), the BPE merges, and the name of a
pre-tokenizer (``tokenizer.ggml.pre``) that llama.cpp maps to a sequence of
split expressions in its own code (``llm_tokenizer_bpe`` of
src/llama-vocab.cpp). The file holds no tokenizer.json, so the same
tokenizer is built here for the ``tokenizers`` library from those parts: a
byte-level BPE over the GGUF's tokens and merges, preceded by the same split
expressions applied one after another (each splits the pieces the previous
one left, and text between matches stays a piece of its own, as
``tokenizers``' ``Split(..., "isolated")`` does). Control tokens become
special tokens (never matched in text by xtml); user-defined tokens become
added tokens, matched in text as llama.cpp matches them.

Only byte-level BPE vocabularies (``tokenizer.ggml.model = "gpt2"``) are
read, with the pre-tokenizers in :data:`PRE_TOKENIZERS`; anything else is a
:class:`~xtml.TokenizerError` naming what the file holds. Reading needs the
``gguf`` package (``pip install 'xtml[gguf]'``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TokenizerError
from .vocabulary import Vocabulary, add_special

__all__ = ["GGUF_MAGIC", "PRE_TOKENIZERS", "is_gguf_file", "load_gguf"]

GGUF_MAGIC = b"GGUF"

# The split expressions llama.cpp applies for each pre-tokenizer name, in its
# order (llama.cpp build 11434, src/llama-vocab.cpp: the names read in
# llama_vocab::impl::load, the expressions in llm_tokenizer_bpe's switch).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK3 = ("\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
              "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
              "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp splits text before BPE for one ``tokenizer.ggml.pre``."""

    splits: tuple[str, ...]
    ignore_merges: bool = False
    """A piece that is a whole token is that token, merges or not (llama.cpp's
    ``ignore_merges``, as the llama3 tokenizer.json says)."""


def _table() -> dict[str, PreTokenizer]:
    groups: list[tuple[tuple[str, ...], PreTokenizer]] = [
        (("default",), PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))),
        (("gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4", "roberta-bpe"), PreTokenizer((_GPT2,))),
        (("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe"),
         PreTokenizer((_LLAMA3,), ignore_merges=True)),
        (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"),
         PreTokenizer((r"\p{N}", _GPT2))),
        (("qwen2", "deepseek-r1-qwen", "stablelm2"), PreTokenizer((_QWEN2,))),
        (("qwen35",), PreTokenizer((_QWEN35,))),
        (("deepseek-v3",), PreTokenizer(_DEEPSEEK3)),
        (("chatglm-bpe",), PreTokenizer((_LLAMA3,))),
        (("glm4", "glm5"), PreTokenizer((_LLAMA3,), ignore_merges=True)),
    ]
    return {name: pre for names, pre in groups for name in names}


PRE_TOKENIZERS: Mapping[str, PreTokenizer] = _table()
"""The pre-tokenizers read, by their GGUF name."""

# llama.cpp's token types (gguf's TokenType): what each becomes here.
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def is_gguf_file(path: Path) -> bool:
    """Whether ``path`` starts with GGUF's magic bytes."""
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _fields(path: Path) -> dict[str, Any]:
    try:
        import gguf
    except ImportError:
        raise TokenizerError(f"reading the GGUF file {str(path)!r} needs the 'gguf' package: "
                             "pip install 'xtml[gguf]'") from None
    try:
        reader = gguf.GGUFReader(path)
        want = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges")
        return {k: reader.fields[k].contents() for k in want if k in reader.fields}
    except Exception as e:  # the reader raises plain ValueError, KeyError, numpy errors on a damaged file
        raise TokenizerError(f"cannot read the GGUF file {str(path)!r}: {type(e).__name__}: {e}") from None


def load_gguf(path: str | os.PathLike[str], add_special_tokens: Iterable[str] = ()) -> Vocabulary:
    """The vocabulary of the GGUF file at ``path``, as llama.cpp tokenizes
    with it (see the module's doc); ``add_special_tokens`` as for
    :func:`~xtml.load_tokenizer`."""
    p = Path(path)
    f = _fields(p)
    where = f"the GGUF file {str(p)!r}"
    model = f.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise TokenizerError(f"{where} holds a {model!r} tokenizer; only byte-level BPE ('gpt2') is read")
    pre_name = f.get("tokenizer.ggml.pre", "default")
    pre = PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        raise TokenizerError(f"{where} names the pre-tokenizer {pre_name!r}, which xtml does not know; "
                             f"known: {', '.join(sorted(PRE_TOKENIZERS))}")
    tokens: list[str] = list(f.get("tokenizer.ggml.tokens") or [])
    types: list[int] = [int(t) for t in f.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)]
    merges: list[str] = list(f.get("tokenizer.ggml.merges") or [])
    if not tokens or len(types) != len(tokens):
        raise TokenizerError(f"{where} has {len(tokens)} tokens and {len(types)} token types")
    ids: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in ids:
            raise TokenizerError(f"{where}: token {i} repeats token {ids[t]} ({t!r})")
        ids[t] = i
    pairs: list[tuple[str, str]] = []
    for k, m in enumerate(merges):
        a, sep, b = m.partition(" ")
        if not sep or a not in ids or b not in ids:
            raise TokenizerError(f"{where}: merge {k} ({m!r}) is not two of its tokens")
        pairs.append((a, b))
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(ids, pairs, ignore_merges=pre.ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # Added in id order, each at the id the file gives it (the content is
    # already in the model's vocabulary, so no new id is made).
    tok.add_tokens([AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False)
                    for i in range(len(tokens)) if types[i] in (_CONTROL, _USER_DEFINED)])
    extra = list(add_special_tokens)
    if extra:
        added = {t.content: bool(t.special) for t in tok.get_added_tokens_decoder().values()}
        add_special(tok, [t for t in extra if not added.get(t)])
    return Vocabulary(tok, str(p), _copy=False)
