"""The streaming parser: same answer as the batch parser, whatever the chunking."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import xtml
from tests.strategies import assistant_messages, id_lists, marker_ids, vocab
from tests.test_properties import SLOW, _completion_case

k3 = xtml.load()


def chunked(draw: st.DrawFn, ids: list[int]) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = draw(st.integers(1, 7))
        out.append(ids[i : i + n])
        i += n
    return out


def run(ids: list[int], chunks: list[list[int]] | None, thinking: bool, keep: bool = True) -> list[xtml.StreamEvent]:
    sp = k3.stream(vocab(), thinking=thinking, keep=keep)
    events: list[xtml.StreamEvent] = []
    for chunk in chunks if chunks is not None else [[t] for t in ids]:
        events.extend(sp.feed_many(chunk) if len(chunk) > 1 else sp.feed(chunk[0]))
    events.extend(sp.close())
    return events


def assemble(events: list[xtml.StreamEvent]) -> dict[str, Any]:
    """The message the deltas describe."""
    think = "".join(e.text or "" for e in events if e.type == "text" and e.channel == "think")
    response = "".join(e.text or "" for e in events if e.type == "text" and e.channel == "response")
    msg: dict[str, Any] = {"role": "assistant", "content": response}
    if think:
        msg["reasoning_content"] = think
    calls = [e.call for e in events if e.type == "tool_call_end"]
    if calls:
        msg["tool_calls"] = calls
    return msg


@SLOW
@given(assistant_messages(images=False, name=False), st.booleans(), st.booleans(), st.data())
def test_stream_equals_batch(m: dict[str, Any], thinking: bool, tools: bool, data: st.DataObject) -> None:
    comp, expected = _completion_case(m, thinking, tools)
    for ids in (comp, comp[:-1]):
        events = run(ids, chunked(data.draw, ids), thinking)
        end = events[-1]
        assert end.type == "message_end" and end.message == expected
        assert end.stop_reason == ("tool_calls" if expected.get("tool_calls") else "stop")
        assert [e for e in events if e.type == "diagnostic"] == []
        assert assemble(events) == expected
        assert events[0].type == "message_start"
        # Without keeping the ids, the calls still come whole.
        light = run(ids, None, thinking, keep=False)[-1].message
        assert light is not None and light.get("tool_calls") == expected.get("tool_calls")


@SLOW
@given(assistant_messages(images=False, name=False), st.booleans(), st.data())
def test_truncated_stream(m: dict[str, Any], thinking: bool, data: st.DataObject) -> None:
    comp, _ = _completion_case(m, thinking, False)
    cut = data.draw(st.integers(0, len(comp) - 2))
    ids = comp[:cut]
    events = run(ids, chunked(data.draw, ids), thinking)
    batch = k3.parse(ids, vocab(), completion=True, thinking=thinking, lenient=True)
    batch.pop("diagnostics")
    end = events[-1]
    assert end.message == batch
    assert end.stop_reason == "length"
    assert any(e.type == "diagnostic" and (e.diagnostic or {}).get("kind") == "truncated" for e in events)


@SLOW
@given(id_lists(), st.booleans(), st.data())
def test_stream_never_raises_and_matches_lenient_batch(ids: list[int], thinking: bool, data: st.DataObject) -> None:
    events = run(ids, chunked(data.draw, ids) if ids else None, thinking)
    batch = k3.parse(ids, vocab(), completion=True, thinking=thinking, lenient=True)
    batch.pop("diagnostics")
    (end,) = [e for e in events if e.type == "message_end"]
    assert end.message == batch
    for e in events:
        if e.type == "diagnostic":
            assert e.diagnostic is not None and 0 <= e.diagnostic["offset"] <= len(ids)


def test_text_deltas_are_utf8_safe() -> None:
    text = "日本語🎉é"
    ids = vocab().tokenizer.encode(text, add_special_tokens=False).ids
    sp = k3.stream(vocab(), thinking=False)
    deltas = [e.text for t in ids for e in sp.feed(t) if e.type == "text"]
    assert "".join(d or "" for d in deltas) == text
    assert all("\ufffd" not in (d or "") for d in deltas)


def test_string_argument_with_marker_text_streams_whole() -> None:
    req = [{"role": "user", "content": "w"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "x", "function": {"name": "write", "arguments": {"text": "A<|close|>argument<|sep|>B"}}}]}]
    full = k3.encode(req, vocab(), thinking=False, add_generation_prompt=False)
    prefix = k3.encode(req[:1], vocab(), thinking=False)
    events = run(full[len(prefix):], None, thinking=False)
    deltas = "".join(e.text or "" for e in events if e.type == "argument_delta")
    assert deltas == "A<|close|>argument<|sep|>B"
    (call,) = [e.call for e in events if e.type == "tool_call_end"]
    assert call is not None and json.loads(call["function"]["arguments"]) == {"text": "A<|close|>argument<|sep|>B"}


def test_strict_stream_raises_with_offset() -> None:
    sp = k3.stream(vocab(), thinking=False, lenient=False)
    sep = marker_ids()["<|sep|>"]
    sp.feed(100)
    with pytest.raises(xtml.ParseError) as e:
        sp.feed(sep)
    assert e.value.offset == 1
