"""Loading a tokenizer from local files: a tokenizer.json, a tiktoken file
or a model folder (never from the network)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import TokenizerError
from .gguf import is_gguf_file, load_gguf
from .tiktoken import find_vocab_file, is_tiktoken_file, load_tiktoken
from .vocabulary import Vocabulary, add_special

__all__ = ["load_tokenizer"]


def load_tokenizer(
    path: str | os.PathLike[str],
    *,
    add_special_tokens: Iterable[str] = (),
    pattern: str | None = None,
) -> Vocabulary:
    """Load a tokenizer from local files (never from the network).

    ``path`` is one of:

    * a Hugging Face ``tokenizer.json`` file;
    * a GGUF model file: the vocabulary llama.cpp serves with it
      (:mod:`xtml.vocab.gguf`; needs ``pip install 'xtml[gguf]'``);
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
    (:data:`xtml.vocab.tiktoken.KIMI_PATTERN`). Other tiktoken models need
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
            vocab_file = find_vocab_file(p)
            if vocab_file is None:
                raise TokenizerError(f"no tokenizer.json, tiktoken.model or *.tiktoken file in {str(path)!r}")
            if (p / "tokenizer_config.json").is_file():
                config = p / "tokenizer_config.json"
    elif not p.is_file():
        raise TokenizerError(f"no tokenizer.json or tiktoken vocabulary at {str(path)!r}")
    elif is_gguf_file(p):
        if pattern is not None:
            raise TokenizerError(f"pattern= is for tiktoken vocabularies; {str(p)!r} names its own pre-tokenizer")
        return load_gguf(p, add_special_tokens)
    else:
        if is_tiktoken_file(p):
            vocab_file = p
    if vocab_file is not None:
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
        add_special(tok, [t for t in extra if not added.get(t)])
    return Vocabulary(tok, str(p), _copy=False)
