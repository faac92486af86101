"""What the playground's views cost, counted rather than timed: the
tokenizer work of a render with marker literals in its text, and the size of
a replayed stream's answer, each at one size and four times it, in the same
run."""

from __future__ import annotations

import json

import pytest

import xtml
from tests.helpers.playground import Counted
from xtml.playground.views import MAX_IDS, MAX_TEXT, FieldError, Session, default_tokenizer

K3 = xtml.load("kimi-k3")


@pytest.fixture(scope="module")
def small() -> xtml.Vocabulary:
    return default_tokenizer(K3)


def literal_request(n: int) -> str:
    """A user message of about ``n`` * 600 characters with ``n`` marker
    literals spread through it and one at its very end."""
    words = "the quick brown fox jumps over a lazy dog, then naps near the river bank. "
    part = (words * 8) + "say <|end_of_msg|> please. "
    return json.dumps({"messages": [{"role": "user", "content": part * n + "<|close|>"},
                                    {"role": "assistant", "content": "ok <|open|> " + words * n}]})


@pytest.mark.parametrize("byte_table", [True, False], ids=["byte-table", "offsets"])
def test_marker_literals_cost_what_the_text_does(small: xtml.Vocabulary, monkeypatch: pytest.MonkeyPatch,
                                                 byte_table: bool) -> None:
    if not byte_table:
        monkeypatch.setattr(small, "byte_table", lambda: [])
    session = Session(small)
    session.render({"request": literal_request(1)})  # the binding and its tables, made once
    counts = Counted(small, monkeypatch)
    work = []
    for n in (8, 32):
        counts.chars = counts.ids = 0
        got = session.render({"request": literal_request(n)})
        assert len(got["ambiguous"]) == n + 2
        for a in got["ambiguous"]:
            first, last = a["tokens"]
            literal = "".join(t["text"] for t in got["tokens"][first : last + 1])
            assert a["marker"] in literal, (a, literal)
            assert not any(t["marker"] for t in got["tokens"][first : last + 1])
        work.append(counts.work)
    # Linear: four times the text (and the literals) is four times the work
    # (a prefix decoded per token, or the segments before each literal
    # encoded again, made it sixteen).
    assert work[1] <= 4.5 * work[0], work


def held_completion(vocab: xtml.Vocabulary, n: int) -> str:
    """An open marker and ``n`` ids of a tag name that never reaches its
    separator: the stream parser holds every id after the marker (which
    the message's start shows)."""
    binding = K3.bind(vocab)
    x = vocab.encode_texts(["x"])[0]
    assert len(x) == 1
    return json.dumps([binding.marker_ids[K3.markers.open], *x * n])


def test_a_held_tag_makes_a_stream_answer_linear_in_the_completion(small: xtml.Vocabulary) -> None:
    session = Session(small)
    sizes = []
    for n in (300, 1200):
        got = session.stream({"completion": held_completion(small, n), "from": "ids", "delta": 1})
        assert len(got["steps"]) == n + 2
        last = got["steps"][-2]
        # What is held is said once per step by its extent and reason, not
        # as every held token again.
        assert (last["held_from"], last["held"]) == (1, n) and last["why"]
        sizes.append(len(json.dumps(got)))
    # Four times the completion: four times the answer (it was sixteen).
    assert sizes[1] <= 4.5 * sizes[0], sizes


def test_what_a_view_computes_is_bounded(small: xtml.Vocabulary) -> None:
    session = Session(small)
    big = json.dumps({"messages": [{"role": "user", "content": "x" * MAX_TEXT}]})
    with pytest.raises(FieldError, match=f"more than the {MAX_TEXT:,}") as e:
        session.render({"request": big})
    assert e.value.field == "request"
    for body in ({"completion": "x" * (MAX_TEXT + 1)},
                 {"completion": json.dumps([5] * (MAX_IDS + 1)), "from": "ids"}):
        for view in (session.parse, session.stream):
            with pytest.raises(FieldError, match="the playground reads") as e:
                view(body)
            assert e.value.field == "completion"
    # Just under the bounds, the views answer.
    assert session.parse({"completion": json.dumps([5] * MAX_IDS), "from": "ids"})["tokens"]
