"""``xtml serve``: the real openai SDK against the gateway under uvicorn on
the loopback address, in front of a stand-in engine of each kind
(tests/helpers/engines.py) that answers with chosen completion ids.

What is checked: the engine gets exactly ``template.encode(request)`` and
the fields of its own wire format; the SDK's ChatCompletion, and the deltas
of a stream joined, are what xtml's batch parse of the same ids gives; bad
requests are 400s naming where, a backend that is down, slow or answering
garbage is a 502 or 504 (or, once a stream has started, an error event the
SDK raises); a client that leaves cancels the engine's request; a request
that constrains the output sends the engine the completion grammar."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import llguidance
import openai
import pytest

import xtml
from tests.helpers.engines import closed_port
from tests.helpers.serve import (
    ANSWERS,
    K3,
    MESSAGES,
    REQUEST,
    THINKING,
    Rig,
    answer_of,
    expected,
    got_stream,
    got_whole,
    vocab,
    wait_for,
)
from tests.helpers.tokenizers import deepseek_path
from xtml.cli import serve as serve_cli
from xtml.cli.main import main as xtml_main
from xtml.serving import engines as backends
from xtml.serving.gateway import create_app


@pytest.fixture
def vllm() -> Iterator[Rig]:
    r = Rig("vllm")
    yield r
    r.close()


# -- the whole path ------------------------------------------------------------------------

def _args(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # a json block: the text as written


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_whole_completion(rig: Rig, name: str) -> None:
    # The engine generates on past the end marker; the stop id ends it.
    rig.engine.answer = [*ANSWERS[name], 100, 200]
    r = rig.client.chat.completions.create(model="kimi-k3", **REQUEST)
    assert rig.prompt() == K3.encode(REQUEST, vocab())
    sent = rig.engine.sent[-1]
    assert got_whole(r) == expected(sent)
    # And, apart from the shaping code: the message the model wrote, in
    # OpenAI's fields.
    m, want = r.choices[0].message, MESSAGES[name]
    assert r.choices[0].finish_reason == ("tool_calls" if want.get("tool_calls") else "stop")
    assert (m.content or "", (m.model_extra or {}).get("reasoning_content", "")) == (
        want["content"], want.get("reasoning_content", ""))
    assert [(c.function.name, _args(c.function.arguments)) for c in m.tool_calls or ()] == [
        (c["function"]["name"], _args(c["function"]["arguments"])) for c in want.get("tool_calls", ())]
    assert r.model == "kimi-k3" and r.object == "chat.completion"
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(rig.prompt()), len(sent))


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_streamed_completion(rig: Rig, name: str) -> None:
    rig.engine.answer = [*ANSWERS[name], 100, 200]
    chunks = list(rig.client.chat.completions.create(model="kimi-k3", stream=True,
                                                     stream_options={"include_usage": True}, **REQUEST))
    assert rig.prompt() == K3.encode(REQUEST, vocab())
    sent = rig.engine.sent[-1]
    want = expected(sent)
    assert got_stream(chunks) == want
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (len(rig.prompt()), len(sent))
    # Token by token: each engine event is its own chunk (or none).
    assert len(chunks) <= len(sent) + 3


def test_stream_is_server_sent_events_as_openai_sends_them(rig: Rig) -> None:
    rig.engine.answer = ANSWERS["text"]
    with httpx.stream("POST", rig.url + "/v1/chat/completions", json={**REQUEST, "stream": True},
                      timeout=30) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for e in events[:-2]:
        assert e.startswith("data: {") and "\n" not in e
        chunk = json.loads(e[len("data: "):])
        assert chunk["object"] == "chat.completion.chunk" and "usage" not in chunk


@pytest.mark.parametrize("stream", [False, True])
def test_cut_off_by_the_token_limit(rig: Rig, stream: bool) -> None:
    """The engine stops at max_tokens inside a call: finish_reason length,
    and the call cut is withheld."""
    rig.engine.answer = ANSWERS["calls"]
    limit = len(ANSWERS["calls"]) - 12
    if stream:
        chunks = list(rig.client.chat.completions.create(model="kimi-k3", stream=True, max_completion_tokens=limit,
                                                         **REQUEST))
        got = got_stream(chunks)
        # A withheld call's start went out; it never gets its closing brace.
        got["calls"] = got["calls"][:1]
    else:
        got = got_whole(rig.client.chat.completions.create(model="kimi-k3", max_completion_tokens=limit,
                                                           **REQUEST))
    sent = rig.engine.sent[-1]
    assert len(sent) == limit
    want = expected(sent)
    assert want["finish_reason"] == "length" and "withheld-call" in want["diagnostics"]
    assert len(want["calls"]) == 1
    assert got == want


# Longer than vLLM's default limit for a completion (16) and SGLang's (128).
LONG = answer_of({"role": "assistant", "reasoning_content": "Count.", "content": " ".join(map(str, range(200)))})


@pytest.mark.parametrize("stream", [False, True])
def test_no_max_tokens_is_up_to_the_context(rig: Rig, stream: bool) -> None:
    """A request that sets no limit may fill the context, as OpenAI's does;
    vLLM's completions would stop at 16 tokens and SGLang at 128 unless the
    gateway says otherwise."""
    assert len(LONG) > 128
    rig.engine.answer = LONG
    if stream:
        got = got_stream(list(rig.client.chat.completions.create(model="kimi-k3", stream=True, **REQUEST)))
    else:
        got = got_whole(rig.client.chat.completions.create(model="kimi-k3", **REQUEST))
    sent = rig.engine.sent[-1]
    assert sent == (LONG[:-1] if rig.kind == "llamacpp" else LONG)  # llama.cpp leaves out the end id
    assert got == expected(sent) and got["finish_reason"] == "stop"
    body = rig.engine.requests[-1]
    if rig.kind == "vllm":
        assert body["max_tokens"] == rig.engine.context - len(rig.prompt()) > 0
    elif rig.kind == "sglang":
        assert body["sampling_params"]["max_new_tokens"] is None
    else:
        assert "n_predict" not in body  # llama.cpp's default, -1, is no limit
    # A limit the client sets is the one the engine gets.
    rig.client.chat.completions.create(model="kimi-k3", max_tokens=7, **REQUEST)
    body = rig.engine.requests[-1]
    assert {"vllm": lambda: body["max_tokens"], "sglang": lambda: body["sampling_params"]["max_new_tokens"],
            "llamacpp": lambda: body["n_predict"]}[rig.kind]() == 7


def test_vllm_is_asked_its_context_length_once(caplog: pytest.LogCaptureFixture) -> None:
    """Requests that arrive together wait for one question; an engine not
    ready yet (503) fails that request and is asked again by the next."""
    r = Rig("vllm")
    try:
        r.engine.answer = LONG
        r.engine.models_fail = 1
        with pytest.raises(openai.APIStatusError) as e:
            r.client.chat.completions.create(model="kimi-k3", **REQUEST)
        assert e.value.status_code == 502 and "503" in e.value.message
        assert r.engine.requests == [] and r.engine.models_asked == 1

        async def together() -> list[Any]:
            client = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="none", max_retries=0, timeout=30)
            try:
                return list(await asyncio.gather(*(client.chat.completions.create(model="kimi-k3", **REQUEST)
                                                   for _ in range(8))))
            finally:
                await client.close()

        with caplog.at_level(logging.WARNING, logger="xtml.serve"):
            answers = asyncio.run(together())
        assert r.engine.models_asked == 2 and not caplog.messages
        assert all(a.choices[0].finish_reason == "stop" for a in answers)
        assert [b["max_tokens"] for b in r.engine.requests] == [r.engine.context - len(r.prompt())] * 8
    finally:
        r.close()


def test_vllm_without_a_context_length(caplog: pytest.LogCaptureFixture) -> None:
    """An engine whose model card has no max_model_len: the request goes
    without a limit, the engine's default cuts it, finish_reason says so,
    and the log says why, once."""
    r = Rig("vllm")
    try:
        r.engine.context = None
        r.engine.answer = LONG
        with caplog.at_level(logging.WARNING, logger="xtml.serve"):
            for _ in range(2):
                got = got_whole(r.client.chat.completions.create(model="kimi-k3", **REQUEST))
                assert "max_tokens" not in r.engine.requests[-1]
                assert len(r.engine.sent[-1]) == 16 and got["finish_reason"] == "length"
        assert [m for m in caplog.messages if "max_model_len" in m] == [
            "the backend's GET /v1/models gives no max_model_len: a request without max_tokens gets the engine's "
            "default limit (16 tokens for vLLM's completions)"]
    finally:
        r.close()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("stop", "content", "reasoning", "calls", "diags"), [
    # In the text: it ends before the sequence; OpenAI's finish_reason.
    (["spec", "zzz"], "Four, and the ", "Easy.", [], ["stop-sequence", "truncated"]),
    ("xtml.dev", "Four, and the spec is at ", "Easy.", [], ["stop-sequence", "truncated"]),
    # In the reasoning: nothing after it.
    (["Eas"], "", "", [], ["stop-sequence", "truncated"]),
    # Never written: the whole answer.
    (["nowhere"], "Four, and the spec is at xtml.dev.", "Easy.", [], []),
])
def test_stop_sequences(rig: Rig, stream: bool, stop: Any, content: str, reasoning: str, calls: list[Any],
                        diags: list[str]) -> None:
    """The engine stops at a stop sequence, and the ids it returns hold the
    tokens that spelled it: the text ends before it, as OpenAI's does, and
    a stream never sends a piece of it."""
    rig.engine.answer = ANSWERS["text"]
    if stream:
        chunks = list(rig.client.chat.completions.create(model="kimi-k3", stream=True, stop=stop, **REQUEST))
        got = got_stream(chunks)
        words = [stop] if isinstance(stop, str) else stop
        for c in chunks:
            for piece in (c.choices[0].delta.content or "", (c.choices[0].delta.model_extra or {}).get(
                    "reasoning_content") or "") if c.choices else ():
                assert not any(w in piece for w in words)
    else:
        got = got_whole(rig.client.chat.completions.create(model="kimi-k3", stop=stop, **REQUEST))
    body = rig.engine.requests[-1]
    assert (body["sampling_params"] if rig.kind == "sglang" else body)["stop"] == (
        [stop] if isinstance(stop, str) else stop)
    assert got == {"content": content, "reasoning_content": reasoning, "calls": calls, "finish_reason": "stop",
                   "diagnostics": diags}


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_inside_a_call(rig: Rig, stream: bool) -> None:
    """A stop sequence in a call's arguments leaves the call unfinished: it
    is withheld, and the finish reason is the engine's (stop)."""
    rig.engine.answer = ANSWERS["calls"]
    if stream:
        got = got_stream(list(rig.client.chat.completions.create(model="kimi-k3", stream=True, stop=["2+"],
                                                                 **REQUEST)))
        got["calls"] = got["calls"][:1]  # the withheld call's start went out
    else:
        got = got_whole(rig.client.chat.completions.create(model="kimi-k3", stop=["2+"], **REQUEST))
    assert got["finish_reason"] == "stop" and "withheld-call" in got["diagnostics"]
    assert [name for name, _ in got["calls"]] == ["search"]


@pytest.mark.parametrize("delay", [0.0, 0.005])
def test_a_stop_id_of_the_request_ends_streams_and_whole_answers_alike(rig: Rig, delay: float) -> None:
    """llama.cpp takes no stop ids and generates on past one; the gateway
    cuts there, streamed or not (other engines stop there themselves).
    With a delay between events, the stop id comes in a read of its own and
    the ids after it in later ones."""
    text = ANSWERS["text"]
    at = len(text) // 2
    rig.engine.answer = text
    rig.engine.delay = delay
    extra = {"stop_token_ids": [text[at]]}
    whole = got_whole(rig.client.chat.completions.create(model="kimi-k3", extra_body=extra, **REQUEST))
    streamed = got_stream(list(rig.client.chat.completions.create(model="kimi-k3", stream=True, extra_body=extra,
                                                                  **REQUEST)))
    assert streamed == whole and whole["finish_reason"] == "stop" and "truncated" in whole["diagnostics"]
    assert whole["content"] + whole["reasoning_content"] != ""


def _nested(depth: int) -> dict[str, Any]:
    inner: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        inner = {"type": "array", "items": inner}
    return inner


def _with_a_split_character() -> tuple[list[int], int]:
    """The "text" answer with "你" (E4 BD A0) put at the end of its content as
    three byte tokens, and the index of the first."""
    b = K3.bind(vocab())
    byte_id = {t: i for i, t in enumerate(b.text_table()) if t is not None and len(t) == 1}
    ids = list(ANSWERS["text"])
    # The content runs up to <|close|>response, the last close but one.
    at = [k for k, t in enumerate(ids) if t == b.marker_ids[K3.markers.close]][-2]
    ids[at:at] = [byte_id[bytes([c])] for c in "你".encode()]
    return ids, at


def test_held_text_is_cut_into_that_many_tokens() -> None:
    cut = backends.cut_into_tokens
    by = {b"a": 1, b"b": 2, b"ab": 3, b"c": 4, b"bc": 5, b"d": -1, b"abcd": 6}
    assert cut(b"ab", 1, by, 4) == [3]
    assert cut(b"ab", 2, by, 4) == [1, 2]
    assert cut(b"abc", 3, by, 4) == [1, 2, 4]
    assert cut(b"abc", 2, by, 4) in ([3, 4], [1, 5])  # two cuts: the same text either way
    # No cut into that many: as few tokens as make up the text.
    assert cut(b"ab", 3, by, 4) == [3]
    assert cut(b"abc", 9, by, 4) in ([3, 4], [1, 5])
    # Bytes no single id has (two ids share those of "d"), or none at all.
    assert cut(b"ad", 2, by, 4) is None
    assert cut(b"x", 1, by, 4) is None
    assert cut(b"", 1, by, 4) is None
    assert cut(b"a" * 129, 129, by, 4) is None  # longer than is ever held


@pytest.fixture
def past_end() -> Iterator[Rig]:
    """llama.cpp serving a GGUF whose end-of-generation tokens lack the end
    marker: the model runs on past the "text" answer (a gateway of its own,
    so that the warning it logs once is seen)."""
    r = Rig("llamacpp")
    r.engine.eog = ()
    r.engine.answer = [*ANSWERS["text"], 100, 200]
    yield r
    r.close()


@pytest.mark.parametrize("stream", [False, True])
def test_llamacpp_past_the_end_marker(past_end: Rig, caplog: pytest.LogCaptureFixture, stream: bool) -> None:
    """The model runs on, to its end-of-generation token or to the token
    limit; the answer and its usage end at the marker with finish_reason
    stop, and the log says, once, why answers cost their whole token limit."""
    text = ANSWERS["text"]
    with caplog.at_level(logging.WARNING, logger="xtml.serve"):
        for limit in (None, len(text) + 2, None):  # the model's own end; the token limit ("limit")
            kw: dict[str, Any] = {"max_tokens": limit} if limit else {}
            if stream:
                chunks = list(past_end.client.chat.completions.create(
                    model="kimi-k3", stream=True, stream_options={"include_usage": True}, **kw, **REQUEST))
                got, usage = got_stream(chunks), chunks[-1].usage
            else:
                resp = past_end.client.chat.completions.create(model="kimi-k3", **kw, **REQUEST)
                got, usage = got_whole(resp), resp.usage
            assert past_end.engine.sent[-1] == [*text, 100, 200]
            assert got == expected(text) and got["finish_reason"] == "stop"
            assert usage is not None and usage.completion_tokens == len(text)
    if not stream:
        assert len([m for m in caplog.messages if "past the end marker" in m]) == 1


def test_llamacpp_past_a_stop_id_of_the_request_is_not_logged(past_end: Rig,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """The server takes no stop ids, so it generates on past one: that is
    no fault of the model's setup, unlike running on past the end marker
    (the positive control, logged once)."""
    text = ANSWERS["text"]
    with caplog.at_level(logging.WARNING, logger="xtml.serve"):
        resp = past_end.client.chat.completions.create(model="kimi-k3", extra_body={"stop_token_ids": [text[5]]},
                                                       **REQUEST)
        assert resp.choices[0].finish_reason == "stop" and resp.usage is not None
        assert resp.usage.completion_tokens == text.index(text[5]) + 1
        assert not [m for m in caplog.messages if "past the end marker" in m]
        past_end.client.chat.completions.create(model="kimi-k3", **REQUEST)
        assert len([m for m in caplog.messages if "past the end marker" in m]) == 1


def _llamacpp_read(events: list[dict[str, Any]], **params: Any) -> tuple[list[int], int]:
    b = K3.bind(vocab())
    gen = backends.Generation([1], params, b.stop_ids, vocab().size, None, b.text_table)
    reader = backends.BACKENDS["llamacpp"]("http://127.0.0.1:1").reader(gen)
    ids: list[int] = []
    for e in events:
        piece = reader.read(e)
        assert piece is not None
        ids += piece[0]
    return ids, gen.lost


def test_a_count_ahead_of_the_events_is_no_gap() -> None:
    # With a draft model, llama.cpp counts a step's accepted tokens before
    # it sends each: every event of the step has the step's count.
    text = vocab().tokenizer.encode("one two three", add_special_tokens=False).ids
    table = K3.bind(vocab()).text_table()
    events = [{"content": (table[t] or b"").decode(), "tokens": [t], "stop": False, "tokens_predicted": len(text)}
              for t in text]
    assert _llamacpp_read(events) == (text, 0)


def test_nothing_is_looked_for_when_stop_strings_hold_text() -> None:
    # A stop string makes the server hold text whose ids it sent: an
    # event's text then starts with theirs, so it is not cut into the
    # left-out ids; the gap is reported.
    ids, at = _with_a_split_character()
    table = K3.bind(vocab()).text_table()
    # "你" as llama.cpp sends it: with the id of its last byte only.
    events = [{"content": b"".join(table[t] or b"" for t in ids[at : at + 3]).decode(), "tokens": [ids[at + 2]],
               "stop": False, "tokens_predicted": 3}]
    assert _llamacpp_read(events) == (ids[at : at + 3], 0)
    assert _llamacpp_read(events, stop=["END"]) == ([ids[at + 2]], 2)


class _Counted(dict[bytes, int]):
    lookups = 0

    def get(self, key: bytes, default: Any = None) -> Any:
        type(self).lookups += 1
        return super().get(key, default)


@pytest.mark.parametrize("k", [1, 5, 32, 33, 10**6])
@pytest.mark.parametrize("n", [1, 64, 128])
def test_cutting_held_text_stays_cheap(n: int, k: int) -> None:
    # Every run of one to four bytes is a token (its id is its length): a
    # cut into k tokens when one exists and k is at most 32, else into as few
    # as can be; the vocabulary is looked up at most four times per held
    # byte, whatever count the engine claims.
    by = _Counted({b"x" * m: m for m in range(1, 5)})
    _Counted.lookups = 0
    out = backends.cut_into_tokens(b"x" * n, k, by, 4)
    assert out is not None and sum(out) == n
    fewest = -(-n // 4)
    assert len(out) == (k if fewest <= k <= min(n, 32) else fewest)
    assert _Counted.lookups <= 4 * n


@pytest.fixture(scope="module")
def llamacpp() -> Iterator[Rig]:
    r = Rig("llamacpp")
    yield r
    r.close()


@pytest.mark.parametrize("cut", [0, 1, 2, 3])
def test_llamacpp_streams_leave_out_ids_that_end_inside_a_character(llamacpp: Rig, cut: int) -> None:
    """llama.cpp sends no id for a token that ends inside a UTF-8 character
    (the stand-in does as it does): the gateway finds such ids again from
    the next event's text, and says so when the stream was cut there and
    they are nowhere. ``cut``: bytes of the character generated before the
    token limit, 0 for no limit."""
    llamacpp.engine.reset()
    ids, at = _with_a_split_character()
    llamacpp.engine.answer = ids
    limit = {"max_tokens": at + cut} if cut else {}
    chunks = list(llamacpp.client.chat.completions.create(model="kimi-k3", stream=True, **limit,
                                                          stream_options={"include_usage": True}, **REQUEST))
    sent = llamacpp.engine.sent[-1]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == len(sent)
    got, want = got_stream(chunks[:-1]), expected(sent)
    if cut in (0, 3):
        assert got == want
        assert "你" in got["content"]
    else:
        # The server held the cut character's ids and sent them nowhere.
        assert got["diagnostics"] == sorted([*want["diagnostics"], "lost-ids"])
        assert got["content"] == want["content"].removesuffix("\ufffd")
        assert got["finish_reason"] == want["finish_reason"] == "length"


def test_sampling_fields_reach_the_engine(rig: Rig) -> None:
    rig.engine.answer = ANSWERS["text"]
    rig.client.chat.completions.create(model="kimi-k3", temperature=0.5, top_p=0.9, seed=7, stop=["END"],
                                       max_tokens=50, presence_penalty=0.1, frequency_penalty=0.2,
                                       extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
                                                   "some_engine_field": {"x": 1}},
                                       **REQUEST)
    body = rig.engine.requests[-1]
    stop_ids = list(K3.bind(vocab()).stop_ids)
    if rig.kind == "vllm":
        assert body["prompt"] == K3.encode(REQUEST, vocab())
        assert body["return_token_ids"] is True and body["skip_special_tokens"] is False
        assert body["stop_token_ids"] == stop_ids and body["stream"] is False
        assert {k: body[k] for k in ("temperature", "top_p", "seed", "stop", "max_tokens", "presence_penalty",
                                     "frequency_penalty", "top_k", "min_p", "repetition_penalty")} == {
            "temperature": 0.5, "top_p": 0.9, "seed": 7, "stop": ["END"], "max_tokens": 50,
            "presence_penalty": 0.1, "frequency_penalty": 0.2, "top_k": 20, "min_p": 0.05,
            "repetition_penalty": 1.1}
        assert "model" not in body and "structured_outputs" not in body
    elif rig.kind == "sglang":
        sp = body["sampling_params"]
        assert sp == {"stop_token_ids": stop_ids, "skip_special_tokens": False, "temperature": 0.5, "top_p": 0.9,
                      "sampling_seed": 7, "stop": ["END"], "max_new_tokens": 50, "presence_penalty": 0.1,
                      "frequency_penalty": 0.2, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1}
        assert body["stream"] is False
    else:
        assert body["return_tokens"] is True
        assert {k: body[k] for k in ("temperature", "top_p", "seed", "stop", "n_predict", "presence_penalty",
                                     "frequency_penalty", "top_k", "min_p", "repeat_penalty")} == {
            "temperature": 0.5, "top_p": 0.9, "seed": 7, "stop": ["END"], "n_predict": 50,
            "presence_penalty": 0.1, "frequency_penalty": 0.2, "top_k": 20, "min_p": 0.05, "repeat_penalty": 1.1}
        # A whole answer is asked for whole: llama.cpp's stream leaves out
        # the ids of tokens that end inside a UTF-8 character.
        assert body["stream"] is False
    assert "some_engine_field" not in json.dumps(body)


def test_sampling_values_reach_the_engine_exactly(vllm: Rig) -> None:
    """Non-ASCII stop text, an integer bias past 64 bits (the body is then
    written by the standard library) and floats arrive as sent."""
    vllm.engine.answer = ANSWERS["text"]
    for bias in (1, 10**30):
        r = vllm.post({**REQUEST, "stop": ["終わり", "é\n"], "temperature": 1e-05, "logit_bias": {"5": bias}})
        assert r.status_code == 200, r.text
        body = vllm.engine.requests[-1]
        assert body["stop"] == ["終わり", "é\n"] and body["temperature"] == 1e-05 and body["logit_bias"] == {"5": bias}
        assert body["prompt"] == K3.encode(REQUEST, vocab())


def test_model_names(vllm: Rig) -> None:
    vllm.engine.answer = ANSWERS["text"]
    assert [m.id for m in vllm.client.models.list().data] == ["kimi-k3"]
    assert vllm.client.models.retrieve("kimi-k3").id == "kimi-k3"
    with pytest.raises(openai.NotFoundError) as e:
        vllm.client.models.retrieve("gpt-4o")
    assert e.value.code == "model_not_found" and "kimi-k3" in e.value.message
    r = vllm.client.chat.completions.create(model="anything", **REQUEST)
    assert r.model == "kimi-k3" and "model" not in vllm.engine.requests[-1]
    named = Rig("vllm", backend_model="org/k3-7b")
    try:
        named.engine.answer = ANSWERS["text"]
        assert [m.id for m in named.client.models.list().data] == ["org/k3-7b"]
        assert named.client.models.retrieve("org/k3-7b").id == "org/k3-7b"
        r = named.client.chat.completions.create(model="whatever", **REQUEST)
        assert r.model == "org/k3-7b" and named.engine.requests[-1]["model"] == "org/k3-7b"
    finally:
        named.close()


def test_health(rig: Rig) -> None:
    r = httpx.get(rig.url + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    rig.engine.mode = "unhealthy"
    r = httpx.get(rig.url + "/health")
    assert r.status_code == 503 and r.json()["error"]["code"] == "backend_not_ready"


def test_sglang_streams_all_ids_so_far_or_only_new_ones() -> None:
    r = Rig("sglang")
    try:
        for incremental in (False, True):
            r.engine.answer = ANSWERS["calls"]
            r.engine.incremental = incremental
            chunks = list(r.client.chat.completions.create(model="kimi-k3", stream=True, **REQUEST))
            assert got_stream(chunks) == expected(r.engine.sent[-1])
    finally:
        r.close()


def test_model_output_never_fails_a_request(vllm: Rig) -> None:
    """Ids in any order (markers out of place, a stop id anywhere): a 200
    with what the lenient parse read and its diagnostics."""
    rng = random.Random(7)
    markers = sorted(K3.bind(vocab()).marker_ids.values())
    for stream in (False, True):
        for _ in range(15):
            vllm.engine.answer = [rng.choice(markers) if rng.random() < 0.4 else rng.randrange(vocab().size)
                                  for _ in range(rng.randrange(0, 40))]
            if stream:
                got = got_stream(list(vllm.client.chat.completions.create(model="kimi-k3", stream=True,
                                                                          **REQUEST)))
                got["calls"] = []
            else:
                got = got_whole(vllm.client.chat.completions.create(model="kimi-k3", **REQUEST))
            want = expected(vllm.engine.sent[-1])
            if stream:
                want["calls"] = []  # a withheld call's start may have gone out
            if want["finish_reason"] == "length":
                # The engine stopped on its own, not at a limit: a message it
                # left unfinished ends with its reason.
                want["finish_reason"] = "stop"
            assert got == want


# -- structured outputs --------------------------------------------------------------------

@pytest.mark.parametrize("constraint", [
    {"tool_choice": {"type": "function", "function": {"name": "search"}}},
    {"tool_choice": "required"},
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}},
    # Declared tools that must not be called: the grammar has no tools channel.
    {"tool_choice": "none"},
    # One call at most.
    {"parallel_tool_calls": False},
])
def test_the_engine_gets_the_completion_grammar(rig: Rig, constraint: dict[str, Any]) -> None:
    rig.engine.answer = ANSWERS["calls"]
    request = {**REQUEST, **constraint}
    rig.client.chat.completions.create(model="kimi-k3", **request)
    body = rig.engine.requests[-1]
    sent = {"vllm": lambda: body["structured_outputs"]["grammar"],
            "sglang": lambda: body["sampling_params"]["ebnf"],
            "llamacpp": lambda: body["grammar"]}[rig.kind]()
    assert rig.prompt() == K3.encode(request, vocab())
    if rig.kind == "llamacpp":
        # llama.cpp gets GBNF, which its own grammar sampler runs
        # (tests/test_grammar_gbnf.py runs it on a real llama-server).
        assert sent == K3.completion_grammar(request, vocab(), format="gbnf")
        return
    assert sent == K3.completion_grammar(request, vocab())
    # The engines' llguidance backends load it as vLLM's and SGLang's do
    # (grammar_from("grammar" / "ebnf", ...)); it holds the answer when the
    # answer keeps to the constraint.
    for fmt in ("grammar", "ebnf"):
        m = llguidance.LLMatcher(_ll_tokenizer(), llguidance.grammar_from(fmt, sent), log_level=0)
        assert not m.is_error(), m.get_error()
        if constraint.get("parallel_tool_calls") is False:
            # The answer with two calls is refused before its second.
            calls = ANSWERS["calls"]
            assert m.validate_tokens(calls) < len(calls)
        if constraint.get("tool_choice") == "required":
            answer = ANSWERS["calls"]
            # The end marker as the engine's end-of-sequence token: after the
            # close, the grammar may end, so the mask lets the engine end.
            assert m.consume_tokens(answer[:-1]) and m.is_accepting(), m.get_error()
            assert m.validate_tokens(answer[-1:]) == 1
            # An end-of-sequence token of the engine's own (the vocabulary's
            # own end of sentence): the end marker is a grammar token, then
            # the engine's token ends the answer.
            own = llguidance.LLMatcher(_ll_tokenizer(own_eos=True), llguidance.grammar_from(fmt, sent), log_level=0)
            assert own.consume_tokens(answer) and own.is_accepting(), own.get_error()
            assert [i for i, v in enumerate(own.compute_logit_bias()) if v] == [OWN_EOS]


_LL: dict[bool, Any] = {}
# The deepseek vocabulary's own end of sentence, which no K3 grammar names.
OWN_EOS = 1


def _ll_tokenizer(own_eos: bool = False) -> Any:
    """llguidance's tokenizer of the test vocabulary, its end the end marker
    (as llama.cpp hands llguidance a K3 model's end-of-turn token) or, with
    ``own_eos``, a token of its own."""
    if own_eos not in _LL:
        end = OWN_EOS if own_eos else K3.bind(vocab()).marker_ids[K3.markers.end]
        _LL[own_eos] = llguidance.LLTokenizer(vocab().tokenizer.to_str(), eos_token=end)
    return _LL[own_eos]


def test_no_grammar_without_a_constraint_or_when_turned_off(vllm: Rig) -> None:
    vllm.engine.answer = ANSWERS["text"]
    vllm.client.chat.completions.create(model="kimi-k3", tool_choice="auto", **REQUEST)
    assert "structured_outputs" not in vllm.engine.requests[-1]
    off = Rig("vllm", grammar=False)
    try:
        off.engine.answer = ANSWERS["calls"]
        off.client.chat.completions.create(model="kimi-k3", tool_choice="required", **REQUEST)
        assert "structured_outputs" not in off.engine.requests[-1]
    finally:
        off.close()


# -- bad requests --------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}, "messages[1].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": "hi"}, "messages"),
    ({**REQUEST, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({**REQUEST, "n": 0}, "n"),
    ({**REQUEST, "n": 17}, "n"),
    ({**REQUEST, "n": 1.5}, "n"),
    ({"messages": []}, "messages"),
    ({**REQUEST, "temperature": "hot"}, "temperature"),
    ({**REQUEST, "max_tokens": 0}, "max_tokens"),
    ({**REQUEST, "temperature": float("nan")}, "temperature"),
    ({**REQUEST, "tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": _nested(450)}}}}]}, "tools"),
    ({**REQUEST, "top_p": float("inf")}, "top_p"),
    ({**REQUEST, "logit_bias": {"five": 1}}, "logit_bias"),
    ({**REQUEST, "logit_bias": {"5": float("-inf")}}, "logit_bias"),
    ({**REQUEST, "stream": True, "stream_options": {"include_usage": "no"}}, "stream_options.include_usage"),
    ({**REQUEST, "stream": "yes"}, "stream"),
    ({**REQUEST, "logprobs": True}, "logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
      "continue_final_message": True, "add_generation_prompt": False}, "continue_final_message"),
    ({**REQUEST, "add_generation_prompt": False}, "add_generation_prompt"),
    ({**REQUEST, "documents": [{"text": "x"}]}, "documents"),
    # What goes to the engine as it came must be writable as UTF-8 JSON and
    # readable by it: a lone surrogate was a 500, an integer past 64 bits
    # the engine's refusal.
    ({**REQUEST, "stop": ["ok", "\ud800"]}, "stop[1]"),
    ({**REQUEST, "stop": "\udc80"}, "stop"),
    ({**REQUEST, "seed": 2**64}, "seed"),
    ({**REQUEST, "max_tokens": -(2**70)}, "max_tokens"),
    ({**REQUEST, "stop_token_ids": [5, 10**9]}, "stop_token_ids[1]"),
    ({**REQUEST, "stop_token_ids": [-1]}, "stop_token_ids"),
    ({**REQUEST, "max_completion_tokens": 2**64}, "max_completion_tokens"),
    ({**REQUEST, "logit_bias": {"5": 1, "1000000000": 2}}, "logit_bias['1000000000']"),
    ({**REQUEST, "logit_bias": {"1" * 25: 2}}, f"logit_bias[{'1' * 25!r}]"),
])
def test_a_bad_request_is_a_400_naming_where(vllm: Rig, body: dict[str, Any], param: str) -> None:
    r = vllm.post(body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert param in err["message"] or param.split("[")[0] in err["message"]
    assert vllm.engine.requests == []


def test_a_field_the_engine_lacks_is_refused(rig: Rig) -> None:
    r = rig.post({**REQUEST, "min_tokens": 5})
    if rig.kind == "llamacpp":
        assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
        assert rig.engine.requests == []
    else:
        assert r.status_code == 200
        body = rig.engine.requests[-1]
        assert (body["sampling_params"]["min_new_tokens"] if rig.kind == "sglang" else body["min_tokens"]) == 5


def test_the_sdk_raises_a_bad_request(vllm: Rig) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        vllm.client.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": "hi"},
                                                                       {"role": "robot", "content": "x"}])
    assert e.value.status_code == 400
    assert "messages[1].role" in e.value.message


def test_not_json_and_unknown_routes(vllm: Rig) -> None:
    r = httpx.post(vllm.url + "/v1/chat/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(vllm.url + "/v1/chat/completions", json=[1, 2], timeout=10)
    assert r.status_code == 400
    r = httpx.get(vllm.url + "/v1/nothing", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    r = httpx.get(vllm.url + "/v1/chat/completions", timeout=10)
    assert r.status_code == 405 and "error" in r.json()


def test_unknown_keys_are_ignored(vllm: Rig) -> None:
    vllm.engine.answer = ANSWERS["text"]
    body = {**REQUEST, "no_such_key": 1, "chat_template_kwargs": {"also_unknown": True},
            "messages": [{**REQUEST["messages"][0], "odd_field": "x"}, REQUEST["messages"][1]]}
    r = vllm.post(body)
    assert r.status_code == 200, r.text
    assert vllm.prompt() == K3.encode(REQUEST, vocab())


# -- backend failures ----------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_a_backend_that_is_down_is_a_502(stream: bool) -> None:
    r = Rig("vllm", url=f"http://127.0.0.1:{closed_port()}")
    try:
        resp = r.post({**REQUEST, "stream": stream})
        assert resp.status_code == 502
        assert resp.json()["error"]["code"] == "backend_unreachable"
        with pytest.raises(openai.InternalServerError):
            r.client.chat.completions.create(model="kimi-k3", stream=stream, **REQUEST)
        assert httpx.get(r.url + "/health").status_code == 503
    finally:
        r.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_backend_that_is_too_slow_is_a_504(stream: bool) -> None:
    r = Rig("vllm", timeout=0.3)
    try:
        r.engine.answer = ANSWERS["text"]
        r.engine.head_delay = 3.0
        resp = r.post({**REQUEST, "stream": stream})
        assert resp.status_code == 504
        assert resp.json()["error"]["code"] == "backend_timeout"
    finally:
        r.close()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["not_json", "deep_json", "no_ids", "out_of_range"])
def test_garbage_from_the_backend_is_a_502(rig: Rig, mode: str, stream: bool) -> None:
    rig.engine.answer = ANSWERS["calls"]
    rig.engine.mode = mode
    rig.engine.good = 0
    resp = rig.post({**REQUEST, "stream": stream})
    if mode == "out_of_range" and stream:
        # The bad id comes third: the stream has started, and ends with an error event.
        assert resp.status_code == 200
        events = [e for e in resp.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        err = json.loads(events[-2][len("data: "):])["error"]
        assert err["code"] == "backend_invalid_response" and "not a token id" in err["message"]
        return
    assert resp.status_code == 502, resp.text
    err = resp.json()["error"]
    assert err["code"] == "backend_invalid_response" and err["type"] == "backend_error"


@pytest.mark.parametrize("mode", ["garbage_mid_stream", "deep_json", "error_mid_stream"])
def test_a_failure_after_the_stream_started_is_an_error_event(rig: Rig, mode: str) -> None:
    rig.engine.answer = ANSWERS["calls"]
    rig.engine.mode = mode
    rig.engine.good = 5
    got: list[Any] = []
    with pytest.raises(openai.APIError) as e:
        for c in rig.client.chat.completions.create(model="kimi-k3", stream=True, **REQUEST):
            got.append(c)
    assert got and got[0].choices[0].delta.role == "assistant"
    assert ("the engine failed" if mode == "error_mid_stream" else "not JSON") in e.value.message
    assert e.value.code == ("backend_error" if mode == "error_mid_stream" else "backend_invalid_response")


@pytest.mark.parametrize("status", [400, 500])
def test_the_engines_own_errors(vllm: Rig, status: int) -> None:
    vllm.engine.mode = "status"
    vllm.engine.status = status
    resp = vllm.post(REQUEST)
    # 400: the engine refused the request (too long for its context, say).
    assert resp.status_code == (400 if status == 400 else 502)
    assert "scripted failure" in resp.json()["error"]["message"]


# -- clients that leave ----------------------------------------------------------------------



def test_a_client_that_disconnects_cancels_its_backend_stream(rig: Rig) -> None:
    rig.engine.answer = ANSWERS["text"] * 50
    rig.engine.delay = 0.02
    with httpx.stream("POST", rig.url + "/v1/chat/completions", json={**REQUEST, "stream": True},
                      timeout=30) as resp:
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(6)]
    assert any(line.startswith("data: {") for line in got)
    assert wait_for(lambda: rig.engine.closed_early == 1), "the engine's stream was not closed"
    assert rig.engine.finished == 0


def test_a_client_that_disconnects_while_the_engine_thinks_cancels_it(vllm: Rig) -> None:
    vllm.engine.answer = ANSWERS["text"]
    vllm.engine.head_delay = 5.0
    for stream in (False, True):
        vllm.engine.closed_early = 0
        with pytest.raises(httpx.TimeoutException):
            vllm.post({**REQUEST, "stream": stream}, timeout=0.5)
        assert wait_for(lambda: vllm.engine.closed_early == 1), "the engine's request was not cancelled"


def test_many_concurrent_streams_each_get_their_own_answer(vllm: Rig) -> None:
    """Answers picked by the request's seed: no stream gets another's ids."""
    names = sorted(ANSWERS)
    vllm.engine.answer = lambda body: ANSWERS[names[body["seed"] % len(names)]]
    vllm.engine.record = False

    async def one(client: openai.AsyncOpenAI, k: int) -> bool:
        chunks = [c async for c in await client.chat.completions.create(model="kimi-k3", stream=True, seed=k,
                                                                        **REQUEST)]
        want = expected(ANSWERS[names[k % len(names)]])
        return got_stream(chunks) == want

    async def run() -> list[bool]:
        async with openai.AsyncOpenAI(base_url=vllm.url + "/v1", api_key="none", max_retries=0) as client:
            return await asyncio.gather(*(one(client, k) for k in range(40)))

    assert all(asyncio.run(run()))


# -- the command line ------------------------------------------------------------------------

def test_the_command_needs_the_serve_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                          tmp_path: Any) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    code = xtml_main(["serve", "--backend", "http://127.0.0.1:1", "--tokenizer", str(tmp_path / "tok.json")])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and "pip install 'xtml[serve]'" in err


def test_the_command_checks_its_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    assert xtml_main(["serve", "--backend", "ftp://x", "--tokenizer", "t.json"]) == 2
    assert "http://" in capsys.readouterr().err
    assert xtml_main(["serve", "--backend", "http://x", "--tokenizer", "t.json", "--backend-kind", "tgi"]) == 2
    assert xtml_main(["serve", "--backend", "http://x", "--tokenizer", "t.json", "--backend-timeout", "0"]) == 2
    capsys.readouterr()
    for url, said in (("http://[::1", "Invalid IPv6 URL"), ("http://x:99999", "Port out of range"),
                      ("http://x:abc", "Port could not be cast"), ("http://x y", "http:// or https:// URL")):
        assert xtml_main(["serve", "--backend", url, "--tokenizer", str(tmp_path / "t.json")]) == 1
        err = capsys.readouterr().err
        assert err.startswith("xtml: error: ") and said in err and err.count("\n") == 1
    # An address in use, or a host that is not this machine's: one line, before uvicorn starts.
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for host, said in (("127.0.0.1", "Address already in use"), ("999.1.1.1", "cannot listen on 999.1.1.1")):
            code = xtml_main(["serve", "--backend", "http://127.0.0.1:1", "--tokenizer", deepseek_path(),
                              "--add-markers", "--host", host, "--port", str(port)])
            err = capsys.readouterr().err
            assert code == 1 and err.startswith("xtml: error: cannot listen on") and said in err, err
            assert err.count("\n") == 1
    # Every address a host names, as uvicorn binds them ("": all interfaces),
    # on one port even when the port is chosen by the system.
    socks = serve_cli.listen("", 0)
    try:
        assert len({s.getsockname()[1] for s in socks}) == 1 and len(socks) >= 1
    finally:
        for s in socks:
            s.close()
    # Past 65535 a socket would listen on the port modulo 65536.
    for port in ("65536", "70000", "-1", "http"):
        assert xtml_main(["serve", "--backend", "http://x", "--tokenizer", "t.json", "--port", port]) == 2
        assert "expected a port number, 0 to 65535" in capsys.readouterr().err
    code = xtml_main(["serve", "--backend", "http://127.0.0.1:1", "--tokenizer", str(tmp_path / "missing.json")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("xtml: error:") and err.count("\n") == 1


def test_the_backend_must_be_an_http_url() -> None:
    for url in ("ftp://127.0.0.1:1", "127.0.0.1:8000", "http://"):
        with pytest.raises(xtml.OptionError, match="http://"):
            create_app(K3, vocab(), url)


def test_the_command_lists_the_backend_kinds() -> None:
    assert serve_cli.KINDS == tuple(backends.KINDS)
    assert "httpx" not in serve_cli.__dict__


def test_the_fast_event_encoding_is_openais() -> None:
    """The gateway writes most chunks from a constant head and the delta:
    the text is exactly what ``openai.sse`` gives for the whole chunk."""
    from xtml.serving.gateway import SSE
    from xtml.serving.openai import ChunkStream, sse

    n = 0
    for usage in (False, True):
        for ids in ANSWERS.values():
            for cut in (len(ids), len(ids) - 7, len(ids) // 2):
                parser = K3.stream(vocab(), thinking=THINKING)
                chunks = ChunkStream(model='m "quoted" é', template=K3, include_usage=usage)
                fast = SSE(chunks)
                out = chunks.feed(())
                for t in ids[:cut]:
                    out += chunks.feed(parser.feed(t))
                out += chunks.feed(parser.close())
                out += chunks.close(prompt_tokens=3, completion_tokens=cut)
                for c in out:
                    assert fast(c) == sse(c)
                    n += 1
    assert n > 300
