"""``xtml serve``'s chat completions where OpenAI's answers have a shape of
their own, with the real openai SDK against a stand-in engine of each kind:
``n`` choices (one engine request for vLLM and SGLang, which take ``n``; n
requests for llama.cpp, which does not), the deprecated ``functions`` form
answered with ``function_call``, and an empty ``messages`` refused."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.helpers.serve import REQUEST, Rig, answer_of, expected, wait_for

ONE = {"role": "assistant", "reasoning_content": "Short.", "content": "Four."}
TWO = {"role": "assistant", "content": "",
       "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": json.dumps({"expr": "2+2"})}}]}
THREE = {"role": "assistant", "content": "It is 4, and the spec is at xtml.dev."}
ANSWERS = [answer_of(m) for m in (ONE, TWO, THREE)]


def _script(rig: Rig) -> None:
    """Choice k answers ANSWERS[k]: told by the engine's own choice index
    (vLLM, SGLang), or by the order of the n requests (llama.cpp)."""
    asked = [0]

    def answer(body: dict[str, Any]) -> list[int]:
        if rig.kind == "llamacpp":
            asked[0] += 1
            return ANSWERS[(asked[0] - 1) % len(ANSWERS)]
        return ANSWERS[body["choice"]]

    rig.engine.answer = answer


def _whole(choice: Any) -> dict[str, Any]:
    m = choice.message
    return {"content": m.content or "", "reasoning_content": (m.model_extra or {}).get("reasoning_content", ""),
            "calls": [(c.function.name, c.function.arguments) for c in m.tool_calls or ()],
            "finish_reason": choice.finish_reason,
            "diagnostics": sorted(d["kind"] for d in (choice.model_extra or {})["xtml_diagnostics"])}


def _streamed(chunks: list[Any]) -> dict[int, dict[str, Any]]:
    """What a client assembles from a stream of n choices, by index."""
    out: dict[int, dict[str, Any]] = {}
    calls: dict[int, dict[int, list[str]]] = {}
    assert len({c.id for c in chunks}) == 1
    for c in chunks:
        for ch in c.choices:
            got = out.setdefault(ch.index, {"content": "", "reasoning_content": "", "calls": [],
                                            "finish_reason": None, "diagnostics": [], "role": ch.delta.role})
            assert got["finish_reason"] is None, "a chunk of a choice after its finish_reason"
            got["content"] += ch.delta.content or ""
            got["reasoning_content"] += (ch.delta.model_extra or {}).get("reasoning_content") or ""
            for tc in ch.delta.tool_calls or ():
                if tc.id is not None:
                    calls.setdefault(ch.index, {})[tc.index] = [tc.function.name, ""]
                calls[ch.index][tc.index][1] += tc.function.arguments or ""
            if ch.finish_reason is not None:
                got["finish_reason"] = ch.finish_reason
                got["diagnostics"] = sorted(d["kind"] for d in (ch.model_extra or {})["xtml_diagnostics"])
    for k, got in out.items():
        assert got.pop("role") == "assistant"
        got["calls"] = [tuple(v) for _, v in sorted(calls.get(k, {}).items())]
    return out


# -- n choices -------------------------------------------------------------------------------

def _asked(rig: Rig, before: int, n: int) -> None:
    """The engine was asked once for n choices, or n times for one."""
    bodies = rig.engine.requests[before:]
    if rig.kind == "llamacpp":
        assert len(bodies) == n and all("n" not in b for b in bodies)
    else:
        assert len(bodies) == 1
        got = bodies[0]["n"] if rig.kind == "vllm" else bodies[0]["sampling_params"]["n"]
        assert got == n


def test_n_choices_whole(rig: Rig) -> None:
    _script(rig)
    before, sent = len(rig.engine.requests), len(rig.engine.sent)
    r = rig.client.chat.completions.create(model="kimi-k3", n=3, **REQUEST)
    _asked(rig, before, 3)
    outs = rig.engine.sent[sent:]
    assert [c.index for c in r.choices] == [0, 1, 2]
    got = [_whole(c) for c in r.choices]
    want = [expected(ids) for ids in ANSWERS]
    if rig.kind == "llamacpp":
        got, want = sorted(got, key=str), sorted(want, key=str)
    assert got == want
    assert r.usage is not None
    assert r.usage.completion_tokens == sum(map(len, outs)) and r.usage.prompt_tokens == len(rig.prompt())


@pytest.mark.parametrize("stream", [False, True])
def test_n_requests_with_a_seed_sample_n_choices(llamacpp: Rig, stream: bool) -> None:
    """An engine without n is asked n times: with seed s, choice k has seed
    s + k, or the n requests would sample the same choice n times."""
    _script(llamacpp)
    before = len(llamacpp.engine.requests)
    r = llamacpp.client.chat.completions.create(model="kimi-k3", n=3, seed=7, stream=stream, **REQUEST)
    if stream:
        list(r)
    assert sorted(b["seed"] for b in llamacpp.engine.requests[before:]) == [7, 8, 9]


def test_n_choices_streamed(rig: Rig) -> None:
    _script(rig)
    before, sent = len(rig.engine.requests), len(rig.engine.sent)
    chunks = list(rig.client.chat.completions.create(model="kimi-k3", n=3, stream=True,
                                                     stream_options={"include_usage": True}, **REQUEST))
    _asked(rig, before, 3)
    outs = rig.engine.sent[sent:]
    got = _streamed(chunks)
    assert sorted(got) == [0, 1, 2]
    want = [expected(ids) for ids in ANSWERS]
    if rig.kind == "llamacpp":
        assert sorted(got.values(), key=str) == sorted(want, key=str)
    else:
        assert [got[k] for k in range(3)] == want
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.completion_tokens == sum(map(len, outs)) and usage.prompt_tokens == len(rig.prompt())


def test_n_choices_each_cut_at_the_token_limit(vllm: Rig) -> None:
    _script(vllm)
    limit = 8
    r = vllm.client.chat.completions.create(model="kimi-k3", n=3, max_tokens=limit, **REQUEST)
    assert [c.finish_reason for c in r.choices] == ["length"] * 3
    chunks = list(vllm.client.chat.completions.create(model="kimi-k3", n=3, max_tokens=limit, stream=True,
                                                      **REQUEST))
    got = _streamed(chunks)
    assert [got[k] for k in range(3)] == [_whole(c) for c in r.choices]


def test_n_choices_engine_failure_mid_stream(vllm: Rig) -> None:
    _script(vllm)
    vllm.engine.mode = "error_mid_stream"
    with pytest.raises(openai.APIError, match="the engine failed"):
        list(vllm.client.chat.completions.create(model="kimi-k3", n=2, stream=True, **REQUEST))


def test_a_client_that_leaves_cancels_every_choice(rig: Rig) -> None:
    rig.engine.answer = ANSWERS[2] * 40
    rig.engine.delay = 0.01
    closed = rig.engine.closed_early
    try:
        stream = rig.client.chat.completions.create(model="kimi-k3", n=2, stream=True, **REQUEST)
        for chunk in stream:
            if any(ch.delta.content for ch in chunk.choices):
                break
        stream.close()
        # One engine request for both choices, or one per choice (llama.cpp).
        assert wait_for(lambda: rig.engine.closed_early - closed == (2 if rig.kind == "llamacpp" else 1))
    finally:
        rig.engine.delay = 0.0


# -- the deprecated functions form ----------------------------------------------------------

FUNCTIONS = [t["function"] for t in REQUEST["tools"]]
LEGACY = {"messages": REQUEST["messages"], "functions": FUNCTIONS}


def test_functions_are_answered_with_function_call(rig: Rig) -> None:
    rig.engine.answer = ANSWERS[1]
    r = rig.client.chat.completions.create(model="kimi-k3", **LEGACY)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "function_call"
    assert m.tool_calls is None and m.function_call is not None
    assert (m.function_call.name, json.loads(m.function_call.arguments)) == ("calc", {"expr": "2+2"})
    chunks = list(rig.client.chat.completions.create(model="kimi-k3", stream=True, **LEGACY))
    name, args, finish = "", "", []
    for c in chunks:
        for ch in c.choices:
            assert ch.delta.tool_calls is None
            if ch.delta.function_call is not None:
                name += ch.delta.function_call.name or ""
                args += ch.delta.function_call.arguments or ""
            if ch.finish_reason:
                finish.append(ch.finish_reason)
    assert (name, args, finish) == ("calc", m.function_call.arguments, ["function_call"])
    # Text stays text.
    rig.engine.answer = ANSWERS[0]
    r = rig.client.chat.completions.create(model="kimi-k3", **LEGACY)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == "Four."


def test_a_second_call_in_the_functions_form_is_named_not_lost(vllm: Rig) -> None:
    two = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "search", "arguments": json.dumps({"q": "xtml"})}},
        {"type": "function", "function": {"name": "calc", "arguments": json.dumps({"expr": "2+2"})}}]}
    vllm.engine.answer = answer_of(two)
    for stream in (False, True):
        body = {"model": "kimi-k3", **LEGACY, "stream": stream}
        r = vllm.post(body)
        assert r.status_code == 200
        if stream:
            events = [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")]
            final = next(e["choices"][0] for e in events if e["choices"] and e["choices"][0]["finish_reason"])
            calls = [e["choices"][0]["delta"]["function_call"] for e in events
                     if e["choices"] and "function_call" in e["choices"][0]["delta"]]
            assert calls[0]["name"] == "search" and all(c.get("name") in (None, "search") for c in calls)
        else:
            final = r.json()["choices"][0]
            assert final["message"]["function_call"]["name"] == "search"
        dropped = [d for d in final["xtml_diagnostics"] if d["kind"] == "dropped-call"]
        assert [(d["index"], d["name"]) for d in dropped] == [(1, "calc")]


# -- messages --------------------------------------------------------------------------------

def test_an_empty_messages_list_is_a_400(vllm: Rig) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        vllm.client.chat.completions.create(model="kimi-k3", messages=[])
    assert e.value.body["param"] == "messages"  # type: ignore[index]
    assert not vllm.engine.requests


@pytest.fixture
def vllm() -> Any:
    r = Rig("vllm")
    yield r
    r.close()


@pytest.fixture
def llamacpp() -> Any:
    r = Rig("llamacpp")
    yield r
    r.close()
