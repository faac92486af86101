"""Writes examples/tokenizer.json: a small byte-level BPE whose special
tokens are the kimi-k3 template's markers, so that the README's commands
that take `--tokenizer` run from a clone with no model at hand.

Byte-level, so any text encodes (ids for every byte, merges learnt from the
example files); the markers are special tokens, as in a real model's
tokenizer.json. It stands in for one: ids from it mean nothing to a model.

    python examples/make_tokenizer.py            # from the clone, after `pip install -e .`

Training is deterministic: the same example files give the same file, which
tests/test_readme.py checks against the one committed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import xtml

HERE = Path(__file__).parent
OUT = HERE / "tokenizer.json"
SOURCES = ("chat.json", "request.json", "prompt.txt", "completion.txt")
VOCAB_SIZE = 1000
"""An upper bound: the example files hold fewer merges than this."""


def corpus(template: xtml.Template) -> list[str]:
    """The example files as written, and the example requests as the
    template renders them (the element and attribute names it writes)."""
    texts = [(HERE / name).read_text(encoding="utf-8") for name in SOURCES]
    for name in ("chat.json", "request.json"):
        texts.append(template.render(json.loads((HERE / name).read_text(encoding="utf-8"))).text)
    return texts


def make(template_name: str = "kimi-k3") -> Tokenizer:
    template = xtml.load(template_name)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus(template), trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        special_tokens=list(template.markers.all())))
    return bpe


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    out.write_text(make().to_str() + "\n", encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
