"""The one-pass fast path over ids agrees with the general lexer and driver."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import xtml
from tests.conftest import k3_vocab, load_cases, request_of
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
