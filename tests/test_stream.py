"""The streaming parser: same answer as the batch parser, whatever the chunking."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import xtml
from tests.helpers.strategies import (
    SLOW,
    assistant_messages,
    completion_of,
    completions,
    id_lists,
    marker_ids,
    marker_soup,
    vocab,
)
from xtml import testing as xt
from xtml.chat.template_file import builtin_files
from xtml.codec.stream import StreamState
from xtml.markup.nodes import Document
from xtml.markup.parse import MAX_DEPTH, TreeBuilder, build, lex_text

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
    comp, expected = completion_of(m, thinking, tools)
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
    comp, _ = completion_of(m, thinking, False)
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


# -- stream == batch, by construction and on hostile input --------------------------------

HOSTILE = settings(max_examples=60, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.filter_too_much])
PLACEHOLDER = "<|kimi_image_placeholder|>"


def _stream(t: xtml.Template, tok: xtml.Vocabulary, ids: Sequence[Any], thinking: bool,
            chunks: Sequence[int] = (), **kw: Any) -> list[xtml.StreamEvent]:
    sp = t.stream(tok, thinking=thinking, **kw)
    events: list[xtml.StreamEvent] = []
    i = k = 0
    while i < len(ids):
        size = chunks[k % len(chunks)] if chunks else 1
        events += sp.feed_many(ids[i : i + size]) if size > 1 else sp.feed(ids[i])
        i += size
        k += 1
    events += sp.close()
    return events


def _channel_text(events: list[xtml.StreamEvent], channel: str) -> str:
    return "".join(e.text or "" for e in events if e.type == "text" and e.channel == channel)


def _diag_counts(diags: Iterable[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(d, sort_keys=True) for d in diags)


def check_stream(t: xtml.Template, tok: xtml.Vocabulary, ids: list[Any], thinking: bool,
                 chunks: Sequence[int] = ()) -> None:
    """Everything the stream says is what the batch parser says of the same
    ids (ids that are no token of ``tok`` skipped by both, with a
    diagnostic)."""
    valid = [i for i in ids if type(i) is int and 0 <= i < tok.size]
    end_id = t.bind(tok).marker_ids[t.markers.end]
    # The stream ends at the first end marker: what follows is not read.
    at_end = next((k for k, i in enumerate(ids) if type(i) is int and i == end_id), None)
    cut = valid.index(end_id) + 1 if end_id in valid else len(valid)
    try:
        batch = t.parse(ids if at_end is None else ids[: at_end + 1], tok, completion=True, lenient=True,
                        thinking=thinking)
        assert batch == {**t.parse(valid[:cut], tok, completion=True, lenient=True, thinking=thinking),
                         "diagnostics": batch["diagnostics"]}
    except xtml.ParseError as e:
        # Only nesting past the limit makes a lenient parse refuse; the
        # stream says so and keeps going.
        assert "nested deeper" in e.msg
        events = _stream(t, tok, ids, thinking, chunks)
        assert any((e.diagnostic or {}).get("kind") == "too-deep" for e in events)
        assert events[-1].type in ("message_end", "diagnostic")
        return
    batch_diags = batch.pop("diagnostics")
    events = _stream(t, tok, ids, thinking, chunks)
    assert [e.type for e in events].count("message_start") == 1 and events[0].type == "message_start"
    (end,) = [e for e in events if e.type == "message_end"]
    assert end.message == batch
    assert [e.call for e in events if e.type == "tool_call_end"] == batch.get("tool_calls", [])
    n = t.dialect.names
    assert _channel_text(events, n["think"]) == batch.get("reasoning_content", "")
    if isinstance(batch["content"], str):
        assert _channel_text(events, n["response"]) == batch["content"]
    if cut == len(ids):
        # Nothing after the end: the stream reports what the batch reports.
        assert _diag_counts(e.diagnostic or {} for e in events if e.type == "diagnostic") == _diag_counts(batch_diags)
    light = [e for e in _stream(t, tok, ids, thinking, chunks, keep=False) if e.type == "message_end"]
    assert light[0].message == {"role": "assistant", **({"tool_calls": batch["tool_calls"]}
                                                       if batch.get("tool_calls") else {})}
    if cut == len(ids):
        try:
            strict = t.parse(valid, tok, completion=True, thinking=thinking)
        except xtml.ParseError:
            with pytest.raises(xtml.ParseError):
                _stream(t, tok, ids, thinking, chunks, lenient=False)
        else:
            (strict_end,) = [e for e in _stream(t, tok, ids, thinking, chunks, lenient=False)
                             if e.type == "message_end"]
            assert strict_end.message == strict


@HOSTILE
@given(st.data(), st.lists(st.integers(1, 8), max_size=3))
def test_stream_equals_batch_on_hostile_completions(data: st.DataObject, chunks: list[int]) -> None:
    ids, thinking = data.draw(completions(k3, vocab()))
    check_stream(k3, vocab(), ids, thinking, chunks)


@HOSTILE
@given(st.data(), st.lists(st.integers(1, 8), max_size=3))
def test_stream_equals_batch_when_a_channel_is_left_open(data: st.DataObject, chunks: list[int]) -> None:
    """A model that opens the next channel without closing the last one:
    the batch reader and the stream both take the later channel out to the
    message's level, so a call written after an unclosed response is read."""
    case = xt.completion_case(k3, data.draw(xt.requests(k3)), vocab())
    assume(case is not None)
    assert case is not None
    text = vocab().decode(list(case[0]))
    n = k3.dialect.names
    closes = [c for c in (f"{k3.markers.close}{n[ch]}{k3.markers.sep}" for ch in ("think", "response")) if c in text]
    assume(closes)
    text = text.replace(data.draw(st.sampled_from(closes)), "", 1)
    check_stream(k3, vocab(), k3.completion_ids(text, vocab()), case[2], chunks)


def test_a_call_after_an_unclosed_response_is_read() -> None:
    m = k3.markers
    text = (f"hi{m.open}tools{m.sep}{m.open}call tool=\"f\" index=\"1\"{m.sep}{m.close}call{m.sep}"
            f"{m.close}tools{m.sep}{m.close}response{m.sep}{m.close}message{m.sep}{m.end}")
    ids = k3.completion_ids(text, vocab())
    got = k3.parse(ids, vocab(), completion=True, lenient=True, thinking=False)
    assert got["content"] == "hi" and [c["function"]["name"] for c in got["tool_calls"]] == ["f"]
    assert "unclosed-channel" in [d["kind"] for d in got["diagnostics"]]
    with pytest.raises(xtml.ParseError):
        k3.parse(ids, vocab(), completion=True, thinking=False)
    check_stream(k3, vocab(), ids, False)


# Vocabularies that are not byte-level, built here from a few sentences with
# the K3 markers as special tokens.
CORPUS = ["hello world", "the quick brown fox jumps over", 'key="value" {"a": [1, 2]}', "日本語 テキスト 🎉 é ü",
          "think response tools call argument json message role", "don't, won't. it's! a b c 1 2 3"] * 20


def _with_markers(tok: Any, source: str) -> xtml.Vocabulary:
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in k3.markers.all()])
    return xtml.Vocabulary(tok, source)


@cache
def wordpiece() -> xtml.Vocabulary:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]"]))
    return _with_markers(tok, "<wordpiece>")


@cache
def unigram() -> xtml.Vocabulary:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=200, special_tokens=["<unk>"],
                                                            unk_token="<unk>"))
    return _with_markers(tok, "<unigram>")


@cache
def byte_fallback() -> xtml.Vocabulary:
    """Letters, and every other character as its UTF-8 bytes (``<0xE6>``),
    decoded as Llama-style tokenizers do."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from tokenizers import decoders as dec

    pieces = ["<unk>", *(f"<0x{b:02X}>" for b in range(256)), *"▁abcdefghijklmnopqrstuvwxyz", "he", "ll"]
    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[("h", "e"), ("l", "l")],
                               unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = dec.Sequence([dec.Replace("▁", " "), dec.ByteFallback(), dec.Fuse(), dec.Strip(" ", 1, 0)])
    return _with_markers(tok, "<byte-fallback>")


@cache
def placeholder_as_text() -> xtml.Vocabulary:
    """The deepseek vocabulary with every K3 marker but the image
    placeholder, which it spells as text (as K3's own vocabulary does)."""
    from tests.helpers.tokenizers import deepseek_path

    return xtml.load_tokenizer(deepseek_path(), add_special_tokens=[m for m in k3.markers.all() if m != PLACEHOLDER])


OTHER_VOCABS = {"wordpiece": wordpiece, "unigram": unigram, "byte-fallback": byte_fallback,
                "placeholder-as-text": placeholder_as_text}


@pytest.mark.parametrize("name", sorted(OTHER_VOCABS))
def test_other_vocabularies_are_what_they_claim(name: str) -> None:
    tok = OTHER_VOCABS[name]()
    assert bool(tok.byte_table()) == (name == "placeholder-as-text")
    assert k3.bind(tok).text_marks == ((PLACEHOLDER,) if name == "placeholder-as-text" else ())


@pytest.mark.parametrize("name", sorted(OTHER_VOCABS))
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(data=st.data(), chunks=st.lists(st.integers(1, 8), max_size=3))
def test_stream_equals_batch_with_other_vocabularies(name: str, data: st.DataObject, chunks: list[int]) -> None:
    tok = OTHER_VOCABS[name]()
    ids, thinking = data.draw(completions(k3, tok))
    check_stream(k3, tok, ids, thinking, chunks)


@pytest.fixture(scope="module")
def cited(tmp_path_factory: pytest.TempPathFactory) -> xtml.Template:
    """K3 with the example citation plugin (installed with the test extras)."""
    assert "citation" in xtml.plugins.installed(), "install ./examples/plugins/xtml-citation (see README)"
    path = tmp_path_factory.mktemp("cited") / "cited.toml"
    text = builtin_files()["kimi-k3"].read_text(encoding="utf-8") + '\n[plugins.citation]\nelement = "cite"\n'
    path.write_text(text, encoding="utf-8")
    return xtml.load(path)


@HOSTILE
@given(data=st.data(), chunks=st.lists(st.integers(1, 8), max_size=3))
def test_stream_equals_batch_with_plugin_elements(cited: xtml.Template, data: st.DataObject,
                                                  chunks: list[int]) -> None:
    ids, thinking = data.draw(completions(cited, vocab()))
    check_stream(cited, vocab(), ids, thinking, chunks)


@HOSTILE
@given(marker_soup(), st.booleans())
def test_tree_builder_fed_piecewise_builds_what_build_builds(text: str, lenient: bool) -> None:
    lx = lex_text(text, k3.markers)
    try:
        want: Any = build(lx, lenient=lenient)
    except xtml.ParseError as e:
        want = (e.msg, e.offset)
    tb = TreeBuilder(lenient=lenient)
    try:
        for k, s, o in zip(lx.kinds, lx.texts, lx.offsets):
            tb.lexemes.kinds.append(k)
            tb.lexemes.texts.append(s)
            tb.lexemes.offsets.append(o)
            tb.advance()
            if tb.next == len(tb.lexemes.kinds):
                tb.drop_consumed()
        tb.lexemes.end = lx.end
        got: Any = tb.finish()
    except xtml.ParseError as e:
        got = (e.msg, e.offset)
    assert got == want
    if isinstance(want, Document):
        assert got.diagnostics == want.diagnostics


# -- regressions ----------------------------------------------------------------------------


def _seg(s: str, tok: xtml.Vocabulary | None = None) -> list[int]:
    return k3.bind(tok or vocab()).encode_segments([xtml.Segment(s, True)])


@pytest.mark.parametrize("value", ['"12"', "not json", "12"])
def test_mistyped_argument_streams_the_batch_call_and_diagnostic(value: str) -> None:
    ids = [*_seg('<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|>'
                 '<|open|>argument key="x" type="number"<|sep|>'), *vocab().encode_texts([value])[0],
           *_seg("<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"
                 "<|end_of_msg|>")]
    batch = k3.parse(ids, vocab(), completion=True, lenient=True, thinking=False)
    events = _stream(k3, vocab(), ids, False)
    (call_end,) = [e for e in events if e.type == "tool_call_end"]
    assert call_end.call == batch["tool_calls"][0]
    streamed = [e.diagnostic for e in events if e.type == "diagnostic"]
    assert streamed == batch["diagnostics"]
    # The diagnostic comes with the call, not at the end.
    assert events.index(call_end) < len(events) - 1 and streamed == [
        e.diagnostic for e in events[: events.index(call_end) + 2] if e.type == "diagnostic"]
    call = call_end.call
    assert call is not None
    if value == "12":
        assert json.loads(call["function"]["arguments"]) == {"x": 12} and streamed == []
    else:
        assert json.loads(call["function"]["arguments"]) == {"x": value}
        assert [(d or {}).get("kind") for d in streamed] == ["bad-argument"]


def test_character_cut_by_a_marker_stays_in_its_channel() -> None:
    """A byte-fallback vocabulary decodes a character from several ids; a
    marker between them ends each run, and each run is text of its own."""
    tok = byte_fallback()
    text_ids = tok.encode_texts(["ab日x"])[0]
    bytes_ = [i for i in text_ids if (tok.id_to_token(i) or "").startswith("<0x")]
    assert len(bytes_) == 3
    cut = text_ids.index(bytes_[2])
    ids = [*text_ids[:cut], *_seg("<|close|>think<|sep|><|open|>response<|sep|>", tok), *text_ids[cut:],
           *_seg("<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", tok)]
    batch = k3.parse(ids, tok, completion=True, lenient=True, thinking=True)
    events = _stream(k3, tok, ids, True)
    assert events[-1].message == {k: v for k, v in batch.items() if k != "diagnostics"}
    assert _channel_text(events, "think") == batch["reasoning_content"] == "ab\ufffd\ufffd"
    assert _channel_text(events, "response") == batch["content"] == "\ufffdx"
    # Cut at the end: the held bytes are not lost.
    events = _stream(k3, tok, text_ids[:cut], True)
    assert _channel_text(events, "think") == k3.parse(text_ids[:cut], tok, completion=True, lenient=True,
                                                      thinking=True)["reasoning_content"]


def test_placeholder_spelled_as_text_streams_as_an_embed() -> None:
    tok = placeholder_as_text()
    for thinking in (True, False):
        ids = [*tok.encode_texts([f"see {PLACEHOLDER} here <|kimi_image"])[0],
               *_seg("<|close|>response<|sep|>" if not thinking else "<|close|>think<|sep|>", tok)]
        batch = k3.parse(ids, tok, completion=True, lenient=True, thinking=thinking)
        batch.pop("diagnostics")
        events = _stream(k3, tok, ids, thinking)
        assert events[-1].message == batch
        if thinking:  # reasoning is text, the placeholder literal included
            assert _channel_text(events, "think") == batch["reasoning_content"]
        else:  # an image part: no text for it
            assert batch["content"][1] == {"type": "image"}
            assert _channel_text(events, "response") == "see  here <|kimi_image"


def test_byte_table_is_built_once_across_threads() -> None:
    """Streams started while the table is being built wait for it: none sees
    a half-built table (and falls back to another decoder for its life)."""
    fresh = xtml.Vocabulary(vocab().tokenizer)
    ids = [*fresh.encode_texts(["日本語🎉 and é"])[0], *_seg("<|close|>think<|sep|><|open|>response<|sep|>", fresh),
           *fresh.encode_texts(["ok ü"])[0]]
    start = threading.Barrier(6)
    tables: list[list[bytes]] = []
    results: list[list[xtml.StreamEvent]] = []

    def work() -> None:
        start.wait()
        tables.append(fresh.byte_table())
        results.append(_stream(k3, fresh, ids, True))

    threads = [threading.Thread(target=work) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    want = k3.parse(ids, fresh, completion=True, lenient=True, thinking=True)
    want.pop("diagnostics")
    assert len(tables) == 6 and len(tables[0]) == fresh.size
    assert all(tb is tables[0] for tb in tables)
    deltas = {tuple((e.type, e.channel, e.text) for e in events) for events in results}
    assert len(deltas) == 1
    for events in results:
        assert events[-1].message == want
        assert _channel_text(events, "think") == want["reasoning_content"]


def test_close_twice_ends_once() -> None:
    sp = k3.stream(vocab())
    first = sp.close()
    assert [e.type for e in first].count("message_start") == 1 and first[-1].type == "message_end"
    assert sp.close() == []
    after = sp.feed(5)
    assert [(e.diagnostic or {}).get("kind") for e in after] == ["trailing-output"]


def test_nesting_past_the_limit_is_refused_as_batch_refuses_it() -> None:
    open_x = _seg("<|open|>x<|sep|>")
    ids = [*_seg('<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|>'
                 "<|close|>call<|sep|>"), *open_x * MAX_DEPTH]
    with pytest.raises(xtml.ParseError) as batch:
        k3.parse(ids, vocab(), completion=True, lenient=True, thinking=False)
    events = _stream(k3, vocab(), ids, False)
    (deep,) = [e.diagnostic for e in events if e.type == "diagnostic" and (e.diagnostic or {})["kind"] == "too-deep"]
    assert deep is not None and deep["message"] == batch.value.msg
    # Refused from there on: no more structure, the calls streamed so far kept.
    assert deep["offset"] == batch.value.offset
    assert events[-1].type == "message_end" and events[-1].stop_reason == "length"
    assert events[-1].message == {"role": "assistant", "tool_calls": [
        {"id": "call_0_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    with pytest.raises(xtml.ParseError) as strict:
        _stream(k3, vocab(), ids, False, lenient=False)
    assert strict.value.offset == deep["offset"]


def test_stray_closes_deep_in_the_tree_match_batch() -> None:
    """Close tags of nothing that is open, with the tree as deep as it may
    go: each is one repair, as in batch (and the stream holds no more open
    elements than the limit, so each costs at most a scan of them)."""
    ids = [*_seg("<|open|>x<|sep|>") * (MAX_DEPTH - 2), *_seg("<|close|>zz<|sep|>") * 50,
           *_seg("<|close|>message<|sep|>")]
    check_stream(k3, vocab(), ids, False)
    events = _stream(k3, vocab(), ids, False)
    kinds = Counter((e.diagnostic or {}).get("kind") for e in events if e.type == "diagnostic")
    assert kinds["mismatched-close"] == 51 and kinds["unclosed"] == MAX_DEPTH - 1


def test_strict_stream_raises_where_strict_batch_raises() -> None:
    for ids in ([100, marker_ids()["<|sep|>"]], _seg("<|close|>nothing<|sep|>"), [*_seg("<|open|>"), 5, 6]):
        with pytest.raises(xtml.ParseError) as batch:
            k3.parse(ids, vocab(), completion=True, thinking=False)
        with pytest.raises(xtml.ParseError) as stream:
            _stream(k3, vocab(), ids, False, lenient=False)
        assert stream.value.offset == batch.value.offset
        assert stream.value.msg == batch.value.msg


def test_strict_stream_stays_failed() -> None:
    sp = k3.stream(vocab(), thinking=False, lenient=False)
    with pytest.raises(xtml.ParseError):
        sp.feed_many([100, marker_ids()["<|sep|>"]])
    with pytest.raises(xtml.ParseError):
        sp.feed(100)
    with pytest.raises(xtml.ParseError):
        sp.close()
    assert sp.state is StreamState.FAILED


def test_state_moves_as_documented() -> None:
    sp = k3.stream(vocab(), thinking=False)
    assert sp.state is StreamState.READY
    sp.feed(100)
    assert sp.state is StreamState.READING
    sp.feed_many(_seg("<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"))
    assert sp.state is StreamState.ENDED
    assert [(e.diagnostic or {}).get("kind") for e in sp.feed(100)] == ["trailing-output"]
    assert sp.feed(100) == [] and sp.state is StreamState.ENDED
    # Closed before any token: READY to READING to ENDED in one call.
    sp = k3.stream(vocab())
    closed = sp.close()
    assert closed[0].type == "message_start" and closed[-1].type == "message_end"
    assert sp.state is StreamState.ENDED
    # Refused: nothing is read until the end marker, which still ends the message.
    sp = k3.stream(vocab(), thinking=False)
    sp.feed_many(_seg("<|open|>x<|sep|>") * MAX_DEPTH)
    assert sp.state is StreamState.REFUSED
    assert sp.feed_many([100, *_seg("<|close|>x<|sep|>")]) == []
    (end,) = sp.feed(marker_ids()["<|end_of_msg|>"])
    assert end.type == "message_end" and sp.state is StreamState.ENDED


def test_lenient_stream_never_raises_on_what_is_no_id() -> None:
    surrogate_range = list(range(0xD800, 0xD810))
    junk: list[Any] = [-1, vocab().size, 2**70, None, "12", "\ud800", 1.5, b"x", *surrogate_range, 0x10FFFF + 5]
    for thinking in (True, False):
        events = _stream(k3, vocab(), [*junk, *_seg("<|close|>think<|sep|>"), *junk], thinking)
        bad = [e.diagnostic for e in events if e.type == "diagnostic" and (e.diagnostic or {})["kind"] == "bad-id"]
        assert len(bad) == 2 * (len(junk) - len(surrogate_range))
        check_stream(k3, vocab(), [*junk, *_seg("<|close|>think<|sep|>"), *junk], thinking)
    # Integers of other types are ids, as batch parses take them.
    assert k3.stream(vocab()).feed(True) == k3.stream(vocab()).feed(1)


def test_lenient_batch_skips_what_is_no_id_as_the_stream_does() -> None:
    """A lenient batch parse raised on an id out of range where the stream
    recorded a diagnostic; both now skip it and say where it stood (in the
    caller's offsets), and a huge integer is named without converting it."""
    good = _seg("<|close|>think<|sep|><|open|>response<|sep|>hi<|close|>response<|sep|><|close|>message<|sep|>")
    for bad in (-1, vocab().size, 10**5000, None, "3", 1.5):
        ids: list[Any] = [*good[:3], bad, *good[3:]]
        got = k3.parse(ids, vocab(), completion=True, lenient=True, thinking=True)
        (d,) = [d for d in got["diagnostics"] if d["kind"] == "bad-id"]
        assert d["offset"] == 3 and len(d["message"]) < 80
        assert {k: v for k, v in got.items() if k != "diagnostics"} == k3.parse(
            good, vocab(), completion=True, thinking=True)
        events = _stream(k3, vocab(), ids, True, ())
        assert [e.diagnostic for e in events if e.type == "diagnostic" and e.diagnostic["kind"] == "bad-id"] == [d]
        with pytest.raises(xtml.ParseError, match="is not a token id") as e:
            k3.parse(ids, vocab(), completion=True, thinking=True)
        assert e.value.offset == 3


def test_text_strs_hold_the_text_of_whole_characters_only(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    """The stream's table of ready text: an id's text where its bytes are
    whole UTF-8 without a replacement character, None for markers, parts of
    characters and empty ids, so that those take the path that decodes."""
    b = k3.bind(vocab)
    strs, table = b.text_strs(), b.text_table()
    assert len(strs) == len(table) == vocab.size
    kinds: Counter[str] = Counter()
    for i, (s, raw) in enumerate(zip(strs, table)):
        if i in b.kind_of_id:
            assert raw is None and s is None
            kinds["marker"] += 1
        elif s is not None:
            assert raw is not None and raw.decode() == s and "\ufffd" not in s
            kinds["text"] += 1
        else:
            assert raw is not None
            try:
                assert not raw or "\ufffd" in raw.decode()
                kinds["empty or replacement"] += 1
            except UnicodeDecodeError:
                kinds["part of a character"] += 1
    assert kinds["marker"] and kinds["text"] and kinds["part of a character"]


@pytest.mark.parametrize("text", ["déjà vu 東京 🚀 x", "\ufffd literal, and é", "a" * 40 + "🚀" * 5])
def test_stream_of_split_characters_equals_batch(k3: xtml.Template, vocab: xtml.Vocabulary, text: str) -> None:
    """Characters split over ids (the decoding path) between ids of whole
    characters (the table's path): the same text as the batch parse."""
    ids = k3.completion_ids(f"{text}<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", vocab)
    assert any(k3.bind(vocab).text_strs()[i] is None for i in ids[:-5])
    sp = k3.stream(vocab, thinking=False)
    got = "".join(e.text or "" for t in ids for e in sp.feed(t) if e.type == "text")
    sp.close()
    assert got == text == k3.parse(ids, vocab, completion=True, thinking=False)["content"]
