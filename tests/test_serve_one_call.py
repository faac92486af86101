"""``parallel_tool_calls: false`` holds whatever the engine does.

The completion grammar holds a model to one call, but an engine that ignores
it (the stand-in engines here answer with their scripted ids whatever
grammar they are sent) or a gateway run with ``--no-grammar`` gets two back.
The gateway then hands back the first call and withholds the others, named
by a ``withheld-call`` diagnostic, as it withholds a call the token limit
cut: chat completions and the Responses API, whole and streamed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.helpers.serve import ANSWERS, CALC, REQUEST, SEARCH, Rig, expected, got_stream, got_whole


def _tool(t: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", **t["function"]}


BODY: dict[str, Any] = {"model": "kimi-k3", "instructions": REQUEST["messages"][0]["content"],
                        "input": REQUEST["messages"][1]["content"], "tools": [_tool(SEARCH), _tool(CALC)]}


@pytest.fixture(scope="module")
def no_grammar() -> Iterator[Rig]:
    r = Rig("vllm", grammar=False)
    yield r
    r.close()


def _one_call() -> dict[str, Any]:
    """What the engine's two calls become when one is allowed."""
    want = expected(ANSWERS["calls"])
    assert [name for name, _ in want["calls"]] == ["search", "calc"]
    want["calls"] = want["calls"][:1]
    want["diagnostics"] = sorted([*want["diagnostics"], "withheld-call"])
    return want


def _withheld(diagnostics: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(d["index"], d["name"]) for d in diagnostics if d["kind"] == "withheld-call"]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completion_hands_back_one_call(rig: Rig, stream: bool) -> None:
    rig.engine.answer = ANSWERS["calls"]
    if stream:
        chunks = list(rig.client.chat.completions.create(model="kimi-k3", stream=True, parallel_tool_calls=False,
                                                         **REQUEST))
        got = got_stream(chunks)
        end = next(c for c in chunks if c.choices and c.choices[0].finish_reason is not None)
        diagnostics = (end.choices[0].model_extra or {})["xtml_diagnostics"]
        # Nothing of the second call went out: not even its start.
        assert all(tc.index == 0 for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ())
    else:
        r = rig.client.chat.completions.create(model="kimi-k3", parallel_tool_calls=False, **REQUEST)
        got = got_whole(r)
        diagnostics = (r.choices[0].model_extra or {})["xtml_diagnostics"]
    assert got == _one_call()
    assert got["finish_reason"] == "tool_calls"
    assert _withheld(diagnostics) == [(1, "calc")]
    assert "parallel_tool_calls is false" in next(d["message"] for d in diagnostics if d["kind"] == "withheld-call")


@pytest.mark.parametrize("stream", [False, True])
def test_without_a_grammar_too(no_grammar: Rig, stream: bool) -> None:
    no_grammar.engine.reset()
    no_grammar.engine.answer = ANSWERS["calls"]
    if stream:
        got = got_stream(list(no_grammar.client.chat.completions.create(
            model="kimi-k3", stream=True, parallel_tool_calls=False, **REQUEST)))
    else:
        got = got_whole(no_grammar.client.chat.completions.create(model="kimi-k3", parallel_tool_calls=False,
                                                                  **REQUEST))
    assert "structured_outputs" not in no_grammar.engine.requests[-1]
    assert got == _one_call()


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_calls_are_all_handed_back(rig: Rig, stream: bool) -> None:
    """The bound is the request's: by default every call comes back."""
    rig.engine.answer = ANSWERS["calls"]
    if stream:
        got = got_stream(list(rig.client.chat.completions.create(model="kimi-k3", stream=True, **REQUEST)))
    else:
        got = got_whole(rig.client.chat.completions.create(model="kimi-k3", **REQUEST))
    assert got == expected(ANSWERS["calls"])
    assert len(got["calls"]) == 2


def _calls(output: list[Any]) -> list[str]:
    return [i.name for i in output if i.type == "function_call"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_holds_one_call(rig: Rig, stream: bool) -> None:
    rig.engine.answer = ANSWERS["calls"]
    if stream:
        with rig.client.responses.stream(**BODY, parallel_tool_calls=False) as s:
            events = list(s)
            r = s.get_final_response()
        added = [e.item for e in events if e.type == "response.output_item.added"]
        assert _calls(added) == ["search"]
    else:
        r = rig.client.responses.create(**BODY, parallel_tool_calls=False)
    assert r.parallel_tool_calls is False
    assert r.status == "completed"
    assert _calls(r.output) == ["search"]
    assert _withheld((r.model_extra or {})["xtml_diagnostics"]) == [(1, "calc")]
    # The conversation kept for a follow-up holds the call handed back,
    # and only it: an output for the withheld one answers no call.
    call = next(i for i in r.output if i.type == "function_call")
    rig.engine.answer = ANSWERS["text"]
    ok = rig.client.responses.create(**{**BODY, "previous_response_id": r.id, "input": [
        {"type": "function_call_output", "call_id": call.call_id, "output": "found"}]})
    assert ok.status == "completed"
    withheld = next(d["id"] for d in (r.model_extra or {})["xtml_diagnostics"] if d["kind"] == "withheld-call")
    with pytest.raises(openai.BadRequestError) as e:
        rig.client.responses.create(**{**BODY, "previous_response_id": r.id, "input": [
            {"type": "function_call_output", "call_id": withheld, "output": "found"}]})
    assert e.value.body["param"] == "input[0].call_id"  # type: ignore[index]


def test_a_response_without_the_bound_holds_both_calls(rig: Rig) -> None:
    rig.engine.answer = ANSWERS["calls"]
    r = rig.client.responses.create(**BODY)
    assert r.parallel_tool_calls is True
    assert _calls(r.output) == ["search", "calc"]


@pytest.mark.parametrize("stream", [False, True])
def test_each_of_n_choices_hands_back_one_call(no_grammar: Rig, stream: bool) -> None:
    no_grammar.engine.reset()
    no_grammar.engine.answer = ANSWERS["calls"]
    if stream:
        chunks = list(no_grammar.client.chat.completions.create(model="kimi-k3", stream=True, n=2,
                                                                parallel_tool_calls=False, **REQUEST))
        names: dict[int, list[str]] = {0: [], 1: []}
        withheld: dict[int, list[tuple[int, str]]] = {}
        for c in chunks:
            for ch in c.choices:
                names[ch.index] += [tc.function.name for tc in ch.delta.tool_calls or () if tc.function and
                                    tc.function.name]
                if ch.finish_reason is not None:
                    assert ch.finish_reason == "tool_calls"
                    withheld[ch.index] = _withheld((ch.model_extra or {})["xtml_diagnostics"])
        assert names == {0: ["search"], 1: ["search"]}
        assert withheld == {0: [(1, "calc")], 1: [(1, "calc")]}
    else:
        r = no_grammar.client.chat.completions.create(model="kimi-k3", n=2, parallel_tool_calls=False, **REQUEST)
        assert len(r.choices) == 2
        for ch in r.choices:
            assert [c.function.name for c in ch.message.tool_calls or ()] == ["search"]
            assert _withheld((ch.model_extra or {})["xtml_diagnostics"]) == [(1, "calc")]
