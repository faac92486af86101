"""Parse: conversations and completions, strict errors with offsets, lenient recovery."""

from __future__ import annotations

import pytest

import xtml

THINK_OUT = ('Let me think<|close|>think<|sep|><|open|>response<|sep|>Hi!<|close|>response<|sep|>'
             '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>argument key="x" type="number"<|sep|>'
             '3<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>')
EXPECTED = {"role": "assistant", "content": "Hi!", "reasoning_content": "Let me think", "tool_calls": [
    {"id": "call_0_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 3}'}}]}


def ids_of(k3: xtml.Template, vocab: xtml.Vocabulary, text: str) -> list[int]:
    """Ids of trusted text form (markers become marker ids)."""
    return k3.bind(vocab).encode_segments([xtml.Segment(text, True)])


def test_completion_ids_with_and_without_stop(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    ids = ids_of(k3, vocab, THINK_OUT)
    assert k3.parse(ids, vocab, completion=True) == EXPECTED
    assert k3.parse(ids[:-1], vocab, completion=True) == EXPECTED
    assert k3.parse(THINK_OUT, completion=True) == EXPECTED


def test_completion_non_thinking(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    ids = ids_of(k3, vocab, "ok<|close|>response<|sep|><|close|>message<|sep|>")
    assert k3.parse(ids, vocab, completion=True, thinking=False) == {"role": "assistant", "content": "ok"}


def test_truncated_completion(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    ids = ids_of(k3, vocab, THINK_OUT)
    cut = ids[: ids.index(k3.bind(vocab).marker_ids["<|close|>"], 20)]
    with pytest.raises(xtml.ParseError) as e:
        k3.parse(cut, vocab, completion=True)
    assert e.value.offset == len(cut)
    got = k3.parse(cut, vocab, completion=True, lenient=True)
    assert got["content"] == "Hi!" and got["diagnostics"]
    assert got["diagnostics"][0]["kind"] == "truncated"
    # Cut inside the think channel: reasoning so far comes back.
    early = k3.parse(ids[:2], vocab, completion=True, lenient=True)
    assert early["reasoning_content"] == vocab.decode(ids[:2]) and early["content"] == ""


def test_bad_typed_argument(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    out = THINK_OUT.replace(">3<", ">three<")
    with pytest.raises(xtml.ParseError, match="not JSON"):
        k3.parse(ids_of(k3, vocab, out), vocab, completion=True)
    got = k3.parse(ids_of(k3, vocab, out), vocab, completion=True, lenient=True)
    assert got["tool_calls"][0]["function"]["arguments"] == '{"x": "three"}'
    assert [d["kind"] for d in got["diagnostics"]] == ["bad-argument"]


def test_strict_conversation_errors_are_located(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    text = '<|open|>message role="critic"<|sep|>x<|close|>message<|sep|><|end_of_msg|>'
    with pytest.raises(xtml.ParseError, match="unknown role") as e:
        k3.parse(ids_of(k3, vocab, text), vocab)
    assert e.value.offset == 0 and "message[0]" in str(e.value)
    with pytest.raises(xtml.ParseError, match="line 1, column 1"):
        k3.parse(text)
    lenient = k3.parse(text, lenient=True)
    assert lenient["messages"] == [] and lenient["diagnostics"][0]["kind"] == "unknown-role"


def test_lenient_never_raises_on_garbage(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    b = k3.bind(vocab)
    markers = list(b.kind_of_id)
    soup = [markers[i % len(markers)] if i % 3 else 1000 + i for i in range(200)]
    got = k3.parse(soup, vocab, lenient=True)
    assert isinstance(got["diagnostics"], list) and got["diagnostics"]


def test_unknown_internal_message(k3: xtml.Template) -> None:
    text = '<|open|>message role="system" type="tool-choice"<|sep|>Call whatever.<|close|>message<|sep|><|end_of_msg|>'
    with pytest.raises(xtml.ParseError, match="body this template does not know"):
        k3.parse(text)


def test_parse_needs_tokenizer_for_ids(k3: xtml.Template) -> None:
    with pytest.raises(TypeError):
        k3.parse([1, 2, 3])
