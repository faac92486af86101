"""``xtml serve``'s Responses API (``POST /v1/responses``): the real openai
SDK (``responses.create``, ``responses.stream``, ``responses.parse``) and raw
httpx against the gateway under uvicorn, in front of a stand-in engine of
each kind answering with chosen completion ids.

What is checked: a Responses request reaches the engine as exactly the ids
of the chat request it translates to; every object and every stream event
validates as the openai SDK's own types (``openai.types.responses``); the
output items are what xtml's batch parse of the engine's ids gives, and a
stream's events join to the whole answer; ``previous_response_id`` continues
a stored conversation, and one that is not stored is a 404 that says so;
what cannot be served is a 400 naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

from tests.helpers.serve import ANSWERS, CALC, K3, MESSAGES, REQUEST, SEARCH, Rig, answer_of, expected, wait_for
from tests.helpers.tokenizers import k3_vocab as vocab
from xtml.serving.responses import ResponseStore, Stored, effort_of


def _tool(t: dict[str, Any]) -> dict[str, Any]:
    """A chat tool as a Responses function tool."""
    return {"type": "function", **t["function"]}


# REQUEST (tests/helpers/serve.py) as a Responses request.
BODY: dict[str, Any] = {"model": "kimi-k3", "instructions": REQUEST["messages"][0]["content"],
                        "input": REQUEST["messages"][1]["content"], "tools": [_tool(SEARCH), _tool(CALC)]}
EVENT = TypeAdapter(ResponseStreamEvent)


def post(rig: Rig, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(rig.url + "/v1/responses", content=json.dumps(body).encode(),
                      headers={"content-type": "application/json"}, timeout=30, **kw)


def events(rig: Rig, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's events, each checked against the SDK's types, its
    ``event:`` line and its place in the sequence."""
    r = post(rig, {**body, "stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    out: list[dict[str, Any]] = []
    for block in r.text.split("\n\n"):
        if not block:
            continue
        head, data = block.split("\n")
        assert head.startswith("event: ") and data.startswith("data: "), block
        event = json.loads(data[6:])
        assert head[7:] == event["type"]
        EVENT.validate_python(event)
        assert event["sequence_number"] == len(out)
        out.append(event)
    return out


def seen(response: dict[str, Any]) -> dict[str, Any]:
    """A response object as :func:`tests.helpers.serve.expected` has an
    answer."""
    Response.model_validate(response)
    out = response["output"]
    assert len({i["id"] for i in out}) == len(out)
    calls = [(i["name"], i["arguments"]) for i in out if i["type"] == "function_call"]
    assert all(i["call_id"].startswith("call_") for i in out if i["type"] == "function_call")
    status = response["status"]
    return {"content": "".join(p["text"] for i in out if i["type"] == "message" for p in i["content"]),
            "reasoning_content": "".join(p["text"] for i in out if i["type"] == "reasoning" for p in i["content"]),
            "calls": calls,
            "items": [(i["type"], i["status"]) for i in out],
            "finish_reason": "length" if status == "incomplete" else "tool_calls" if calls else "stop",
            "diagnostics": sorted(d["kind"] for d in response["xtml_diagnostics"])}


def items_aside(got: dict[str, Any]) -> dict[str, Any]:
    """What :func:`seen` has, less the items' kinds and statuses (which
    :func:`tests.helpers.serve.expected` does not know)."""
    return {k: v for k, v in got.items() if k != "items"}


def joined(evs: list[dict[str, Any]]) -> dict[str, Any]:
    """The final response of a stream, after checking that its deltas join
    to the text of each of its items."""
    assert evs[0]["type"] == "response.created" and evs[1]["type"] == "response.in_progress"
    assert evs[-1]["type"] in ("response.completed", "response.incomplete")
    final: dict[str, Any] = evs[-1]["response"]
    deltas: dict[str, list[str]] = {}
    done: dict[str, dict[str, Any]] = {}
    for e in evs:
        if e["type"].endswith(".delta"):
            deltas.setdefault(e["item_id"], []).append(e["delta"])
        elif e["type"] == "response.output_item.done":
            done[e["item"]["id"]] = e["item"]
    for item in final["output"]:
        assert done[item["id"]] == item
        text = "".join(deltas.get(item["id"], ()))
        if item["type"] == "function_call":
            assert text == item["arguments"]
        else:
            assert text == "".join(p["text"] for p in item["content"])
    return final


# -- the whole path ------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_whole_response(rig: Rig, name: str) -> None:
    rig.engine.answer = [*ANSWERS[name], 100, 200]
    r = rig.client.responses.create(**BODY)
    assert rig.prompt() == K3.encode(REQUEST, vocab())
    sent = rig.engine.sent[-1]
    raw = rig.client.responses.retrieve(r.id).model_dump(exclude_unset=True, by_alias=True)
    raw["xtml_diagnostics"] = (r.model_extra or {})["xtml_diagnostics"]
    assert items_aside(seen(raw)) == expected(sent)
    assert r.status == "completed" and r.object == "response" and r.model == "kimi-k3"
    assert r.usage is not None
    assert (r.usage.input_tokens, r.usage.output_tokens) == (len(rig.prompt()), len(sent))
    # The reasoning's ids, as the template counts them (the prompt opened it).
    assert r.usage.output_tokens_details.reasoning_tokens == K3.reasoning_tokens(
        sent, vocab(), thinking=K3.encode_request(REQUEST, vocab()).options.thinking)
    want = MESSAGES[name]
    assert r.output_text == want["content"]
    assert [(c.name, c.arguments) for c in r.output if c.type == "function_call"] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in want.get("tool_calls", ())]


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_streamed_response_joins_to_the_whole_one(rig: Rig, name: str) -> None:
    rig.engine.answer = [*ANSWERS[name], 100, 200]
    whole = post(rig, BODY).json()
    evs = events(rig, BODY)
    assert rig.prompt() == K3.encode(REQUEST, vocab())
    final = joined(evs)
    assert seen(final) == seen(whole)
    assert items_aside(seen(final)) == expected(rig.engine.sent[-1])
    assert final["usage"] == whole["usage"]
    kinds = [e["type"] for e in evs]
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") \
        == len(final["output"])
    assert kinds.count("response.function_call_arguments.done") == sum(
        i["type"] == "function_call" for i in final["output"])


def test_the_sdk_stream_helper_builds_the_same_response(rig: Rig) -> None:
    rig.engine.answer = ANSWERS["literals"]
    with rig.client.responses.stream(**BODY) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.output_text.delta" in kinds and "response.reasoning_text.delta" in kinds
    assert final.output_text == MESSAGES["literals"]["content"]
    call = next(i for i in final.output if i.type == "function_call")
    assert json.loads(call.arguments) == json.loads(MESSAGES["literals"]["tool_calls"][0]["function"]["arguments"])


# -- a tool round trip -----------------------------------------------------------------------

CALL = {"role": "assistant", "reasoning_content": "Look it up.", "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": json.dumps({"q": "xtml"})}}]}
FINAL = {"role": "assistant", "content": "It is at xtml.dev/spec."}


def _round(rig: Rig, stream: bool) -> tuple[list[int], list[int]]:
    """A call, then the answer after its output, both ways a client sends
    the second turn: after ``previous_response_id`` and as the whole input.
    The engine's prompts of the second turn."""
    rig.engine.answer = answer_of(CALL)
    if stream:
        with rig.client.responses.stream(**BODY) as s:
            first = s.get_final_response()
    else:
        first = rig.client.responses.create(**BODY)
    call = next(i for i in first.output if i.type == "function_call")
    assert (call.name, json.loads(call.arguments)) == ("search", {"q": "xtml"})
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "xtml.dev/spec"}
    rig.engine.answer = answer_of(FINAL)
    prompts = []
    for second in ({**BODY, "input": [result], "previous_response_id": first.id},
                   {**BODY, "input": [{"role": "user", "content": BODY["input"]},
                                      *[i.model_dump(exclude_none=True) for i in first.output], result]}):
        r = rig.client.responses.create(**second)
        assert r.output_text == FINAL["content"] and r.status == "completed"
        prompts.append(rig.prompt())
    return prompts[0], prompts[1]


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_round_trip(rig: Rig, stream: bool) -> None:
    by_id, replayed = _round(rig, stream)
    assert by_id == replayed
    # The chat conversation the items stand for, rendered by the template.
    call = {"id": "call_x", "type": "function", "function": {"name": "search", "arguments": json.dumps({"q": "xtml"})}}
    chat = {**REQUEST, "messages": [*REQUEST["messages"], {**CALL, "tool_calls": [call]},
                                    {"role": "tool", "tool_call_id": "call_x", "content": "xtml.dev/spec"}]}
    assert by_id == K3.encode(chat, vocab())


def test_the_openai_agents_sdk_runs_its_tools(rig: Rig) -> None:
    """The openai-agents SDK with its default model (OpenAIResponsesModel),
    run whole and streamed, through a tool call and the answer after it."""
    import asyncio

    import agents

    agents.set_tracing_disabled(True)
    ran: list[str] = []

    @agents.function_tool
    def search(q: str) -> str:
        """Search the web."""
        ran.append(q)
        return "xtml.dev/spec"

    def answer(body: dict[str, Any]) -> list[int]:
        # The model calls the tool until its output is in the prompt.
        prompt = body["input_ids"] if rig.kind == "sglang" else body["prompt"]
        return answer_of(FINAL if "xtml.dev/spec" in vocab().decode(prompt) else CALL)

    rig.engine.answer = answer

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=rig.url + "/v1", api_key="none", max_retries=0, timeout=30)
        agent = agents.Agent(name="helper", instructions="Be brief.", tools=[search],
                             model=agents.OpenAIResponsesModel("kimi-k3", client))
        assert isinstance(agent.model, agents.OpenAIResponsesModel)
        whole = await agents.Runner.run(agent, "Where is the XTML spec?")
        assert whole.final_output == FINAL["content"]
        assert [type(i).__name__ for i in whole.new_items] == ["ReasoningItem", "ToolCallItem",
                                                               "ToolCallOutputItem", "MessageOutputItem"]
        streamed = agents.Runner.run_streamed(agent, "Where is the XTML spec?")
        kinds = [e.type async for e in streamed.stream_events()]
        assert "raw_response_event" in kinds
        assert streamed.final_output == FINAL["content"]
        await client.close()

    asyncio.run(run())
    assert ran == ["xtml", "xtml"]


# -- fields ----------------------------------------------------------------------------------

class Answer(BaseModel):
    city: str
    population: int


def test_text_format_sends_the_grammar_and_parses(rig: Rig) -> None:
    text = json.dumps({"city": "Oslo", "population": 700000})
    rig.engine.answer = answer_of({"role": "assistant", "content": text})
    r = rig.client.responses.parse(model="kimi-k3", input="Oslo?", text_format=Answer)
    assert r.output_parsed == Answer(city="Oslo", population=700000)
    body = rig.engine.requests[-1]
    grammar = (body.get("structured_outputs") or {}).get("grammar") or body.get("grammar") \
        or (body.get("sampling_params") or {}).get("ebnf")
    assert grammar and "population" in grammar
    # json_object too; and the prompt is the chat request's with its response_format.
    rig.client.responses.create(model="kimi-k3", input="Oslo?", text={"format": {"type": "json_object"}})
    assert rig.prompt() == K3.encode({"messages": [{"role": "user", "content": "Oslo?"}],
                                      "response_format": {"type": "json_object"}}, vocab())


@pytest.mark.parametrize(("effort", "chat"), [("none", "none"), ("low", "low"), ("medium", "high"),
                                              ("high", "high"), ("xhigh", "max"), ("minimal", "low")])
def test_reasoning_effort_is_the_dialects(vllm: Rig, effort: str, chat: str) -> None:
    vllm.engine.answer = ANSWERS["text"]
    post(vllm, {"model": "kimi-k3", "input": "Hi", "reasoning": {"effort": effort}}).raise_for_status()
    assert vllm.prompt() == K3.encode({"messages": [{"role": "user", "content": "Hi"}],
                                       "reasoning_effort": chat}, vocab())


def test_effort_of() -> None:
    assert effort_of("medium", ("low", "high", "max"), ("none",)) == "high"
    assert effort_of("max", ("low", "high", "max"), ("none",)) == "max"
    assert effort_of("none", ("low", "high"), ("off",)) == "off"
    assert effort_of("turbo", ("low", "high"), ()) == "turbo"  # for the chat layer to refuse


def test_input_items_are_the_chat_messages_they_stand_for(vllm: Rig) -> None:
    vllm.engine.answer = ANSWERS["text"]
    items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
             {"role": "user", "content": [{"type": "input_text", "text": "Add "}, {"type": "input_text",
                                                                                   "text": "2 and 2."}]},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text",
                                                                             "text": "Use calc."}]},
             {"type": "function_call", "call_id": "call_1", "name": "calc", "arguments": '{"expr": "2+2"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "4"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Four."}]},
             {"role": "user", "content": "Thanks"}]
    r = post(vllm, {"model": "kimi-k3", "input": items, "tools": [_tool(CALC)], "max_output_tokens": 50,
                    "temperature": 0.5, "store": False})
    assert r.status_code == 200, r.text
    chat = {"messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                         {"role": "user", "content": [{"type": "text", "text": "Add "},
                                                      {"type": "text", "text": "2 and 2."}]},
                         {"role": "assistant", "content": "", "reasoning_content": "Use calc.", "tool_calls": [
                             {"id": "call_1", "type": "function", "function": {"name": "calc",
                                                                               "arguments": '{"expr": "2+2"}'}}]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "4"},
                         {"role": "assistant", "content": "Four."},
                         {"role": "user", "content": "Thanks"}], "tools": [CALC]}
    assert vllm.prompt() == K3.encode(chat, vocab())
    body = vllm.engine.requests[-1]
    assert (body["max_tokens"], body["temperature"]) == (50, 0.5)
    # Not stored: there is nothing to continue.
    r2 = post(vllm, {"model": "kimi-k3", "input": "more", "previous_response_id": r.json()["id"]})
    assert r2.status_code == 404


def test_cut_off_by_max_output_tokens(vllm: Rig) -> None:
    ids = ANSWERS["calls"]
    vllm.engine.answer = ids
    limit = len(ids) - 6  # inside the second call
    body = {**BODY, "max_output_tokens": limit}
    whole = post(vllm, body).json()
    assert whole["status"] == "incomplete" and whole["incomplete_details"] == {"reason": "max_output_tokens"}
    evs = events(vllm, body)
    assert evs[-1]["type"] == "response.incomplete"
    final = joined(evs)
    assert seen(final) == seen(whole)
    assert items_aside(seen(final)) == expected(vllm.engine.sent[-1])
    # The call the limit cut is withheld: it must not run.
    assert [i["name"] for i in final["output"] if i["type"] == "function_call"] == ["search"]
    cut = [e["item"] for e in evs if e["type"] == "response.output_item.done"
           and e["item"]["type"] == "function_call" and e["item"]["status"] == "incomplete"]
    assert [c["name"] for c in cut] == ["calc"]
    assert "withheld-call" in seen(final)["diagnostics"]


TEXT_AND_CALLS = {"role": "assistant", "reasoning_content": "Look it up.", "content": "Let me look.",
                  "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": json.dumps(
                      {"q": "xtml", "limit": 2})}},
                                 {"type": "function", "function": {"name": "calc", "arguments": json.dumps(
                                     {"expr": "2+2"})}}]}


def test_a_json_schema_without_a_name_echoes_the_name_served(vllm: Rig) -> None:
    vllm.engine.answer = answer_of({"role": "assistant", "reasoning_content": "Easy.", "content": '{"a": 1}'})
    r = post(vllm, {**BODY, "text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}})
    assert r.status_code == 200, r.text
    Response.model_validate(r.json())
    assert r.json()["text"]["format"]["name"] == "response"


@pytest.mark.parametrize("cut", [None, 3, 8])
def test_items_are_done_in_order_and_the_stream_joins_to_the_whole(vllm: Rig, cut: int | None) -> None:
    """Each output item is done before the next is added, in index order,
    as OpenAI's streams go; statuses as the whole answer has them, whether
    the token limit cut nothing, the second call or the first."""
    ids = answer_of(TEXT_AND_CALLS)
    vllm.engine.answer = ids
    body = {**BODY, **({"max_output_tokens": len(ids) - cut} if cut else {})}
    whole = post(vllm, body).json()
    evs = events(vllm, body)
    final = joined(evs)
    assert seen(final) == seen(whole)
    opened: list[int] = []
    for e in evs:
        if e["type"] == "response.output_item.added":
            assert not opened, f"item {e['output_index']} added while {opened} is open"
            opened.append(e["output_index"])
        elif e["type"] == "response.output_item.done":
            assert opened == [e["output_index"]]
            opened.clear()
    done = [e["output_index"] for e in evs if e["type"] == "response.output_item.done"]
    assert done == sorted(done) == list(range(len(done)))


# -- the store -------------------------------------------------------------------------------

def test_previous_response_id_not_stored_is_a_404(vllm: Rig) -> None:
    vllm.engine.answer = ANSWERS["text"]
    with pytest.raises(openai.NotFoundError) as e:
        vllm.client.responses.create(model="kimi-k3", input="Hi", previous_response_id="resp_nope")
    assert "resp_nope" in str(e.value) and e.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert e.value.body["code"] == "previous_response_not_found"  # type: ignore[index]
    assert len(vllm.engine.requests) == 0
    with pytest.raises(openai.NotFoundError):
        vllm.client.responses.retrieve("resp_nope")


def test_instructions_are_not_carried_over(vllm: Rig) -> None:
    vllm.engine.answer = ANSWERS["text"]
    first = vllm.client.responses.create(model="kimi-k3", input="Hi", instructions="Be brief.")
    vllm.client.responses.create(model="kimi-k3", input="More", previous_response_id=first.id,
                                 instructions="Be long.")
    chat = {"messages": [{"role": "system", "content": "Be long."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", **{k: v for k, v in MESSAGES["text"].items() if k != "role"}},
                         {"role": "user", "content": "More"}]}
    assert vllm.prompt() == K3.encode(chat, vocab())
    deleted = httpx.delete(f"{vllm.url}/v1/responses/{first.id}", timeout=10)
    assert deleted.json() == {"id": first.id, "object": "response", "deleted": True}
    assert post(vllm, {"model": "kimi-k3", "input": "x", "previous_response_id": first.id}).status_code == 404


def test_the_store_is_bounded_in_entries_and_age() -> None:
    now = [0.0]
    store = ResponseStore(max_entries=2, max_age=10, clock=lambda: now[0])
    for k in range(3):
        store.put(f"r{k}", Stored({"id": f"r{k}"}, []))
        now[0] += 1
    assert store.get("r0") is None and store.get("r1") is not None and len(store) == 2
    now[0] = 11.5  # r1 was stored at 1: older than 10 s
    assert store.get("r1") is None and store.get("r2") is not None
    now[0] = 12.5
    assert len(store) == 0
    assert len(ResponseStore(max_entries=0)) == 0
    with pytest.raises(ValueError):
        ResponseStore(max_age=0)


def test_the_command_takes_the_store_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    from xtml.cli.main import main as xtml_main

    for bad in (["--store-entries", "-1"], ["--store-age", "0"]):
        assert xtml_main(["serve", "--backend", "http://127.0.0.1:1", "--tokenizer", "x", *bad]) == 2
        err = capsys.readouterr().err
        assert bad[0] in err and "Traceback" not in err


# -- what is refused -------------------------------------------------------------------------

def _output(call_id: str, output: str = "x") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


CALLS = [{"type": "function_call", "call_id": "c1", "name": "search", "arguments": json.dumps({"q": "xtml"})},
         {"type": "function_call", "call_id": "c2", "name": "calc", "arguments": json.dumps({"expr": "2+2"})}]


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"tools": [{"type": "web_search"}, _tool(CALC)]}, "tools", "tools[0] ('web_search')"),
    ({"tool_choice": {"type": "web_search"}}, "tool_choice", "web_search"),
    ({"background": True}, "background", "background"),
    ({"conversation": "conv_1"}, "conversation", "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt", "prompt"),
    ({"top_logprobs": 2}, "top_logprobs", "log probabilities"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "item_reference"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type", "web_search_call"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "What is it?"},
                                             {"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]},
     "input[0].content[1]", "image_url"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "role"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "calc"}]}, "input[0].arguments", "arguments"),
    ({"input": []}, "input", "no message"),
    ({"input": 5}, "input", "string or a list"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type", "xml"),
    ({"reasoning": {"effort": "turbo"}}, "reasoning.effort", "turbo"),
    ({"max_output_tokens": 0}, "max_output_tokens", "at least 1"),
    ({"input": [{"type": "function_call_output", "call_id": "c",
                 "output": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].output[0].type", "input_image"),
    ({"stream": "yes"}, "stream", "true or false"),
    ({"user": 5}, "user", "string"),
    ({"max_tool_calls": -1}, "max_tool_calls", "whole number"),
    ({"frobnicate": 1}, "frobnicate", "unknown parameter"),
    ({"n": 2}, "n", "unknown parameter"),
    ({"include": ["message.output_text.logprobs"]}, "include", "log probabilities"),
    ({"context_management": [{"type": "compaction"}]}, "context_management", "not served"),
    ({"tools": [{"type": "function", "name": "f", "parameters": "x"}]}, "tools[0].parameters", "parameters"),
    ({"max_output_tokens": "x"}, "max_output_tokens", "max_output_tokens"),
    ({"metadata": [1]}, "metadata", "object"),
    ({"metadata": {"a": 1}}, "metadata.a", "512"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "16"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls", "true or false"),
    ({"text": {"format": {"type": "json_schema", "name": 5, "schema": {"type": "object"}}}}, "text.format.name",
     "string"),
    ({"input": [{"type": "reasoning", "summary": 5}, "Hi"]}, "input[0].summary", "list of parts"),
    ({"input": [{"type": "reasoning", "content": "abc"}]}, "input[0].content", "list of parts"),
    ({"input": [{"type": "reasoning", "content": ["a"]}]}, "input[0].content[0]", "text as a string"),
    ({"input": [{"type": "reasoning", "summary": [{"text": 5}]}]}, "input[0].summary[0]", "text as a string"),
    ({"input": [{"type": "reasoning", "summary": {"text": "x"}}]}, "input[0].summary", "list of parts"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}]}, "input[0]", "encrypted"),
    # A tool result goes to the call it names, or the request is refused:
    # matched by position, it would be sent to another call.
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].call_id",
     "No tool call found"),
    ({"input": [*CALLS, _output("c2"), _output("zzz")]}, "input[3].call_id", "'zzz'"),
    ({"input": [*CALLS, _output("c1"), _output("c1")]}, "input[3].call_id", "already has its function_call_output"),
    ({"input": [CALLS[0], {**CALLS[1], "call_id": "c1"}, _output("c1")]}, "input[1].call_id",
     "earlier function_call"),
    ({"input": [*CALLS, _output("c1"), _output("c2"), {"role": "assistant", "content": "Done."},
                {"role": "user", "content": "Again"}, _output("c1")]}, "input[6].call_id", "earlier assistant turn"),
    ({"input": [CALLS[0], _output("c1"), {"role": "user", "content": "Now"}, {**CALLS[1], "call_id": "c1"}]},
     "input[3].call_id", "earlier function_call"),
])
def test_what_cannot_be_served_is_a_400_naming_it(vllm: Rig, body: dict[str, Any], param: str, words: str) -> None:
    r = post(vllm, {"model": "kimi-k3", "input": "Hi", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert words in err["message"]
    # In the Responses request's own names, never the chat request's it became.
    assert not re.search(r"max_completion_tokens|reasoning_effort|response_format|\.function\.", err["message"])
    assert not vllm.engine.requests


def test_a_message_error_names_the_input_item(vllm: Rig) -> None:
    # The chat layer refuses the image part of the second message (the
    # first is the instructions'); the error names the item it came from.
    items = [{"role": "user", "content": "Hi"},
             {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]
    r = post(vllm, {"model": "kimi-k3", "instructions": "Be brief.", "input": items})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "input[1].content[0]" and "messages[" not in err["message"], err
    assert "input[1].content[0]" in err["message"]


# -- failures --------------------------------------------------------------------------------

def test_a_backend_that_is_down_is_an_error_object() -> None:
    from tests.helpers.engines import closed_port

    r = Rig("vllm", url=f"http://127.0.0.1:{closed_port()}")
    try:
        got = post(r, BODY)
        assert got.status_code == 502
        assert got.json()["error"]["code"] == "backend_unreachable"
        with pytest.raises(openai.APIStatusError):
            r.client.responses.create(**BODY, stream=True)
    finally:
        r.close()


def test_a_failure_after_the_stream_started_is_an_error_then_failed(rig: Rig) -> None:
    rig.engine.answer = ANSWERS["text"]
    rig.engine.mode = "error_mid_stream"
    try:
        evs = events(rig, BODY)
    finally:
        rig.engine.mode = "normal"
    assert [e["type"] for e in evs[-2:]] == ["error", "response.failed"]
    assert evs[-1]["response"]["status"] == "failed"
    assert evs[-1]["response"]["error"]["code"] == "server_error"
    assert evs[-2]["message"]


@pytest.fixture
def vllm() -> Iterator[Rig]:
    r = Rig("vllm")
    yield r
    r.close()


def test_the_engine_cancels_when_the_client_leaves(vllm: Rig) -> None:
    vllm.engine.answer = ANSWERS["text"] * 50
    vllm.engine.delay = 0.01
    with vllm.client.responses.stream(**BODY) as s:
        for e in s:
            if e.type == "response.reasoning_text.delta":
                break
    assert wait_for(lambda: vllm.engine.closed_early == 1)


def test_the_store_is_bounded_in_bytes() -> None:
    """A count of entries bounds no memory when a body may be 32 MiB: the
    store keeps at most max_bytes of JSON, the oldest dropped first, and
    never keeps one larger than that."""
    def entry(n: int) -> Stored:
        return Stored({"id": "r", "output": "x" * n}, [{"role": "user", "content": "y"}])

    store = ResponseStore(100, 60, max_bytes=2000)
    for k in range(5):
        store.put(f"r{k}", entry(600))
    assert [store.get(f"r{k}") is not None for k in range(5)] == [False, False, True, True, True]
    store.put("big", entry(5000))
    assert store.get("big") is None and len(store) == 3
    assert store.delete("r4") and len(store) == 2
    store.put("r5", entry(600))
    store.put("r6", entry(600))
    assert [store.get(f"r{k}") is not None for k in (2, 3, 5, 6)] == [False, True, True, True]
    with pytest.raises(ValueError):
        ResponseStore(10, 60, max_bytes=-1)


def test_tool_results_go_to_the_calls_they_name(vllm: Rig) -> None:
    """Outputs in another order than their calls are sent as their calls'
    (the chat request with each tool message naming its call)."""
    vllm.engine.answer = ANSWERS["text"]
    r = post(vllm, {**BODY, "input": [{"role": "user", "content": BODY["input"]}, *CALLS,
                                      _output("c2", "4"), _output("c1", "xtml.dev/spec")]})
    assert r.status_code == 200, r.text
    calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
             for i in CALLS]
    chat = {**REQUEST, "messages": [*REQUEST["messages"], {"role": "assistant", "content": "", "tool_calls": calls},
                                    {"role": "tool", "tool_call_id": "c1", "content": "xtml.dev/spec"},
                                    {"role": "tool", "tool_call_id": "c2", "content": "4"}]}
    assert vllm.prompt() == K3.encode(chat, vocab())


def test_a_follow_up_answers_the_stored_calls_by_id(vllm: Rig) -> None:
    vllm.engine.answer = ANSWERS["calls"]
    first = vllm.client.responses.create(**BODY)
    ids = [i.call_id for i in first.output if i.type == "function_call"]
    assert len(ids) == 2
    vllm.engine.answer = ANSWERS["text"]
    ok = post(vllm, {**BODY, "previous_response_id": first.id, "input": [_output(ids[1]), _output(ids[0])]})
    assert ok.status_code == 200, ok.text
    for given, at in (([_output(ids[1]), _output("call_unknown")], "input[1].call_id"),
                      ([_output(ids[0]), _output(ids[0])], "input[1].call_id")):
        r = post(vllm, {**BODY, "previous_response_id": first.id, "input": given})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == at


def _gateway(rig: Rig) -> Any:
    app: Any = rig.gateway.server.config.app
    route = next(r for r in app.routes if r.path == "/v1/responses")
    return route.endpoint.app.__self__


def test_a_small_follow_up_to_a_large_conversation_is_rendered_off_the_event_loop(
        vllm: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """What decides is the size of what is rendered (the stored
    conversation and the new input), not the body's: a 100-byte follow-up
    naming megabytes of conversation is rendered in a worker thread, where
    it holds up no other client's stream."""
    import asyncio

    gateway = _gateway(vllm)
    on_loop: list[bool] = []
    render = gateway.responses_job

    def spy(body: Any, made: Any = None) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return render(body, made)

    monkeypatch.setattr(gateway, "responses_job", spy)
    vllm.engine.answer = ANSWERS["text"]
    small = post(vllm, {"model": "kimi-k3", "input": "Hi"})
    assert small.status_code == 200
    large = post(vllm, {"model": "kimi-k3", "input": "Streaming parsers read model output. " * 3000})
    assert large.status_code == 200
    follow_up = {"model": "kimi-k3", "input": "And then?", "previous_response_id": large.json()["id"]}
    assert len(json.dumps(follow_up)) < 200
    assert post(vllm, follow_up).status_code == 200
    assert gateway.store.size(large.json()["id"]) > 64 << 10
    # The small request stays on the loop: a thread costs more than it.
    assert on_loop == [True, False, False]


def test_the_store_holds_what_its_bound_counts() -> None:
    """The store keeps each response as its JSON text: the memory it holds
    is the bytes its bound counts (kept as objects, many small messages
    took about 8 times as much)."""
    import gc
    import tracemalloc

    def history(k: int) -> list[dict[str, Any]]:
        return [{"role": "user" if i % 2 else "assistant", "content": f"m{k}.{i}"} for i in range(20_000)]

    store = ResponseStore(10, 60, max_bytes=64 << 20)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(4):
            store.put(f"r{k}", Stored({"id": f"r{k}", "output": []}, history(k)))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = store.held
    assert counted > 4 * 20_000 * 30
    assert held < counted * 1.1 + (64 << 10), (held, counted)
    got = store.get("r3")
    assert got is not None and got.history == history(3) and got.response == {"id": "r3", "output": []}
    assert got.size == store.size("r3")
    # What get gives is the caller's own: changing it changes nothing stored.
    got.history.clear()
    again = store.get("r3")
    assert again is not None and again.history == history(3)


def test_reasoning_items_join_in_linear_time() -> None:
    """Each reasoning item's text was added to the text so far, copying it
    all again: 100,000 items took 18 s. The CPU time of 4 times the items
    is about 4 times as much (quadratic: 16 times and more)."""
    import time

    from xtml.serving.responses import translate

    def cost(n: int) -> float:
        item = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "t" * 100}]}
        body = {"input": [item] * n + [{"role": "user", "content": "Hi"}]}
        best = float("inf")
        for _ in range(3):
            start = time.thread_time()
            chat, _ = translate(body, ResponseStore())
            best = min(best, time.thread_time() - start)
        assert len(chat["messages"][0]["reasoning_content"]) == 100 * n
        return best

    cost(1000)  # warm
    small, large = cost(10_000), cost(40_000)
    assert large < 8 * small, (small, large)
