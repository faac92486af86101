"""``xtml serve`` holds an engine and a request to what was asked
(SECURITY.md, promise 15).

* An engine that ignores ``max_tokens`` (a stand-in that generates on,
  ``StandIn.runaway``) gets its answer ended at the limit, streamed or
  whole: ``finish_reason`` ``length``, usage counting what was sent, and a
  stream's engine request closed.
* What a request may list is bounded (stop sequences and their length, stop
  ids, logit biases, tools); a refusal is a 400 naming the field. What is
  not bounded costs work linear in it: tests count the work (lines of xtml
  run, or CPU time against an input four times larger), as
  tests/test_hostile_cost.py does.
* Media parts reach no engine (it is sent ids only): they are refused, for
  every engine kind, naming the part.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from tests.helpers.serve import K3, REQUEST, Rig, answer_of, expected, got_stream, got_whole, wait_for
from tests.helpers.tokenizers import k3_vocab as vocab
from xtml.codec.stream import StreamEvent
from xtml.serving.engines import VLLM, Generation
from xtml.serving.engines.framing import MAX_LOGIT_BIAS, MAX_STOP, MAX_STOP_CHARS, MAX_STOP_IDS
from xtml.serving.gateway import MAX_TOOLS, Gateway
from xtml.serving.openai import ChunkStream, StopSequences

# -- an engine that ignores max_tokens ------------------------------------------------------

# Far longer than the limit asked for: a model that never ends its message.
RUNAWAY = answer_of({"role": "assistant", "reasoning_content": "Count.",
                     "content": " ".join(map(str, range(600)))})[:-1]
LIMIT = 40


def _limit(kind: str, body: dict[str, Any]) -> Any:
    return {"vllm": lambda: body["max_tokens"], "sglang": lambda: body["sampling_params"]["max_new_tokens"],
            "llamacpp": lambda: body["n_predict"]}[kind]()


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_runaway_stream_ends_at_the_limit_and_the_engine_is_cancelled(rig: Rig, field: str) -> None:
    rig.engine.answer = RUNAWAY
    rig.engine.runaway = True
    rig.engine.delay = 0.005  # seconds a runaway stream of these ids would take uncancelled: 5
    create: Any = rig.client.chat.completions.create
    chunks = list(create(model="kimi-k3", stream=True, stream_options={"include_usage": True}, **{field: LIMIT},
                         **REQUEST))
    assert _limit(rig.kind, rig.engine.requests[-1]) == LIMIT  # it was told
    assert len(rig.engine.sent[-1]) == len(RUNAWAY) > 10 * LIMIT  # and went on
    got = got_stream(chunks)
    assert got == expected(RUNAWAY[:LIMIT]) and got["finish_reason"] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == LIMIT
    assert wait_for(lambda: rig.engine.closed_early == 1), "the engine's request was not cancelled"
    assert rig.engine.finished == 0


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_runaway_whole_answer_is_cut_at_the_limit(rig: Rig, field: str) -> None:
    rig.engine.answer = RUNAWAY
    rig.engine.runaway = True
    create: Any = rig.client.chat.completions.create
    r = create(model="kimi-k3", **{field: LIMIT}, **REQUEST)
    assert len(rig.engine.sent[-1]) == len(RUNAWAY)
    got = got_whole(r)
    assert got == expected(RUNAWAY[:LIMIT]) and got["finish_reason"] == "length"
    assert "truncated" in got["diagnostics"]
    assert r.usage is not None and r.usage.completion_tokens == LIMIT


def test_an_answer_that_ends_within_the_limit_is_left_alone(rig: Rig) -> None:
    short = answer_of({"role": "assistant", "reasoning_content": "Easy.", "content": "Four."})
    rig.engine.answer = short
    rig.engine.runaway = True
    for stream in (False, True):
        if stream:
            got = got_stream(list(rig.client.chat.completions.create(model="kimi-k3", stream=True,
                                                                     max_tokens=len(short), **REQUEST)))
        else:
            got = got_whole(rig.client.chat.completions.create(model="kimi-k3", max_tokens=len(short),
                                                               **REQUEST))
        assert got["finish_reason"] == "stop" and got["content"] == "Four."


# -- what a request may list ----------------------------------------------------------------

def _tool(k: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": f"f{k}", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(("extra", "param"), [
    ({"stop": [f"s{k}" for k in range(MAX_STOP + 1)]}, "stop"),
    ({"stop": ["ok", "x" * (MAX_STOP_CHARS + 1)]}, "stop[1]"),
    ({"stop": "x" * (MAX_STOP_CHARS + 1)}, "stop"),
    ({"stop_token_ids": list(range(MAX_STOP_IDS + 1))}, "stop_token_ids"),
    ({"logit_bias": {str(k): 1 for k in range(MAX_LOGIT_BIAS + 1)}}, "logit_bias"),
    ({"tools": [_tool(k) for k in range(MAX_TOOLS + 1)]}, "tools"),
    ({"functions": [_tool(k)["function"] for k in range(MAX_TOOLS + 1)], "tools": None}, "functions"),
])
def test_lists_past_their_bound_are_a_400_naming_the_field(rig: Rig, extra: dict[str, Any], param: str) -> None:
    r = rig.post({**REQUEST, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert param.split("[")[0] in err["message"]
    assert rig.engine.requests == []


def test_lists_at_their_bound_reach_the_engine(rig: Rig) -> None:
    rig.engine.answer = answer_of({"role": "assistant", "content": "Four."})
    extra: dict[str, Any] = {"stop": [chr(ord("a") + k) * MAX_STOP_CHARS for k in range(MAX_STOP)],
                             "tools": [_tool(k) for k in range(MAX_TOOLS)],
                             "stop_token_ids": list(range(1000, 1000 + MAX_STOP_IDS)),
                             "logit_bias": {str(k): 1 for k in range(MAX_LOGIT_BIAS)}}
    r = rig.post({**REQUEST, **extra})
    assert r.status_code == 200, r.text
    body = rig.engine.requests[-1]
    assert (body["sampling_params"] if rig.kind == "sglang" else body)["stop"] == extra["stop"]


def _lines(fn: Callable[[], Any]) -> int:
    """Lines of xtml run by ``fn``: its work, counted."""
    n = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal n
        if "/xtml/" not in frame.f_code.co_filename:
            return None
        if event == "line":
            n += 1
        return trace

    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    return n


def _fourfold(work: Callable[[int], int], n: int) -> float:
    """How much more ``work`` four times the input takes."""
    work(n), work(4 * n)  # caches warmed
    return work(4 * n) / work(n)


def test_a_requests_messages_cost_work_linear_in_them() -> None:
    """No bound on messages (the request's size is bounded, promise 8):
    checking and rendering many costs each what one costs."""
    gateway = Gateway(K3, vocab(), "http://127.0.0.1:9", kind="vllm")

    def work(n: int) -> int:
        turns: list[dict[str, Any]] = []
        for k in range(n):
            turns += [{"role": "user", "content": [{"type": "text", "text": f"question {k}"}]},
                      {"role": "assistant", "content": f"answer {k}"}]
        body = {**REQUEST, "messages": [*turns, {"role": "user", "content": "last"}]}
        return _lines(lambda: gateway.job(body))

    assert 3 < _fourfold(work, 100) < 4.4


def test_stop_sequences_at_their_bound_cost_work_linear_in_the_stream() -> None:
    """Each piece of text is searched for every stop sequence and the end of
    it held back while it could start one: at the bound, a stream four times
    longer costs four times as much."""
    stops = ["ab" * (MAX_STOP_CHARS // 2 - 1) + str(k) for k in range(MAX_STOP)]

    def work(n: int) -> int:
        s = StopSequences(stops)
        chunk = {"choices": [{"index": 0, "delta": {"content": "abab"}, "logprobs": None, "finish_reason": None}]}

        def run() -> None:
            for _ in range(n):
                s.chunks([json.loads(json.dumps(chunk))])

        return _lines(run)

    assert 3.5 < _fourfold(work, 500) < 4.4


def _cpu(fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def _events(n: int, kind: str) -> list[StreamEvent]:
    if kind == "text":
        return [StreamEvent("text", 0, channel="response", text="word ") for _ in range(n)]
    return [StreamEvent("tool_call_start", 0, index=1, name="search"),
            StreamEvent("argument_start", 0, index=1, key="q", value_type="string"),
            *(StreamEvent("argument_delta", 0, index=1, text="word ") for _ in range(n))]


@pytest.mark.parametrize("kind", ["text", "arguments"])
def test_joining_a_read_of_many_ids_is_linear(kind: str) -> None:
    """An engine read of many ids is one feed of many events, joined into
    one chunk: adding each piece to the text so far copied it again per piece
    (400,000 ids: 13 s)."""
    def feed(n: int) -> Callable[[], Any]:
        events = _events(n, kind)

        def run() -> None:
            out = ChunkStream(model="m").feed(events)
            assert sum(len(json.dumps(c)) for c in out) > 5 * n

        return run

    n = 50_000
    small, large = _cpu(feed(n)), _cpu(feed(4 * n))
    assert large < 8 * small, (small, large)


def test_an_event_that_comes_in_many_reads_is_joined_once() -> None:
    """An engine event in many reads: joining each read to the bytes so far
    copied them again per read."""
    class Reads:
        status = 200

        def __init__(self, data: bytes, size: int) -> None:
            self.pieces = [data[k:k + size] for k in range(0, len(data), size)]
            self.pieces.reverse()

        async def read(self) -> bytes:
            return self.pieces.pop() if self.pieces else b""

        def close(self) -> None:
            pass

        async def finish(self, timeout: float) -> None:
            pass

    def event(n: int) -> bytes:
        choice = {"index": 0, "text": "", "finish_reason": "length", "token_ids": [5] * n}
        return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\r\n\r\ndata: [DONE]\r\n\r\n"

    def run(n: int) -> Callable[[], Any]:
        data = event(n)

        async def go() -> list[Any]:
            backend = VLLM("http://127.0.0.1:9")
            backend.ready = True

            async def send(*args: Any, **kwargs: Any) -> Reads:
                return Reads(data, 512)

            backend.client.send = send  # type: ignore[method-assign,assignment]
            try:
                return [p async for p in backend.stream(Generation([1], {}, (), 1000))]
            finally:
                await backend.aclose()

        def once() -> None:
            pieces = asyncio.run(go())
            assert pieces == [([5] * n, "length")]

        return once

    n = 100_000
    small, large = _cpu(run(n)), _cpu(run(4 * n))
    assert large < 8 * small, (small, large)


# -- media reach no engine -----------------------------------------------------------------

PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
       "AAAABJRU5ErkJggg==")


@pytest.mark.parametrize(("part", "kind"), [
    ({"type": "image_url", "image_url": {"url": PNG}}, "image_url"),
    ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, "image_url"),
    ({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}, "input_audio"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_media_parts_are_refused_naming_the_part(rig: Rig, part: dict[str, Any], kind: str, stream: bool) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
    r = rig.post({"messages": messages, "stream": stream})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[1].content[1]" and repr(kind) in err["message"]
    assert rig.engine.requests == []


def test_image_prompts_are_refused(rig: Rig) -> None:
    """With processor-made prompts, the placeholder in text marks an image:
    the engine would get its prompt's pads, and no pixels."""
    prompt = "<|media_begin|>image 28x28<|media_content|><|media_pad|><|media_end|>"
    messages = [{"role": "user", "content": "What is <|kimi_image_placeholder|> this?"}]
    r = rig.post({"messages": messages, "image_prompts": [prompt]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "image_prompts"
    assert rig.engine.requests == []


def test_text_parts_are_served(rig: Rig) -> None:
    rig.engine.answer = answer_of({"role": "assistant", "content": "Four."})
    messages = [{"role": "user", "content": [{"type": "text", "text": "Add 2 and 2."},
                                             {"type": "input_text", "text": " Briefly."}]}]
    r = rig.post({"messages": messages})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Four."
