"""What a long-running process keeps: nothing made from a vocabulary outlives
it, and what is kept by name (templates and tokenizers by path) is bounded.

A template is loaded once and shared by the whole process, so anything it
kept per vocabulary would keep every vocabulary ever used with it.
"""

from __future__ import annotations

import gc
import shutil
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

import xtml
from xtml.lru import SIZE, Lru
from xtml.markup.markers import Markers
from xtml.vocab.binding import Binding, bound
from xtml.vocab.vocabulary import byte_vocabulary

K3 = xtml.load("kimi-k3")
HI = {"messages": [{"role": "user", "content": "hi"}]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                      "properties": {"a": {"type": "string"}}}}}
ANSWER = "hello<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"


def _use_everything(vocab: xtml.Vocabulary) -> None:
    """Every path of the library that binds a vocabulary and keeps what it
    derives from it: encode, a training example, a conversation, a stream
    (its prompt lexemes), a parse of ids, the completion grammar (its tables
    of special and text ids), the reasoning count."""
    t = xtml.load("kimi-k3")
    ids = t.encode(HI, vocab)
    t.encode_training({"messages": [*HI["messages"], {"role": "assistant", "content": "yo"}]}, vocab)
    conv = t.conversation(vocab, HI["messages"], thinking=False)
    answer = t.completion_ids(ANSWER, vocab)
    conv.prompt_ids()
    conv.append_completion(answer)
    p = t.stream(vocab, thinking=False)
    p.feed_many(answer)
    p.close()
    assert t.parse(ids, vocab)["messages"] == HI["messages"]
    t.completion_grammar({**HI, "tools": [TOOL]}, vocab, format="llguidance", token_refs="id")
    t.completion_grammar({**HI, "tools": [TOOL]}, vocab, format="gbnf")
    t.reasoning_tokens(answer, vocab, thinking=False)
    t.replace(max_chars=None).encode(HI, vocab)


def _alive(make: Callable[[], Any], rounds: int = 3) -> int:
    refs = []
    for _ in range(rounds):
        v = make()
        _use_everything(v)
        refs.append(weakref.ref(v))
        del v
    gc.collect()
    return sum(r() is not None for r in refs)


def test_a_vocabulary_is_freed_after_use_with_the_shared_template() -> None:
    assert _alive(lambda: byte_vocabulary(K3.markers.all())) == 0


def test_a_vocabulary_without_a_byte_table_is_freed() -> None:
    # The stream looks up the byte tokens of such a vocabulary (<0xE6>), once.
    def make() -> xtml.Vocabulary:
        v = byte_vocabulary(K3.markers.all())
        v._bytes = []  # as a vocabulary of another decoder has
        return v

    assert _alive(make) == 0


def test_a_tokenizer_object_and_its_copy_are_freed() -> None:
    refs: list[weakref.ref[Any]] = []
    for _ in range(3):
        tok = Tokenizer.from_str(byte_vocabulary(K3.markers.all()).tokenizer.to_str())
        vocab = K3.bind(tok).vocab
        _use_everything(vocab)
        refs += [weakref.ref(tok), weakref.ref(vocab)]
        del tok, vocab
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)


def test_bindings_live_on_the_vocabulary_and_are_shared_by_equal_markers() -> None:
    v = byte_vocabulary(K3.markers.all())
    b = K3.bind(v)
    assert K3.bind(v) is b
    # Another template object of the same dialect (a copy with another
    # limit, a fresh one) binds the same way: one binding.
    assert K3.replace(max_chars=10).bind(v) is b
    assert xtml.Template(K3.dialect).bind(v) is b
    assert list(v.derived) == [Binding] and len(v.derived[Binding]) == 1


def test_a_vocabulary_keeps_the_bindings_of_the_last_few_marker_sets() -> None:
    sets = [Markers(open=f"<o{k}|", close=f"<c{k}|", sep=f"<s{k}|", end=f"<e{k}|") for k in range(3 * SIZE)]
    v = byte_vocabulary([m for ms in sets for m in ms.all()])
    refs = []
    for ms in sets:
        b = bound(ms, v)
        assert bound(ms, v) is b
        refs.append(weakref.ref(b))
        del b
    gc.collect()
    assert [r() is not None for r in refs] == [False] * (2 * SIZE) + [True] * SIZE


def _tokenizer_files(tmp: Path, n: int) -> list[Path]:
    v = byte_vocabulary(K3.markers.all())
    first = tmp / "t0" / "tokenizer.json"
    first.parent.mkdir()
    v.tokenizer.save(str(first))
    out = [first]
    for k in range(1, n):
        path = tmp / f"t{k}" / "tokenizer.json"
        path.parent.mkdir()
        shutil.copy(first, path)
        out.append(path)
    return out


def test_tokenizers_loaded_by_path_are_kept_only_for_the_last_few(tmp_path: Path) -> None:
    paths = _tokenizer_files(tmp_path, 3 * SIZE)
    refs = []
    for p in paths:
        vocab = K3.bind(p).vocab
        assert K3.bind(str(p)).vocab is vocab  # kept: loading one takes a second
        refs.append(weakref.ref(vocab))
        del vocab
    gc.collect()
    alive = [r() is not None for r in refs]
    # However many were loaded, the process keeps SIZE of them: the latest.
    assert alive == [False] * (2 * SIZE) + [True] * SIZE
    # One used again moves to the front: loading another drops the oldest.
    again = K3.bind(paths[2 * SIZE]).vocab
    K3.bind(paths[0])
    assert K3.bind(paths[2 * SIZE]).vocab is again
    del again


def test_templates_loaded_by_path_are_kept_only_for_the_last_few(tmp_path: Path) -> None:
    text = (Path(xtml.template.__file__).parent / "dialects" / "kimi-k3.toml").read_text(encoding="utf-8")
    refs = []
    for k in range(3 * SIZE):
        path = tmp_path / f"t{k}.toml"
        path.write_text(text, encoding="utf-8")
        t = xtml.load(path)
        assert xtml.load(path) is t
        refs.append(weakref.ref(t))
        del t
    gc.collect()
    assert [r() is not None for r in refs] == [False] * (2 * SIZE) + [True] * SIZE
    assert xtml.load("kimi-k3") is xtml.load("kimi-k3")


def test_lru_keeps_the_entries_used_last() -> None:
    lru: Lru[str, int] = Lru(3)
    for k, v in zip("abcd", range(4)):
        assert lru.put(k, v) == v
    assert "a" not in lru and len(lru) == 3
    assert lru.get("b") == 1  # b is now the newest
    lru.put("e", 4)
    assert "c" not in lru and lru["b"] == 1 and lru.get("c") is None
    with pytest.raises(KeyError):
        lru["c"]
    lru.clear()
    assert len(lru) == 0
