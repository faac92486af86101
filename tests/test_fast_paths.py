"""The speed-ups give what the plain paths give: the one-pass tree builder
over ids (what the general lexer and driver give), encoding handed to a
worker thread, the byte table built in one pass and only once it pays, the
range check over ids as characters, and a start-up that imports no grammar
machinery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xtml
import xtml.vocab.binding as binding_module
import xtml.vocab.vocabulary as vocabulary_module
from tests.helpers.cases import load_cases, request_of
from tests.helpers.strategies import completions
from tests.helpers.tokenizers import deepseek_path, k3_vocab
from xtml.markup.parse import build, build_ids_fast
from xtml.vocab.vocabulary import byte_to_char

K3 = xtml.load("kimi-k3")
VECTORS = load_cases("vectors.json")


# -- the one-pass tree builder --------------------------------------------------

def general(b: Any, ids: list[int]) -> xtml.markup.Document | None:
    try:
        return build(b.lex(ids))
    except xtml.ParseError:
        return None


def fast(b: Any, ids: list[int]) -> xtml.markup.Document | None:
    return build_ids_fast(ids, b.kind_of_id, b.vocab.decode_batch, {})


@pytest.mark.parametrize("case", VECTORS, ids=[c["name"] for c in VECTORS])
def test_fast_path_takes_rendered_ids(k3: xtml.Template, case: dict[str, Any]) -> None:
    vocab = k3_vocab()
    b = k3.bind(vocab)
    ids = k3.encode(request_of(case), vocab, **case["kwargs"])
    got = fast(b, ids)
    if any(k == "EMBED_BEGIN" for k in b.lex(ids).kinds):
        assert got is None  # embed spans are left to the general driver
    else:
        assert got is not None and got == general(b, ids)


@given(case=st.sampled_from(VECTORS), data=st.data())
def test_fast_path_never_disagrees_on_mutations(case: dict[str, Any], data: st.DataObject) -> None:
    k3 = xtml.load()
    vocab = k3_vocab()
    b = k3.bind(vocab)
    ids = k3.encode(request_of(case), vocab, **case["kwargs"])
    markers = sorted(b.kind_of_id)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(ids)))
        op = data.draw(st.sampled_from(["drop", "insert", "swap"]))
        if op == "drop" and ids:
            del ids[min(i, len(ids) - 1)]
        elif op == "insert":
            ids.insert(i, data.draw(st.sampled_from([*markers, 64, 300])))
        elif ids:
            j = data.draw(st.integers(0, len(ids) - 1))
            i = min(i, len(ids) - 1)
            ids[i], ids[j] = ids[j], ids[i]
    got = fast(b, ids)
    if got is not None:
        assert got == general(b, ids)
    else:
        # It gives up only on what the general driver refuses, or on embed
        # spans (which it leaves to the general driver).
        assert general(b, ids) is None or any(k == "EMBED_BEGIN" for k in b.lex(ids).kinds)


def _outcome(t: xtml.Template, ids: list[Any], thinking: bool, lenient: bool) -> Any:
    try:
        return t.parse(ids, k3_vocab(), completion=True, thinking=thinking, lenient=lenient)
    except xtml.ParseError as e:
        return ("error", str(e), e.offset)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_completions_parse_the_same_through_the_one_pass_builder(data: st.DataObject) -> None:
    """A completion whose ids are well-formed is read from the one-pass
    tree; with that path switched off, the general lexer and driver give
    the same message, diagnostics and errors (with their offsets), strict
    and lenient, on rendered completions with and without the stop marker
    and on mutated ones."""
    k3 = xtml.load()
    ids, thinking = data.draw(completions(k3, k3_vocab()))
    b = k3.bind(k3_vocab())
    if ids and ids[-1] == b.marker_ids[k3.markers.end] and data.draw(st.booleans()):
        ids = ids[:-1]  # the engine stripped the stop token
    for lenient in (False, True):
        fast_way = _outcome(k3, ids, thinking, lenient)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(type(b), "well_formed", lambda self, xs: None)
            general_way = _outcome(k3, ids, thinking, lenient)
        assert fast_way == general_way


def test_a_rendered_completion_takes_the_one_pass_builder() -> None:
    k3 = xtml.load()
    vocab = k3_vocab()
    b = k3.bind(vocab)
    text = ('Hi.<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="f" '
            'index="1"<|sep|><|open|>argument key="q" type="string"<|sep|>x<|close|>argument<|sep|>'
            "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>")
    ids = k3.completion_ids(text, vocab)
    end = b.marker_ids[k3.markers.end]
    seen: list[bool] = []
    real = type(b).well_formed
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(b), "well_formed", lambda self, xs: seen.append(real(self, xs) is not None) or real(self, xs))
        with_end = k3.parse([*ids, end], vocab, completion=True, thinking=False)
        without = k3.parse(ids, vocab, completion=True, thinking=False)
    assert seen == [True, True]
    assert with_end == without
    assert with_end["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"q": "x"}'}


# -- encoding handed to a worker ----------------------------------------------------

def _long_request(n: int, seed: int) -> dict[str, Any]:
    """A chat with tool calls and results, long enough for several handoffs
    at a small handoff size."""
    import random

    r = random.Random(seed)
    words = ["alpha", "beta", "ünï", "中文", "🎉", "x" * 40, "<|open|>", "42", "3.5", "true"]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for k in range(n):
        text = " ".join(r.choice(words) for _ in range(r.randint(1, 30)))
        msgs.append({"role": "user", "content": text})
        if k % 3 == 0:
            args = {"q": text[:20], "n": r.randint(1, 9)}
            msgs.append({"role": "assistant", "content": "", "reasoning_content": text[::-1],
                         "tool_calls": [{"id": f"c{k}", "type": "function",
                                         "function": {"name": "search", "arguments": json.dumps(args)}}]})
            msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": text.upper()})
        msgs.append({"role": "assistant", "content": text.lower()})
    msgs.append({"role": "user", "content": "and now?"})
    tools = [{"type": "function", "function": {"name": "search", "description": "Search.",
                                               "parameters": {"type": "object", "properties": {
                                                   "q": {"type": "string"}, "n": {"type": "integer"}}}}}]
    return {"messages": msgs, "tools": tools}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_encoding_handed_to_a_worker_gives_the_same_ids(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    vocab = k3_vocab()
    req = _long_request(60, seed)
    whole = K3.encode(req, vocab)
    monkeypatch.setattr(binding_module, "_HANDOFF", 64)
    monkeypatch.setattr(type(vocab), "overlaps", lambda self: True)
    handed: list[int] = []
    real = vocabulary_module.Vocabulary.ids_later

    def counting(self: xtml.Vocabulary, texts: list[str]) -> Any:
        handed.append(len(texts))
        return real(self, texts)

    monkeypatch.setattr(vocabulary_module.Vocabulary, "ids_later", counting)
    assert K3.encode(req, vocab) == whole
    assert len(handed) > 5  # the path under test was taken


def test_training_spans_are_the_same_when_encoding_is_handed_off(monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = k3_vocab()
    req = _long_request(40, 9)
    whole = K3.encode_training(req, vocab)
    monkeypatch.setattr(binding_module, "_HANDOFF", 64)
    monkeypatch.setattr(type(vocab), "overlaps", lambda self: True)
    calls: list[int] = []
    real = vocabulary_module.Vocabulary.ids_later
    monkeypatch.setattr(vocabulary_module.Vocabulary, "ids_later",
                        lambda self, texts: calls.append(len(texts)) or real(self, texts))
    handed = K3.encode_training(req, vocab)
    assert calls  # the path under test was taken
    assert (handed.ids, handed.mask, handed.spans) == (whole.ids, whole.mask, whole.spans)


def test_handoff_follows_the_tokenizers_parallelism(monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = k3_vocab()
    monkeypatch.setattr(vocabulary_module, "usable_cores", lambda: 2)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    assert not vocab.overlaps()  # the library spreads each batch over the cores itself
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    assert vocab.overlaps()
    monkeypatch.setattr(vocabulary_module, "usable_cores", lambda: 1)
    assert not vocab.overlaps()


def test_a_worker_error_reaches_the_caller() -> None:
    vocab = k3_vocab()
    with pytest.raises(xtml.TokenizerError):
        vocab.ids_later(["fine", "lone \ud800 surrogate"])()


def _table_by_token(vocab: xtml.Vocabulary) -> list[bytes]:
    """The byte table the slow way: each token string, character by character."""
    unbyte = {c: b for b, c in byte_to_char().items()}
    tok = vocab.tokenizer
    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    out = [b""] * vocab.size
    for token, i in tok.get_vocab(with_added_tokens=True).items():
        out[i] = token.encode("utf-8") if token in added else bytes(unbyte[c] for c in token)
    return out


def test_byte_table_in_one_pass_is_the_table_token_by_token() -> None:
    vocab = xtml.load_tokenizer(deepseek_path(), add_special_tokens=K3.markers.all())
    assert vocab.byte_table() == _table_by_token(vocab)


def test_byte_table_refuses_a_vocabulary_outside_the_byte_alphabet() -> None:
    from tokenizers import Tokenizer, decoders, models

    tok = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "a b": 2}, merges=[]))  # a raw space: not byte-level
    tok.decoder = decoders.ByteLevel()
    assert xtml.Vocabulary(tok).byte_table() == []


def test_the_byte_table_is_built_once_decoding_pays_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = xtml.load_tokenizer(deepseek_path(), add_special_tokens=K3.markers.all())
    monkeypatch.setattr(vocabulary_module, "_TABLE_AFTER", 1000)
    ids = K3.encode(_long_request(4, 7), vocab)
    runs = [ids[i : i + 37] for i in range(0, len(ids), 37)]
    before = vocab.decode_runs(runs[:2])
    assert vocab._bytes is None  # a short parse does not build it
    while vocab._bytes is None:
        vocab.decode_runs(runs)
    assert vocab.decode_runs(runs[:2]) == before == vocab.tokenizer.decode_batch(runs[:2],
                                                                                 skip_special_tokens=False)
    assert K3.parse(ids, vocab) == K3.normalize(_long_request(4, 7))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-3, 129_300), max_size=40))
def test_ids_out_of_range_are_refused_with_their_offset(ids: list[int]) -> None:
    vocab = k3_vocab()
    b = K3.bind(vocab)
    good = [i for i in ids if 0 <= i < vocab.size]
    bad = [i for i in ids if not 0 <= i < vocab.size]
    try:
        b.document(ids, lenient=True)
    except xtml.ParseError as e:
        assert bad and e.offset == next(k for k, i in enumerate(ids) if not 0 <= i < vocab.size)
    else:
        assert not bad
    if good:
        b.document(good, lenient=True)


def test_an_id_just_past_the_vocabulary_is_refused() -> None:
    vocab = k3_vocab()
    ids = K3.encode({"messages": [{"role": "user", "content": "hi"}]}, vocab)
    with pytest.raises(xtml.ParseError) as e:
        K3.parse([*ids[:3], vocab.size, *ids[3:]], vocab)
    assert e.value.offset == 3


def test_start_up_imports_no_grammar_or_optional_machinery() -> None:
    code = ("import sys, xtml, xtml.cli.main; xtml.load('kimi-k3');"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in"
            " ('lark', 'hypothesis', 'pyarrow', 'pydantic', 'starlette', 'uvicorn', 'httpx', 'aiohttp', 'openai')"
            " or m in ('xtml.training.dataset', 'concurrent.futures.process')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=120)
    assert out.stdout.strip() == "[]"
    # The grammar still loads when asked for.
    from xtml.markup.reference import document_parser, parse_lexemes

    assert document_parser() is not None
    text = K3.render({"messages": [{"role": "user", "content": "hi"}]}, thinking=False).text
    assert parse_lexemes(xtml.markup.lex_text(text, K3.markers)).nodes
