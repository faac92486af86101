"""A vocabulary read from a GGUF model file (xtml.vocab.gguf), on small files
written here with the ``gguf`` package. That it equals llama-server's own
tokenization id for id, on a real model, is tests/test_engine_real_model.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import xtml
from tests.helpers.tokenizers import tiny_tokenizer_json
from xtml.errors import TokenizerError
from xtml.vocab.gguf import PRE_TOKENIZERS

gguf = pytest.importorskip("gguf")


def write(path: Path, *, model: str = "gpt2", pre: str = "smollm", extra: tuple[tuple[str, int], ...] = ()) -> Path:
    """A GGUF holding only a tokenizer: the tiny byte-level BPE's tokens and
    merges, then ``extra`` tokens with their gguf token types."""
    tok = json.loads(Path(tiny_tokenizer_json(str(path.parent))).read_text(encoding="utf-8"))
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    tokens = [by_id[i] for i in range(len(by_id))] + [t for t, _ in extra]
    types = [gguf.TokenType.NORMAL] * len(by_id) + [k for _, k in extra]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tokens_types_and_pre_tokenizer(tmp_path: Path) -> None:
    path = write(tmp_path / "m.gguf", extra=(("<|im_start|>", gguf.TokenType.CONTROL),
                                             ("<tool>", gguf.TokenType.USER_DEFINED)))
    v = xtml.load_tokenizer(path)
    n = v.size
    start, tool = n - 2, n - 1
    assert v.special_id("<|im_start|>") == start
    # A control token spelled in text stays text; a user-defined one is
    # matched, as llama.cpp matches it.
    [ids] = v.encode_texts(["<|im_start|>hello<tool>"])
    assert start not in ids and tool in ids
    # smollm's first split isolates every digit, so no merge spans two.
    [digits] = v.encode_texts(["12345"])
    assert len(digits) == 5
    assert v.decode(v.encode_texts(["hello world 42"])[0]) == "hello world 42"


@pytest.mark.parametrize(("model", "pre", "says"), [
    ("llama", "default", "'llama' tokenizer"),
    ("gpt2", "no-such-pre", "'no-such-pre'"),
])
def test_what_is_not_read_is_a_located_error(tmp_path: Path, model: str, pre: str, says: str) -> None:
    path = write(tmp_path / "m.gguf", model=model, pre=pre)
    with pytest.raises(TokenizerError, match=says) as e:
        xtml.load_tokenizer(path)
    assert str(path) in str(e.value)


def test_a_damaged_file_is_a_tokenizer_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(TokenizerError, match="cannot read the GGUF file"):
        xtml.load_tokenizer(path)


def test_pattern_is_refused_for_gguf(tmp_path: Path) -> None:
    path = write(tmp_path / "m.gguf")
    with pytest.raises(TokenizerError, match="pattern="):
        xtml.load_tokenizer(path, pattern=r"\w+")


def test_every_known_pre_tokenizer_compiles(tmp_path: Path) -> None:
    """Each expression of the table is one ``tokenizers`` accepts (a typo
    would surface only when a model of that kind is loaded)."""
    for pre in sorted(PRE_TOKENIZERS):
        v = xtml.load_tokenizer(write(tmp_path / f"{pre}.gguf", pre=pre))
        [ids] = v.encode_texts(["It's 1234 héllo\n\n  wörld!! 中文"])
        assert v.decode(ids) == "It's 1234 héllo\n\n  wörld!! 中文"
