"""tiktoken's BPE under a tokenizers vocabulary (xtml.vocab.fastbpe): the
library's ids on every text it takes, the library itself on every other."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import xtml
from tests.helpers.families import chatml_requests, smollm2_gguf
from tests.helpers.tokenizers import deepseek_path
from xtml.vocab import fastbpe, vocabulary

# Every kind of character the pre-tokenizers tell apart: letters of several
# scripts and cases, digits of several systems, whitespace of every sort,
# combining marks, emoji, controls, punctuation and the apostrophe forms.
_ALPHABET = (" \t\n\r\x0b\x0c\x85\u00a0\u2028\u3000 0123456789٣४abcXYZ'sé中文日本語ｶﾀ한국어😀🙂\u0301\u200b"
             ".,;!?-_\"'{}[]()<|>/\\\x00\x04\x7fſǅ")
_TEXTS = st.text(alphabet=st.sampled_from(_ALPHABET) | st.characters(codec="utf-8"), max_size=60)


def _library(path_or_tok: Any) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path_or_tok) if isinstance(path_or_tok, str) else path_or_tok
    tok.encode_special_tokens = True
    return tok


def _fast(tok: Any) -> fastbpe.FastBPE:
    added = [t.content for t in tok.get_added_tokens_decoder().values() if not t.special]
    made = fastbpe.build(tok.to_str(), added)
    assert isinstance(made, fastbpe.FastBPE), made
    return made


def _corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    root = Path(__file__).resolve().parents[1]
    prose = (root / "spec.md").read_text(encoding="utf-8") + (root / "docs" / "families.md").read_text(encoding="utf-8")
    out = ["", " ", "  ", "\n\nx", " 12345 678", "a  5", "x\u0301", "Hello World!\n\n\tdef f(x):\n    return 2*x\n"]
    out += ["".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(1, 50))) for _ in range(1500)]
    out += [prose[a : a + rng.randrange(1, 4000)] for a in (rng.randrange(len(prose)) for _ in range(150))]
    return out


@pytest.fixture(scope="module")
def deepseek() -> tuple[Any, fastbpe.FastBPE]:
    tok = _library(deepseek_path())
    return tok, _fast(tok)


@pytest.fixture(scope="module")
def smollm2() -> tuple[Any, fastbpe.FastBPE]:
    from tokenizers import Tokenizer

    vocab = xtml.load_tokenizer(smollm2_gguf())
    tok = _library(Tokenizer.from_str(vocab.tokenizer.to_str()))
    return tok, _fast(tok)


@pytest.fixture(scope="module")
def gpt2_style(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, fastbpe.FastBPE]:
    from tests.helpers.tokenizers import tiny_tokenizer_json

    tok = _library(tiny_tokenizer_json(str(tmp_path_factory.mktemp("tiny"))))
    return tok, _fast(tok)


@pytest.mark.parametrize("name", ["deepseek", "smollm2", "gpt2_style"])
def test_the_librarys_ids_on_a_corpus(name: str, request: pytest.FixtureRequest) -> None:
    tok, fast = request.getfixturevalue(name)
    taken = 0
    for text in _corpus(7):
        got = fast.ids(text)
        if got is None:
            continue
        taken += 1
        assert got == tok.encode(text, add_special_tokens=False).ids, repr(text)
    assert taken > 1000  # most of the corpus is text tiktoken takes


@pytest.mark.parametrize("name", ["deepseek", "smollm2"])
@given(text=_TEXTS)
def test_the_librarys_ids_on_any_text(name: str, text: str, request: pytest.FixtureRequest) -> None:
    tok, fast = request.getfixturevalue(name)
    got = fast.ids(text)
    if got is not None:
        assert got == tok.encode(text, add_special_tokens=False).ids


def test_a_batch_on_two_threads_is_the_batch_on_one(deepseek: tuple[Any, fastbpe.FastBPE]) -> None:
    tok, fast = deepseek
    texts = [t for t in _corpus(3) if len(t) > 1500][:20]
    assert sum(map(len, texts)) >= fastbpe._PARALLEL_CHARS
    assert fast.ids_many(texts) == [fast.ids(t) for t in texts]
    assert fast.ids_many(texts) == [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def test_text_the_library_must_encode_is_left_to_it(smollm2: tuple[Any, fastbpe.FastBPE]) -> None:
    _, fast = smollm2
    # SmolLM2's vocabulary has no token for the byte 0x04 (the library
    # drops the character; tiktoken would stop the process).
    assert fast.ids("a\x04b") is None
    assert fast.ids("a\ud800b") is None  # a lone surrogate
    assert fast.ids("ab") is not None


def test_a_non_special_added_token_is_left_to_the_library(tmp_path: Path) -> None:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(deepseek_path())
    tok.add_tokens([AddedToken("<tool_call>", special=False)])
    fast = _fast(tok)
    assert fast.ids("x <tool_call> y") is None
    vocab = xtml.Vocabulary(tok)
    vocab.fast_bpe()
    lib = _library(Tokenizer.from_str(tok.to_str()))
    for text in ("x <tool_call> y", "plain", "x <tool_call"):
        assert vocab.encode_texts([text]) == [lib.encode(text, add_special_tokens=False).ids]


def _bpe_json(merges: list[list[str]], extra: dict[str, Any] | None = None, *, backwards: bool = False) -> str:
    """A byte-level BPE over every byte and ``merges``; ``backwards``: the
    tokens the merges make numbered from the end (ids out of the merges'
    order, as a vocabulary may number them)."""
    from xtml.vocab.bytelevel import byte_to_char

    chars = [byte_to_char()[b] for b in range(256)]
    vocab = {c: i for i, c in enumerate(chars)}
    made = list(dict.fromkeys(a + b for a, b in merges))
    for k, t in enumerate(reversed(made) if backwards else made):
        vocab.setdefault(t, 256 + k)
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                                "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": merges}}
    spec["model"].update(extra or {})
    return json.dumps(spec)


def test_merges_tiktoken_would_not_follow_keep_the_library() -> None:
    from tokenizers import Tokenizer

    # "abc": the list joins b+c first, then has no pair for (a, bc); tiktoken
    # would join a+bc, whose bytes are a token ("abc", listed as ab+c).
    saved = _bpe_json([["b", "c"], ["a", "b"], ["ab", "c"]])
    assert fastbpe.build(saved, []) == "tiktoken's BPE would join parts the merge list does not pair"
    tok = Tokenizer.from_str(saved)
    vocab = xtml.Vocabulary(tok)
    assert vocab.fast_bpe() is False
    assert vocab.encode_texts(["abc"]) == [tok.encode("abc").ids] == [[tok.token_to_id("a"), tok.token_to_id("bc")]]
    # The same tokens merged in an order tiktoken follows.
    assert isinstance(fastbpe.build(_bpe_json([["a", "b"], ["b", "c"], ["ab", "c"]]), []), fastbpe.FastBPE)


@pytest.mark.parametrize(("extra", "why"), [
    ({"dropout": 0.1}, "dropout"),
    ({"continuing_subword_prefix": "##"}, "word prefix"),
    ({"byte_fallback": True}, "byte fallback"),
])
def test_what_tiktoken_cannot_do_is_refused_with_why(extra: dict[str, Any], why: str) -> None:
    made = fastbpe.build(_bpe_json([["a", "b"]], extra), [])
    assert isinstance(made, str) and why in made


def test_pre_tokenizers_and_normalizers_tiktoken_cannot_follow() -> None:
    spec = json.loads(_bpe_json([["a", "b"]]))
    spec["normalizer"] = {"type": "Lowercase"}
    assert fastbpe.build(json.dumps(spec), []) == "a normalizer other than NFC"
    spec["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}]}
    assert isinstance(fastbpe.build(json.dumps(spec), []), fastbpe.FastBPE)
    spec["pre_tokenizer"] = {"type": "Whitespace"}
    assert fastbpe.build(json.dumps(spec), []) == "the pre-tokenizer does not end in ByteLevel"
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Removed", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}
    made = fastbpe.build(json.dumps(spec), [])
    assert isinstance(made, str) and "isolating split" in made
    spec["pre_tokenizer"] = json.loads(_bpe_json([]))["pre_tokenizer"]
    spec["model"]["merges"] = [["a", "b"], ["x", "ab"]]  # "xab" is no token
    assert fastbpe.build(json.dumps(spec), []) == "a merge whose result is not a token"


def test_nfc_is_applied_before_the_split() -> None:
    from tokenizers import Tokenizer

    spec = json.loads(_bpe_json([["Ã", "©"]]))  # é's two bytes, one token
    spec["normalizer"] = {"type": "NFC"}
    tok = Tokenizer.from_str(json.dumps(spec))
    fast = fastbpe.build(json.dumps(spec), [])
    assert isinstance(fast, fastbpe.FastBPE)
    for text in ("e\u0301", "caf\u00e9", "cafe\u0301 x"):
        assert fast.ids(text) == tok.encode(text).ids


def test_a_vocabulary_takes_it_after_a_million_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenizers import Tokenizer

    monkeypatch.setattr(vocabulary, "_FAST_AFTER", 1000)
    vocab = xtml.Vocabulary(Tokenizer.from_file(deepseek_path()))
    lib = _library(deepseek_path())
    texts = [t for t in _corpus(5) if t][:200]
    got = [vocab.encode_texts([t])[0] for t in texts]
    assert vocab._fast  # made on the way
    assert got == [lib.encode(t, add_special_tokens=False).ids for t in texts]
    # A lone surrogate is still refused by name, not replaced.
    with pytest.raises(xtml.TokenizerError, match="lone surrogate"):
        vocab.encode_texts(["x\udc80" * 40])


def test_every_family_request_renders_the_same_ids_either_way() -> None:
    """The rendered prompts of the generated family requests, over
    DeepSeek V3's vocabulary, with tiktoken's BPE and with the library's."""
    from tokenizers import Tokenizer

    t = xtml.load("deepseek-v3.1")
    base = Tokenizer.from_file(deepseek_path())
    slow = xtml.Vocabulary(base)
    fast = xtml.Vocabulary(base)
    assert fast.fast_bpe()
    n = 0
    for req in chatml_requests(11, 300):
        try:
            want = t.encode(req, slow)
        except xtml.XtmlError:
            continue
        assert t.encode(req, fast) == want
        n += 1
    assert n > 80
    assert slow._fast is None  # the other one never switched


def test_ids_out_of_the_merges_order_are_translated() -> None:
    from tokenizers import Tokenizer

    merges = [["a", "b"], ["b", "c"], ["ab", "c"], ["Ġ", "c"], ["Ġc", "c"], ["c", "c"], ["cc", "cc"]]
    saved = _bpe_json(merges, backwards=True)
    tok = Tokenizer.from_str(saved)
    fast = fastbpe.build(saved, [])
    assert isinstance(fast, fastbpe.FastBPE) and fast._to_id is not None
    rng = random.Random(3)
    for _ in range(500):
        text = "".join(rng.choice("abc c1") for _ in range(rng.randrange(12)))
        assert fast.ids(text) == tok.encode(text).ids, text


def test_a_vocabulary_with_it_still_pickles(deepseek: tuple[Any, fastbpe.FastBPE]) -> None:
    import pickle

    from tokenizers import Tokenizer

    vocab = xtml.Vocabulary(Tokenizer.from_file(deepseek_path()))
    assert vocab.fast_bpe()
    again = pickle.loads(pickle.dumps(vocab))
    assert again.encode_texts(["pickled 12345 x"]) == vocab.encode_texts(["pickled 12345 x"])


def test_merges_out_of_order_and_tokens_made_twice() -> None:
    from tokenizers import Tokenizer

    # A part made by a later merge (as a list converted from tiktoken's
    # ranks orders its merges): tiktoken merges by rank all the same.
    saved = _bpe_json([["a", "bc"], ["b", "c"]])
    fast = fastbpe.build(saved, [])
    assert isinstance(fast, fastbpe.FastBPE)
    tok = Tokenizer.from_str(saved)
    for text in ("abc", "bcabc", "ab c", "abcbc"):
        assert fast.ids(text) == tok.encode(text).ids, text
    # One token made by two merges (a converter that lists every split of
    # a token does so): the library orders the two, tiktoken cannot.
    made = fastbpe.build(_bpe_json([["a", "b"], ["b", "c"], ["ab", "c"], ["a", "bc"]]), [])
    assert made == "a token made by two merges"
    assert fastbpe.build(_bpe_json([["a", "bx"]]), []) == "a merge of a part no merge makes"


# Whitespace runs of every length and kind before words, digits, punctuation,
# apostrophes and the end: where GPT-2's split read without its lookahead is
# cut.
_SPACED = st.lists(st.sampled_from([" ", "\n", "\t", "\u3000", "\u00a0", "\x85", "\r\n", "a", "Ab", "7", "12", "٣", "४",
                                    ".", "'s", "'", "中", "\u0301", "😀", "\x1c"]), max_size=24).map("".join)


@pytest.mark.parametrize("name", ["smollm2", "gpt2_style"])
@given(text=_SPACED)
def test_gpt2s_split_without_its_lookahead_is_the_librarys(name: str, text: str,
                                                          request: pytest.FixtureRequest) -> None:
    tok, fast = request.getfixturevalue(name)
    assert fast.cut  # GPT-2's split, with its last branch (gpt2_style) and without (SmolLM2's)
    got = fast.ids(text)
    if got is not None:
        assert got == tok.encode(text, add_special_tokens=False).ids, repr(text)


def test_the_whitespace_it_cuts_at_is_the_librarys() -> None:
    """The cut's whitespace is the library's \\s (Oniguruma's), as tiktoken's
    is: Unicode's White_Space, not ``re``'s own \\s."""
    import re

    from tokenizers import Regex, pre_tokenizers

    chars = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    kept = pre_tokenizers.Split(Regex(r"\s"), "removed").pre_tokenize_str(chars)
    library = set(chars) - set("".join(s for s, _ in kept))
    ours = set(re.findall(f"[{fastbpe._WS}]", chars))
    assert ours == library
    assert len(ours) == 25
