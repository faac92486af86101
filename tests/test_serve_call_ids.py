"""Call ids through the gateway, for a format that writes them: Kimi K2
Thinking writes a call as its id alone (``functions.NAME:IDX``) and reads
the name back out of it, so the id the model wrote is the one the client
gets, whole and streamed, and sending that history back writes the same
call. A format that writes no id (qwen3) gets the gateway's own. With a
stand-in vLLM engine and the openai SDK."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import xtml
from tests.helpers.engines import StandIn, running
from xtml.serving.gateway import create_app
from xtml.template import LayoutTemplate

ROOT = Path(__file__).parent.parent
BASE_TOKENIZER = str(ROOT / "examples" / "tokenizer.json")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
ASK = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
KIMI_CALLS = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
              '{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1'
              '<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>')
ANSWERS = {
    "kimi-k2-thinking": "<think>Two cities.</think>Checking." + KIMI_CALLS + "<|im_end|>",
    "kimi-k2": "Checking." + KIMI_CALLS + "<|im_end|>",
    "qwen3": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
    "glm-4.6": "\n<think>One city.</think>\nChecking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
               "<arg_value>7</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call><|observation|>",
}


class Gateway:
    def __init__(self, name: str) -> None:
        t = xtml.load(name)
        assert isinstance(t, LayoutTemplate)
        self.t = t
        self.vocab = xtml.load_tokenizer(BASE_TOKENIZER, add_special_tokens=t.layout.tokens)
        self.engine = StandIn("vllm", vocab_size=self.vocab.size)
        self.answer = t.completion_ids(ANSWERS[name], self.vocab)
        self.engine.answer = self.answer
        self._backend = running(self.engine)
        backend = self._backend.__enter__()
        self._gateway = running(create_app(t, self.vocab, backend.url, kind="vllm"))
        url = self._gateway.__enter__().url
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)

    def close(self) -> None:
        self.client.close()
        self._gateway.__exit__(None, None, None)
        self._backend.__exit__(None, None, None)

    def prompt(self) -> list[int]:
        return list(self.engine.requests[-1]["prompt"])


@pytest.fixture(scope="module")
def gateways() -> Iterator[dict[str, Gateway]]:
    made = {name: Gateway(name) for name in ANSWERS}
    try:
        yield made
    finally:
        for g in made.values():
            g.close()


def _streamed_ids(g: Gateway, name: str) -> list[str | None]:
    chunks: list[Any] = list(g.client.chat.completions.create(model=name, messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                                              max_tokens=200, stream=True))
    ids: dict[int, str | None] = {}
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if tc.id is not None:
                ids[tc.index] = tc.id
    return [ids[k] for k in sorted(ids)]


@pytest.mark.parametrize("name", ["kimi-k2-thinking", "kimi-k2"])
def test_a_call_comes_back_with_the_id_the_model_wrote(gateways: dict[str, Gateway], name: str) -> None:
    g = gateways[name]
    parsed = g.t.parse(g.answer, g.vocab, completion=True)
    written = [c["id"] for c in parsed["tool_calls"]]
    assert written == ["functions.get_weather:0", "functions.get_weather:1"]
    answer = g.client.chat.completions.create(model=name, messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                              max_tokens=200)
    message = answer.choices[0].message
    assert [c.id for c in message.tool_calls or []] == written
    assert answer.choices[0].finish_reason == "tool_calls"
    assert _streamed_ids(g, name) == written


def test_sending_the_history_back_writes_the_same_call(gateways: dict[str, Gateway]) -> None:
    """The SDK's assistant message and the tool results answering its ids,
    sent back: the prompt holds the call section as the model wrote it."""
    name = "kimi-k2-thinking"
    g = gateways[name]
    message = g.client.chat.completions.create(model=name, messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                               max_tokens=200).choices[0].message
    assistant = message.model_dump(exclude_none=True)
    results = [{"role": "tool", "tool_call_id": c.id, "content": "sunny"} for c in message.tool_calls or []]
    history = [*ASK, assistant, *results]
    g.client.chat.completions.create(model=name, messages=history, tools=TOOLS,  # type: ignore[arg-type]
                                     max_tokens=200)
    section = g.t.completion_ids(KIMI_CALLS, g.vocab)
    prompt = g.prompt()
    assert any(prompt[k:k + len(section)] == section for k in range(len(prompt))), g.vocab.decode(prompt)
    # The history, as the library reads it, holds the same calls.
    normal = g.t.normalize({"messages": history})["messages"]
    said = next(m for m in normal if m["role"] == "assistant")
    assert [c["id"] for c in said["tool_calls"]] == ["functions.get_weather:0", "functions.get_weather:1"]


def test_a_format_that_writes_no_id_gets_the_gateways_own(gateways: dict[str, Gateway]) -> None:
    g = gateways["qwen3"]
    assert "id" not in g.t.parse(g.answer, g.vocab, completion=True)["tool_calls"][0]
    answer = g.client.chat.completions.create(model="qwen3", messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                              max_tokens=200)
    ids = [c.id for c in answer.choices[0].message.tool_calls or []]
    assert len(ids) == 1 and ids[0].startswith("call_")
    streamed = _streamed_ids(g, "qwen3")
    assert len(streamed) == 1 and (streamed[0] or "").startswith("call_") and streamed != ids


def test_arguments_written_untyped_are_typed_by_the_requests_tools(gateways: dict[str, Gateway]) -> None:
    """GLM-4.6 writes each argument's value bare: the gateway reads them
    back by the schemas of the request's tools, whole and streamed (a city
    named "7" stays a string, the days a number); without the tools a
    value that reads as a number is one."""
    g = gateways["glm-4.6"]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
    want = '{"city": "7", "days": 3}'
    answer = g.client.chat.completions.create(model="glm-4.6", messages=ASK, tools=tools,  # type: ignore[arg-type]
                                              max_tokens=200)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    assert [c.function.arguments for c in choice.message.tool_calls or []] == [want]
    assert (choice.message.model_extra or {}).get("reasoning_content") == "One city."
    chunks: list[Any] = list(g.client.chat.completions.create(model="glm-4.6", messages=ASK, tools=tools,  # type: ignore[arg-type]
                                                              max_tokens=200, stream=True))
    streamed = "".join(tc.function.arguments or "" for c in chunks if c.choices
                       for tc in c.choices[0].delta.tool_calls or [] if tc.function is not None)
    assert streamed == want
    assert g.t.parse(g.answer, g.vocab, completion=True)["tool_calls"][0]["function"]["arguments"] == \
        '{"city": 7, "days": 3}'
