"""The one-pass fast path over ids agrees with the general lexer and driver."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xtml
from tests.conftest import k3_vocab, load_cases, request_of
from tests.test_stream import completions
from xtml.markup.parse import build, build_ids_fast

VECTORS = load_cases("vectors.json")


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
