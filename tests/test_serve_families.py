"""Gemma 4 and gpt-oss (harmony) through the gateway, with a stand-in vLLM
engine and the openai SDK: the request's tools reach the prompt (Gemma's
declarations in its system turn, harmony's namespace in the developer
message); an answer's reasoning comes back as the reasoning field and its
call with the gateway's own id (neither format writes one), whole and
streamed, Gemma's arguments typed by the request's tools; an answer of
content alone ends with ``stop``; and the history sent back writes the call
as the model wrote it and the result where the format puts it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

import xtml
from tests.helpers.engines import StandIn, running
from tests.helpers.vllm_families import GEMMA, GPTOSS
from xtml.serving.gateway import create_app
from xtml.template import LayoutTemplate

ROOT = Path(__file__).parent.parent
BASE_TOKENIZER = str(ROOT / "examples" / "tokenizer.json")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
REASONING = "Paris only."
ARGUMENTS = '{"city": "Paris", "days": 3}'
GEMMA_CALL = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>'
HARMONY_CALL = f"<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{ARGUMENTS}<|call|>"


@dataclass(frozen=True)
class Family:
    name: str
    options: dict[str, Any]
    """The template's keyword options the request sends (Gemma's reasoning
    is the model's only with thinking on; harmony's date is the clock's
    unless given)."""
    calls: str
    """An answer with reasoning and a call."""
    text: str
    """An answer of content alone."""
    declared: str
    """What the prompt holds of the tools."""
    history: str
    """How the history's answer and its result are written."""


FAMILIES = {
    GEMMA: Family(
        GEMMA, {"enable_thinking": True},
        f"<|channel>thought\n{REASONING}\n<channel|>{GEMMA_CALL}<|tool_response>",
        "Sunny in Paris.<turn|>",
        '<|turn>system\n<|think|>\n<|tool>declaration:get_weather{description:<|"|>Weather of a city.<|"|>,'
        'parameters:{properties:{city:{type:<|"|>STRING<|"|>},days:{type:<|"|>INTEGER<|"|>}},'
        'required:[<|"|>city<|"|>],type:<|"|>OBJECT<|"|>}}<tool|><turn|>\n',
        # The result folded into the calling turn, under the call's name.
        f"<|turn>model\n<|channel>thought\n{REASONING}\n<channel|>{GEMMA_CALL}"
        '<|tool_response>response:get_weather{value:<|"|>sunny<|"|>}<tool_response|>'),
    GPTOSS: Family(
        GPTOSS, {"date": "2025-06-01"},
        f"<|channel|>analysis<|message|>{REASONING}<|end|>{HARMONY_CALL}",
        "<|channel|>final<|message|>Sunny in Paris.<|return|>",
        "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// Weather of a city.\n"
        "type get_weather = (_: {\ncity: string,\ndays?: number,\n}) => any;\n\n} // namespace functions<|end|>",
        # The result from functions.NAME, its content as JSON.
        f"<|start|>assistant<|channel|>analysis<|message|>{REASONING}<|end|>{HARMONY_CALL}"
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>'),
}


class Gateway:
    def __init__(self, f: Family, answer: str) -> None:
        t = xtml.load(f.name)
        assert isinstance(t, LayoutTemplate)
        self.f, self.t = f, t
        self.vocab = xtml.load_tokenizer(BASE_TOKENIZER, add_special_tokens=t.layout.tokens)
        self.engine = StandIn("vllm", vocab_size=self.vocab.size)
        self.answer = t.completion_ids(answer, self.vocab)
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

    def prompt(self) -> str:
        return self.vocab.decode(self.engine.requests[-1]["prompt"])

    def ask(self, messages: list[Any], tools: list[Any] | None = None, **kw: Any) -> Any:
        return self.client.chat.completions.create(
            model=self.f.name, messages=messages, tools=TOOLS if tools is None else tools,  # type: ignore[arg-type]
            max_tokens=200, extra_body={"chat_template_kwargs": self.f.options}, **kw)

    def streamed(self) -> tuple[str, str, list[tuple[str | None, str, str]], str | None]:
        """Reasoning, content, calls (id, name, arguments joined) and finish
        reason of the streamed answer."""
        reasoning, content, finish = "", "", None
        calls: dict[int, list[Any]] = {}
        for c in self.ask(ASK, stream=True):
            if not c.choices:
                continue
            choice = c.choices[0]
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, [None, "", ""])
                entry[0] = tc.id or entry[0]
                if tc.function is not None:
                    entry[1] += tc.function.name or ""
                    entry[2] += tc.function.arguments or ""
        return reasoning, content, [(calls[k][0], calls[k][1], calls[k][2]) for k in sorted(calls)], finish


@pytest.fixture(scope="module")
def gateways() -> Iterator[dict[tuple[str, str], Gateway]]:
    made: dict[tuple[str, str], Gateway] = {}
    try:
        for f in FAMILIES.values():
            made[f.name, "calls"] = Gateway(f, f.calls)
            made[f.name, "text"] = Gateway(f, f.text)
        yield made
    finally:
        for g in made.values():
            g.close()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_tools_reach_the_prompt_and_content_ends_with_stop(
        gateways: dict[tuple[str, str], Gateway], name: str) -> None:
    g = gateways[name, "text"]
    choice = g.ask(ASK).choices[0]
    assert choice.message.content == "Sunny in Paris."
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert g.f.declared in g.prompt(), g.prompt()
    assert g.streamed() == ("", "Sunny in Paris.", [], "stop")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_reasoning_and_a_call_come_back_with_the_gateways_id(
        gateways: dict[tuple[str, str], Gateway], name: str) -> None:
    g = gateways[name, "calls"]
    assert "id" not in g.t.parse(g.answer, g.vocab, completion=True, tools=TOOLS)["tool_calls"][0]
    choice = g.ask(ASK).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.content or "") == ""
    assert (choice.message.model_extra or {}).get("reasoning_content") == REASONING
    calls = choice.message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", ARGUMENTS)]
    own = calls[0].id
    assert own.startswith("call_")
    reasoning, content, streamed, finish = g.streamed()
    assert (reasoning, content, finish) == (REASONING, "", "tool_calls")
    assert [(n, a) for _, n, a in streamed] == [("get_weather", ARGUMENTS)]
    assert (streamed[0][0] or "").startswith("call_") and streamed[0][0] != own


def test_gemma_arguments_are_typed_by_the_requests_tools() -> None:
    """Gemma writes a value bare where it likes: a city named 7 is a string
    by the request's tools, whole and streamed; with no tools it reads as a
    number."""
    f = FAMILIES[GEMMA]
    g = Gateway(f, f"<|channel>thought\n{REASONING}\n<channel|><|tool_call>call:get_weather{{city:7,days:3}}"
                   "<tool_call|><|tool_response>")
    try:
        want = '{"city": "7", "days": 3}'
        assert [c.function.arguments for c in g.ask(ASK).choices[0].message.tool_calls or []] == [want]
        assert [a for _, _, a in g.streamed()[2]] == [want]
        untyped = g.ask(ASK, tools=[]).choices[0].message.tool_calls or []
        assert [c.function.arguments for c in untyped] == ['{"city": 7, "days": 3}']
    finally:
        g.close()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_sending_the_history_back_writes_the_call_and_its_result(
        gateways: dict[tuple[str, str], Gateway], name: str) -> None:
    """The SDK's assistant message (arguments as JSON text, the reasoning
    field beside) and a result answering its id: the prompt holds the
    call as the model wrote it and the result where the format puts it."""
    g = gateways[name, "calls"]
    message = g.ask(ASK).choices[0].message
    sent = message.model_dump(exclude_none=True)
    assert isinstance(sent["tool_calls"][0]["function"]["arguments"], str)
    result = {"role": "tool", "tool_call_id": sent["tool_calls"][0]["id"], "content": "sunny"}
    g.ask([*ASK, sent, result])
    prompt = g.prompt()
    assert g.f.history in prompt, prompt
