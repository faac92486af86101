"""The ``smollm2`` layout dialect against SmolLM2-135M-Instruct's own chat
template (the GGUF's ``tokenizer.chat_template``, rendered by transformers)
and its own tokenizer (the GGUF's, as llama.cpp tokenizes).

On seeded requests: the text is byte-equal wherever the official template
renders, and xtml refuses (a located error) wherever it raises; what it
drops is reported; the ids equal the official text tokenized whole wherever
no content spells a token; parse on ids gives the normal form back; the
stream of a completion joins to its batch parse in every grouping."""

from __future__ import annotations

import random
from typing import Any

import pytest

import xtml
from tests.helpers.families import (
    SMOLLM2_SHA256,
    chatml_requests,
    gguf_chat_template,
    hf_render,
    sha256,
    smollm2_gguf,
    spells_marker,
    whole_ids,
)
from xtml.errors import MessageError, RequestError

N_REQUESTS = 400
TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


@pytest.fixture(scope="module")
def tpl() -> xtml.Template:
    return xtml.load("smollm2")


@pytest.fixture(scope="module")
def gguf_path() -> str:
    return smollm2_gguf()


@pytest.fixture(scope="module")
def official(gguf_path: str) -> str:
    text = gguf_chat_template(gguf_path)
    assert sha256(text) == SMOLLM2_SHA256, "the GGUF's chat template is not the one the dialect mirrors"
    return text


@pytest.fixture(scope="module")
def vocab(gguf_path: str) -> xtml.Vocabulary:
    return xtml.load_tokenizer(gguf_path)


def _expected_drops(req: dict[str, Any]) -> set[tuple[int, str]]:
    out: set[tuple[int, str]] = set()
    if req.get("tools"):
        out.add((-1, "tools"))
    for i, m in enumerate(req["messages"]):
        for k, v in m.items():
            if k not in ("role", "content") and v not in (None, "", [], {}):
                out.add((i, k))
    return out


def test_the_dialect_names_its_reference(tpl: xtml.Template) -> None:
    assert tpl.dialect.reference["sha256"] == SMOLLM2_SHA256  # type: ignore[attr-defined]


def test_text_ids_and_parse_against_the_official_template(tpl: xtml.Template, official: str,
                                                          vocab: xtml.Vocabulary) -> None:
    counts = {"equal": 0, "refused": 0, "dropped": 0, "ids_equal": 0, "spelled": 0}
    for k, req in enumerate(chatml_requests(2026, N_REQUESTS)):
        try:
            want = hf_render(official, req)
        except Exception as official_error:
            with pytest.raises(RequestError) as caught:
                tpl.render(req)
            # Located: the message and field, or the request's messages.
            assert caught.value.location, (k, req)
            if isinstance(caught.value, MessageError):
                assert 0 <= caught.value.index < len(req["messages"])
            counts["refused"] += 1
            del official_error
            continue
        r = tpl.render(req)
        assert r.text == want, (k, req)
        counts["equal"] += 1
        assert {(d.message, d.field) for d in r.dropped} == _expected_drops(req), (k, req)
        counts["dropped"] += bool(r.dropped)
        ids = tpl.encode(req, vocab)
        if spells_marker(req, TOKENS):
            counts["spelled"] += 1
            assert r.ambiguous, (k, req)
        else:
            assert not r.ambiguous
            assert ids == whole_ids(vocab, want), (k, req)
            counts["ids_equal"] += 1
            assert tpl.parse(r.text) == tpl.normalize(req)
        assert tpl.parse(ids, vocab) == tpl.normalize(req), (k, req)
    print("smollm2:", counts)
    assert counts["equal"] + counts["refused"] == N_REQUESTS
    # The generator reaches every outcome.
    assert counts["refused"] >= 20 and counts["dropped"] >= 30 and counts["ids_equal"] >= 200
    assert counts["spelled"] >= 20


def test_refusals_say_where(tpl: xtml.Template) -> None:
    with pytest.raises(MessageError) as e:
        tpl.render([{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}])
    assert e.value.location == "messages[1].content" and "tool calls" in e.value.msg
    with pytest.raises(MessageError) as e:
        tpl.render([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert e.value.location == "messages[0].content"
    with pytest.raises(RequestError) as e2:
        tpl.render([])
    assert e2.value.location == "messages"


def _completions(tpl: xtml.Template, vocab: xtml.Vocabulary, seed: int, n: int) -> list[list[int]]:
    """Answers as the model generates them: rendered assistant texts and a
    stop token, some cut short, some with stray tokens or a tail after the
    stop."""
    rng = random.Random(seed)
    texts = ["Hello there!", "", "naïve café — 日本語 🙂\n\nlist:\n- a\n- b", "a" * 200, "{\"x\": 1}", "<|im_end|>"]
    stop, start, eot = (vocab.special_id(t) for t in TOKENS)
    assert stop is not None and start is not None and eot is not None
    out = []
    for _ in range(n):
        ids = vocab.encode_texts([rng.choice(texts)])[0] + [rng.choice([stop, stop, eot])]
        r = rng.random()
        if r < 0.2:
            ids = ids[: rng.randint(0, len(ids) - 1)]
        elif r < 0.35 and ids:
            at = rng.randint(0, len(ids) - 1)
            ids = [*ids[:at], start, *ids[at:]]
        elif r < 0.45:
            ids = ids + vocab.encode_texts(["more"])[0]
        out.append(ids)
    return out


def test_completions_parse_strictly_and_leniently(tpl: xtml.Template, vocab: xtml.Vocabulary) -> None:
    stop = vocab.special_id("<|im_end|>")
    assert stop is not None
    for ids in _completions(tpl, vocab, 7, 200):
        lenient = tpl.parse(ids, vocab, completion=True, lenient=True)
        for d in lenient.get("diagnostics", ()):
            assert 0 <= d["offset"] <= len(ids)
        clean = ids and ids[-1] in (stop, vocab.special_id("<|endoftext|>")) and not lenient.get("diagnostics")
        if clean:
            assert tpl.parse(ids, vocab, completion=True) == lenient
        else:
            with pytest.raises(xtml.ParseError):
                tpl.parse(ids, vocab, completion=True)
    # An answer the format renders as an assistant turn reads back as it.
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hi! How can I help?"}]
    whole = tpl.encode({"messages": turns, "add_generation_prompt": False}, vocab)
    prompt = tpl.encode({"messages": turns[:1]}, vocab)
    answer = whole[len(prompt):-1]  # the turn's trailing newline is the template's, not the model's
    assert tpl.parse(answer, vocab, completion=True) == {"role": "assistant", "content": "Hi! How can I help?"}


def test_stream_joins_to_the_batch_parse_in_every_grouping(tpl: xtml.Template, vocab: xtml.Vocabulary) -> None:
    rng = random.Random(11)
    for ids in _completions(tpl, vocab, 8, 150):
        batch = tpl.parse(ids, vocab, completion=True, lenient=True)
        diags = batch.pop("diagnostics", [])
        for _ in range(3):
            parser = tpl.stream(vocab)
            events = []
            k = 0
            while k < len(ids):
                step = rng.randint(1, 5)
                group = ids[k:k + step]
                events += parser.feed(group[0]) if len(group) == 1 else parser.feed_many(group)
                k += step
            events += parser.close()
            ends = [e for e in events if e.type == "message_end"]
            assert len(ends) == 1 and ends[0].message == batch
            assert "".join(e.text or "" for e in events if e.type == "text") == batch["content"]
            assert [e.diagnostic for e in events if e.type == "diagnostic"] == diags
            assert ends[0].stop_reason == ("length" if any(d["kind"] == "truncated" for d in diags) else "stop")


def test_strict_stream_raises_where_the_strict_parse_does(tpl: xtml.Template, vocab: xtml.Vocabulary) -> None:
    start = vocab.special_id("<|im_start|>")
    assert start is not None
    ids = vocab.encode_texts(["Hi"])[0] + [start]
    parser = tpl.stream(vocab, lenient=False)
    with pytest.raises(xtml.ParseError) as e:
        parser.feed_many(ids)
    assert e.value.offset == len(ids) - 1
    with pytest.raises(xtml.ParseError):
        tpl.parse(ids, vocab, completion=True)


def test_the_k3_engine_is_untouched() -> None:
    # The layout engine is chosen by the file: the XTML built-ins load as
    # they always did.
    assert type(xtml.load("kimi-k3")) is xtml.Template
    assert type(xtml.load("smollm2")) is not xtml.Template and isinstance(xtml.load("smollm2"), xtml.Template)


def test_lenient_parses_of_any_ids_never_raise(tpl: xtml.Template, vocab: xtml.Vocabulary) -> None:
    rng = random.Random(5)
    tokens = [i for i in (vocab.special_id(t) for t in TOKENS) if i is not None]
    for _ in range(300):
        ids = [rng.choice(tokens) if rng.random() < 0.2 else rng.randrange(vocab.size)
               for _ in range(rng.randint(0, 40))]
        out = tpl.parse(ids, vocab, completion=True, lenient=True)
        assert isinstance(out["content"], str)
        for d in out.get("diagnostics", ()):
            assert 0 <= d["offset"] <= len(ids)
        parser = tpl.stream(vocab)
        events = parser.feed_many(ids) + parser.close()
        ends = [e.message for e in events if e.type == "message_end"]
        out.pop("diagnostics", None)
        assert ends == [out]
    with pytest.raises(xtml.ParseError) as e:
        tpl.parse([5, vocab.size], vocab, completion=True, lenient=True)
    assert e.value.offset == 1
