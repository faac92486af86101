"""SmolLM2-135M-Instruct end to end: a real llama-server (as tests/run
builds it) running the model's GGUF, and the gateway with the ``smollm2``
layout dialect in front of it.

llama-server runs with ``--jinja``, so its ``POST /apply-template`` applies
the GGUF's own chat template: xtml's prompt text must equal it. Its
``POST /completion`` (``prompt`` as ids, ``temperature``, ``n_predict``,
``return_tokens``) is called directly to get the ids the model generates for
xtml's prompt, which must parse strictly; the gateway's answer to the same
request, greedy, is their parse."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

import xtml
from tests.helpers.engines import running
from tests.helpers.families import smollm2_gguf
from tests.helpers.llamacpp import real_model_server
from xtml.serving.gateway import create_app

pytestmark = pytest.mark.engines

N_PREDICT = 64
REQUESTS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"messages": [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Hi!"},
                  {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "naïve café 🙂\nok?"}]},
    {"messages": [{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from real_model_server(tmp_path_factory, smollm2_gguf(), "smollm2-e2e")


@pytest.fixture(scope="module")
def tpl() -> xtml.Template:
    return xtml.load("smollm2")


@pytest.fixture(scope="module")
def vocab() -> xtml.Vocabulary:
    return xtml.load_tokenizer(smollm2_gguf())


@pytest.fixture(scope="module")
def client(server: str, tpl: xtml.Template, vocab: xtml.Vocabulary) -> Iterator[openai.OpenAI]:
    with running(create_app(tpl, vocab, server, kind="llamacpp", timeout=120)) as gw:
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0, timeout=180)
        yield c
        c.close()


def test_the_prompt_is_llama_servers_own(server: str, tpl: xtml.Template) -> None:
    for req in REQUESTS:
        theirs = httpx.post(server + "/apply-template", json={"messages": req["messages"]}, timeout=30)
        assert theirs.status_code == 200, theirs.text
        assert tpl.render(req).text == theirs.json()["prompt"]


def _direct(server: str, tpl: xtml.Template, vocab: xtml.Vocabulary, req: dict[str, Any]) -> tuple[
        list[int], dict[str, Any]]:
    return _greedy(server, tpl.encode(req, vocab))


def _greedy(server: str, prompt: list[int]) -> tuple[list[int], dict[str, Any]]:
    """The engine's greedy answer to ``prompt``, with the prompt in its cache
    as the gateway's request then finds it (the gateway asks it to keep
    prompts): a prompt evaluated whole and one read from the cache can
    differ in the last bits, enough to turn a near tie of a greedy choice."""
    out: dict[str, Any] = {}
    for n in (1, N_PREDICT):
        r = httpx.post(server + "/completion", json={"prompt": prompt, "n_predict": n, "temperature": 0,
                                                     "return_tokens": True, "cache_prompt": True}, timeout=180)
        assert r.status_code == 200, r.text
        out = r.json()
    return list(out["tokens"]), out


@pytest.mark.parametrize("k", [0, 1])
def test_a_chat_answer_whole_and_streamed(server: str, tpl: xtml.Template, vocab: xtml.Vocabulary,
                                          client: openai.OpenAI, k: int) -> None:
    req = REQUESTS[k]
    ids, out = _direct(server, tpl, vocab, req)
    stop = vocab.special_id("<|im_end|>")
    assert stop is not None
    ended = out.get("stop_type") == "eos"
    if ended:
        # The answer ends with the end-of-generation token: a strict parse.
        assert ids[-1] == stop
        strict = tpl.parse(ids, vocab, completion=True)
    else:
        strict = tpl.parse(ids, vocab, completion=True, lenient=True)
        assert [d["kind"] for d in strict.pop("diagnostics")] == ["truncated"]
    assert isinstance(strict["content"], str) and strict["content"]
    answer = client.chat.completions.create(model="smollm2", messages=req["messages"], temperature=0,
                                            max_tokens=N_PREDICT)
    choice = answer.choices[0]
    assert choice.message.content == strict["content"]
    assert choice.finish_reason == ("stop" if ended else "length")
    assert answer.usage is not None and answer.usage.prompt_tokens == len(tpl.encode(req, vocab))
    chunks = list(client.chat.completions.create(model="smollm2", messages=req["messages"], temperature=0,
                                                 max_tokens=N_PREDICT, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == strict["content"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] \
        == [choice.finish_reason]


def test_a_request_with_tools_is_served_as_the_template_serves_it(client: openai.OpenAI) -> None:
    # The template has no tool syntax: the tools and calls are not in the
    # prompt (as llama-server's own --jinja prompt leaves them out), and the
    # answer is text.
    req = REQUESTS[2]
    tool = {"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {}}}}
    answer = client.chat.completions.create(model="smollm2", messages=req["messages"], tools=[tool],  # type: ignore[list-item]
                                            temperature=0, max_tokens=8)
    assert answer.choices[0].message.tool_calls is None


def test_the_completion_grammar_holds_what_the_format_can_hold(client: openai.OpenAI) -> None:
    # The format has no tool syntax: a required call is refused by name; a
    # JSON answer is held by the grammar the engine is sent.
    tool: Any = {"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=REQUESTS[0]["messages"], max_tokens=4,
                                       tools=[tool], tool_choice="required")
    assert "the smollm2 format has no tool calls" in str(e.value)
    answer = client.chat.completions.create(model="smollm2", messages=REQUESTS[0]["messages"], max_tokens=24,
                                            temperature=0, response_format={"type": "json_object"})
    content = answer.choices[0].message.content or ""
    assert content.lstrip().startswith("{")
    if answer.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_the_responses_api_over_the_layout_dialect(server: str, tpl: xtml.Template, vocab: xtml.Vocabulary,
                                                   client: openai.OpenAI) -> None:
    req = REQUESTS[1]
    ids, _ = _direct(server, tpl, vocab, req)
    want = tpl.parse(ids, vocab, completion=True, lenient=True)["content"]
    r = client.responses.create(model="smollm2", input=req["messages"], temperature=0,
                                max_output_tokens=N_PREDICT)
    assert r.output_text == want


def test_qwen3_over_the_same_model_and_vocabulary(server: str, vocab: xtml.Vocabulary) -> None:
    """The qwen3 dialect in front of the same model: its prompt (tools in the
    system turn; Qwen3's added tokens, which this vocabulary lacks, spelled
    as text) goes to the engine as ids, and what comes back is read as
    Qwen3 reads an answer."""
    qwen3 = xtml.load("qwen3")
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}, "required": ["city"]}}}
    req: dict[str, Any] = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [tool],
                           "enable_thinking": False}
    prompt = qwen3.encode(req, vocab)
    want = qwen3.parse(_greedy(server, prompt)[0], vocab, completion=True, lenient=True)
    with running(create_app(qwen3, vocab, server, kind="llamacpp", timeout=120)) as gw:
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0, timeout=180)
        answer = c.chat.completions.create(model="qwen3", messages=req["messages"], tools=[tool],  # type: ignore[list-item]
                                           temperature=0, max_tokens=N_PREDICT,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        c.close()
    message = answer.choices[0].message
    assert answer.usage is not None and answer.usage.prompt_tokens == len(prompt)
    assert (message.content or "") == want["content"]
    calls = [(t.function.name, t.function.arguments) for t in message.tool_calls or ()]  # type: ignore[union-attr]
    assert calls == [(t["function"]["name"], t["function"]["arguments"]) for t in want.get("tool_calls", ())]
    assert answer.usage is not None and answer.usage.prompt_tokens == len(prompt)


WEATHER: dict[str, Any] = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"], "additionalProperties": False}}}
CALLS: list[dict[str, Any]] = []
"""The calls the model made, for the test's report."""


@pytest.fixture(scope="module")
def qwen3_client(server: str, vocab: xtml.Vocabulary) -> Iterator[openai.OpenAI]:
    with running(create_app(xtml.load("qwen3"), vocab, server, kind="llamacpp", timeout=120)) as gw:
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0, timeout=180)
        yield c
        c.close()


def test_a_required_call_under_the_grammar_then_an_answer(qwen3_client: openai.OpenAI) -> None:
    """(b): the qwen3 format over SmolLM2's model and vocabulary, where
    ``<tool_call>`` is text: ``tool_choice: "required"`` makes the real model
    write a call under the grammar the gateway sends (GBNF, llama.cpp's own
    sampler), returned as ``tool_calls`` whose arguments fit the schema; the
    tool's result goes back, and the model answers."""
    import jsonschema  # type: ignore[import-untyped]

    # A tiny model: the system message and a plain tool result are what
    # get it to answer in one sentence and stop.
    messages: Any = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."},
                     {"role": "user", "content": "What is the weather in Paris?"}]
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    tools: Any = [WEATHER]
    r = qwen3_client.chat.completions.create(model="qwen3", messages=messages, tools=tools,
                                             tool_choice="required", parallel_tool_calls=False, temperature=0,
                                             max_tokens=64, extra_body=off)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function"
    fn = calls[0].function
    assert fn.name == "get_weather"
    args = json.loads(fn.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    CALLS.append({"name": fn.name, "arguments": args})
    messages += [{"role": "assistant", "content": choice.message.content or "",
                  "tool_calls": [{"id": calls[0].id, "type": "function",
                                  "function": {"name": fn.name, "arguments": fn.arguments}}]},
                 {"role": "tool", "tool_call_id": calls[0].id,
                  "content": "Sunny, 21 degrees Celsius."}]
    answer = qwen3_client.chat.completions.create(model="qwen3", messages=messages, tools=tools,
                                                  tool_choice="none", temperature=0, max_tokens=96, extra_body=off)
    a = answer.choices[0]
    assert a.finish_reason == "stop", (CALLS, messages, a)
    assert a.message.tool_calls is None and (a.message.content or "").strip()
    print(f"\ncall: {CALLS[-1]}\nanswer: {a.message.content!r}")


GRAMMAR_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3 required": ("qwen3", {"tools": [WEATHER], "tool_choice": "required"}),
    "qwen3 named, thinking on": ("qwen3", {"tools": [WEATHER], "enable_thinking": True,
                                           "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    "qwen3 none": ("qwen3", {"tools": [WEATHER], "tool_choice": "none"}),
    "qwen3 json_schema": ("qwen3", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}}),
    "smollm2 json_object": ("smollm2", {"response_format": {"type": "json_object"}}),
}


@pytest.mark.parametrize("case", list(GRAMMAR_CASES))
def test_llama_server_runs_the_gbnf_grammar_and_its_ids_parse(server: str, vocab: xtml.Vocabulary,
                                                              case: str) -> None:
    """llama.cpp's own grammar parser and sampler take the GBNF grammar of
    both layout dialects (Qwen3's added tokens as text over this
    vocabulary), and the ids the model generates under it parse strictly
    (or, cut by the token limit, with only that repair) and hold the
    request."""
    name, extra = GRAMMAR_CASES[case]
    tpl = xtml.load(name)
    req = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "enable_thinking": False,
           **extra} if name == "qwen3" else {"messages": REQUESTS[0]["messages"], **extra}
    grammar = tpl.completion_grammar(req, vocab, format="gbnf")
    r = httpx.post(server + "/completion", json={"prompt": tpl.encode(req, vocab), "grammar": grammar,
                                                 "n_predict": 40, "temperature": 0, "return_tokens": True},
                   timeout=180)
    assert r.status_code == 200, r.text
    out = r.json()
    ids = list(out["tokens"])
    if out.get("stop_type") == "eos":
        message = tpl.parse(ids, vocab, completion=True)
    else:
        message = tpl.parse(ids, vocab, completion=True, lenient=True)
        assert {d["kind"] for d in message.pop("diagnostics")} == {"truncated"}
    calls = message.get("tool_calls", [])
    if "required" in case or "named" in case:
        assert out["content"].startswith("<think>") or out["content"].startswith("<tool_call>"), out["content"]
        assert message["content"] == ""
        if out.get("stop_type") == "eos":
            assert [c["function"]["name"] for c in calls] == ["get_weather"] * len(calls) and calls
    elif "none" in case:
        assert calls == [] and "<tool_call>" not in out["content"]
    else:
        assert message["content"].lstrip().startswith("{")
        if out.get("stop_type") == "eos":
            assert isinstance(json.loads(message["content"]), dict)
