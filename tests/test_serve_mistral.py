"""Mistral Small 3.1 through the gateway, with a stand-in vLLM engine and
the openai SDK: the request's tools reach the prompt in
``[AVAILABLE_TOOLS]``, the calls the model writes as one JSON array after
``[TOOL_CALLS]`` come back whole and streamed with the ids it wrote (nine
characters), a call written without an id gets the gateway's own, and the
history sent back writes the calls and results the model is trained on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import xtml
from tests.helpers.engines import StandIn, running
from tests.helpers.vllm_families import MISTRAL, tpl
from xtml.serving.gateway import create_app

ROOT = Path(__file__).parent.parent
BASE_TOKENIZER = str(ROOT / "examples" / "tokenizer.json")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
CALLS = ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1B2c3D4e"}, '
         '{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "Z9y8X7w6v"}]')
ANSWERS = {
    "calls": CALLS + "</s>",
    "text then calls": "Checking." + CALLS + "</s>",
    "no id": '[TOOL_CALLS][{"arguments": {"city": "Paris"}, "name": "get_weather"}]</s>',
    "text": "Sunny in Paris.</s>",
}
WRITTEN = ["a1B2c3D4e", "Z9y8X7w6v"]
ARGUMENTS = ['{"city": "Paris"}', '{"city": "Oslo"}']


class Gateway:
    def __init__(self, answer: str) -> None:
        self.t = tpl(MISTRAL)
        self.vocab = xtml.load_tokenizer(BASE_TOKENIZER, add_special_tokens=self.t.layout.tokens)
        self.engine = StandIn("vllm", vocab_size=self.vocab.size)
        self.answer = self.t.completion_ids(answer, self.vocab)
        self.engine.answer = self.answer
        self._backend = running(self.engine)
        backend = self._backend.__enter__()
        self._gateway = running(create_app(self.t, self.vocab, backend.url, kind="vllm"))
        url = self._gateway.__enter__().url
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)

    def close(self) -> None:
        self.client.close()
        self._gateway.__exit__(None, None, None)
        self._backend.__exit__(None, None, None)

    def prompt(self) -> str:
        return self.vocab.decode(self.engine.requests[-1]["prompt"])

    def ask(self, messages: list[Any], **kw: Any) -> Any:
        return self.client.chat.completions.create(model=MISTRAL, messages=messages, tools=TOOLS,  # type: ignore[arg-type]
                                                   max_tokens=200, **kw)

    def streamed(self) -> tuple[str, list[tuple[str | None, str, str]], str | None]:
        """Content, calls (id, name, arguments joined) and finish reason of
        the streamed answer."""
        content, finish = "", None
        calls: dict[int, list[Any]] = {}
        for c in self.ask(ASK, stream=True):
            if not c.choices:
                continue
            choice = c.choices[0]
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, [None, "", ""])
                entry[0] = tc.id or entry[0]
                if tc.function is not None:
                    entry[1] += tc.function.name or ""
                    entry[2] += tc.function.arguments or ""
        return content, [(calls[k][0], calls[k][1], calls[k][2]) for k in sorted(calls)], finish


@pytest.fixture(scope="module")
def gateways() -> Iterator[dict[str, Gateway]]:
    made = {what: Gateway(answer) for what, answer in ANSWERS.items()}
    try:
        yield made
    finally:
        for g in made.values():
            g.close()


def test_the_tools_reach_the_prompt(gateways: dict[str, Gateway]) -> None:
    g = gateways["text"]
    answer = g.ask(ASK)
    assert answer.choices[0].message.content == "Sunny in Paris."
    assert answer.choices[0].finish_reason == "stop" and not answer.choices[0].message.tool_calls
    prompt = g.prompt()
    assert prompt.startswith("<s>[SYSTEM_PROMPT]You are a helpful assistant that can call tools.")
    assert ('[AVAILABLE_TOOLS] [{"type": "function", "function": {"name": "get_weather", "description": '
            '"Weather of a city.", "parameters": ') in prompt
    assert prompt.endswith("[/AVAILABLE_TOOLS][INST]Weather in Paris and Oslo?[/INST]")


@pytest.mark.parametrize("what", ["calls", "text then calls"])
def test_calls_come_back_with_the_ids_the_model_wrote(gateways: dict[str, Gateway], what: str) -> None:
    g = gateways[what]
    content = "Checking." if what == "text then calls" else ""
    answer = g.ask(ASK)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.content or "") == content
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == \
        list(zip(WRITTEN, ["get_weather"] * 2, ARGUMENTS, strict=True))
    assert g.streamed() == (content, list(zip(WRITTEN, ["get_weather"] * 2, ARGUMENTS, strict=True)), "tool_calls")


def _history_prompt(g: Gateway) -> str:
    """The prompt of the SDK's assistant message sent back with results
    answering its ids."""
    message = g.ask(ASK).choices[0].message
    results = [{"role": "tool", "tool_call_id": c.id, "content": f"sunny {k}"}
               for k, c in enumerate(message.tool_calls or [])]
    g.ask([*ASK, message.model_dump(exclude_none=True), *results])
    return g.prompt()


def test_sending_the_history_back_writes_the_ids_and_results(gateways: dict[str, Gateway]) -> None:
    """Each call under the id the model wrote, each result under it, its
    content as the template writes a string (as it is, unquoted)."""
    prompt = _history_prompt(gateways["calls"])
    head = "[INST]Weather in Paris and Oslo?[/INST][TOOL_CALLS] [{"
    assert head in prompt, prompt
    section = prompt[prompt.index(head) + len(head) - 2:]
    assert [c["id"] for c in json.JSONDecoder().raw_decode(section)[0]] == WRITTEN
    assert prompt.endswith("".join(f'[TOOL_RESULTS] {{"content": sunny {k}, "call_id": "{i}"}}[/TOOL_RESULTS]'
                                   for k, i in enumerate(WRITTEN))), prompt


def test_sending_the_history_back_writes_the_calls_as_the_model_wrote_them(gateways: dict[str, Gateway]) -> None:
    """The SDK sends arguments back as JSON text; the gateway reads it as
    the object it holds (as engines do before the template), so the
    template writes the object the model wrote, not a JSON string of it."""
    prompt = _history_prompt(gateways["calls"])
    assert "[INST]Weather in Paris and Oslo?[/INST]" + CALLS + "</s>[TOOL_RESULTS]" in prompt, prompt


def test_a_call_without_an_id_gets_the_gateways_own(gateways: dict[str, Gateway]) -> None:
    """The model may leave the id out (and write the keys in any order):
    the gateway's id comes back, a new one streamed, and the history sent
    back with it renders, its last nine characters the call's and the
    result's id."""
    g = gateways["no id"]
    assert "id" not in g.t.parse(g.answer, g.vocab, completion=True)["tool_calls"][0]
    message = g.ask(ASK).choices[0].message
    calls = message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    own = calls[0].id
    assert own.startswith("call_") and len(own) >= 9
    streamed = g.streamed()[1]
    assert len(streamed) == 1 and (streamed[0][0] or "").startswith("call_") and streamed[0][0] != own
    g.ask([*ASK, message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": own, "content": "sunny"}])
    assert g.prompt().endswith(f'"id": "{own[-9:]}"}}]</s>[TOOL_RESULTS] {{"content": sunny, "call_id": '
                               f'"{own[-9:]}"}}[/TOOL_RESULTS]')


def test_arguments_text_is_read_as_one_whole_object_only_where_the_format_writes_objects() -> None:
    """Text that is no JSON object, or an object with a key given twice (a
    dict would lose one), stays text; a format that writes arguments as
    given keeps the text the client sent."""
    from xtml.serving.checks import arguments_as_objects

    def body(*args: Any) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{k:09d}", "type": "function", "function": {"name": "f", "arguments": a}}
            for k, a in enumerate(args)]}]}

    given = body('{"a": [1, {"b": 2}]}', '{"a": 1, "a": 2}', "[1]", "not json", '"{}"', {"k": 1})
    read = arguments_as_objects(tpl(MISTRAL), given)
    assert [c["function"]["arguments"] for c in read["messages"][1]["tool_calls"]] == [
        {"a": [1, {"b": 2}]}, '{"a": 1, "a": 2}', "[1]", "not json", '"{}"', {"k": 1}]
    assert given["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"a": [1, {"b": 2}]}'
    assert arguments_as_objects(xtml.load("qwen3"), given) is given
