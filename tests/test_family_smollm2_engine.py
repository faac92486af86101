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


def test_what_needs_the_completion_grammar_is_refused_by_name(client: openai.OpenAI) -> None:
    tool = {"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {}}}}
    for extra in ({"tools": [tool], "tool_choice": "required"},
                  {"response_format": {"type": "json_object"}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="smollm2", messages=REQUESTS[0]["messages"], max_tokens=4,
                                           **extra)
        assert "not yet available for the layout dialect 'smollm2'" in str(e.value)


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
