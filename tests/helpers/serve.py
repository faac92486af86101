"""What the gateway's tests share: the request they send, the ids a model
answers with, and the answer as xtml's batch parse, the SDK's whole answer
and a stream's joined deltas make it, side by side."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai

import xtml
from tests.helpers.engines import StandIn, running
from tests.helpers.tokenizers import k3_vocab as vocab
from xtml import testing as xt
from xtml.serving.gateway import create_app
from xtml.serving.openai import shape_message

KINDS = ("vllm", "sglang", "llamacpp")
K3 = xtml.load("kimi-k3")
THINKING = K3.dialect.thinking_default

SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["q"]}}}
CALC = {"type": "function", "function": {
    "name": "calc", "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}
REQUEST: dict[str, Any] = {"messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Find the XTML spec, then add 2 and 2."}],
                           "tools": [SEARCH, CALC]}


def answer_of(message: dict[str, Any]) -> list[int]:
    """The ids a model generates for ``message`` after the generation prompt."""
    case = xt.completion_case(K3, {**REQUEST, "messages": [*REQUEST["messages"], message]}, vocab())
    assert case is not None
    return case[0]


def expected(ids: list[int], v: xtml.Vocabulary | None = None) -> dict[str, Any]:
    """What xtml's batch parse makes of ids, in OpenAI's shape (call ids
    left out: they are random)."""
    shaped = shape_message(K3.parse(ids, v or vocab(), completion=True, lenient=True, thinking=THINKING))
    m = shaped.message
    return {"content": m["content"] or "", "reasoning_content": m.get("reasoning_content", ""),
            "calls": [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls", ())],
            "finish_reason": shaped.finish_reason, "diagnostics": sorted(d["kind"] for d in shaped.diagnostics)}


def got_whole(r: Any) -> dict[str, Any]:
    choice = r.choices[0]
    m = choice.message
    calls = m.tool_calls or []
    assert all(c.id.startswith("call_") for c in calls)
    assert len({c.id for c in calls}) == len(calls)
    return {"content": m.content or "", "reasoning_content": (m.model_extra or {}).get("reasoning_content", ""),
            "calls": [(c.function.name, c.function.arguments) for c in calls],
            "finish_reason": choice.finish_reason,
            "diagnostics": sorted(d["kind"] for d in (choice.model_extra or {})["xtml_diagnostics"])}


def got_stream(chunks: list[Any]) -> dict[str, Any]:
    """What a client assembles from the chunks of a stream."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str]] = {}
    ids: dict[int, str] = {}
    finish: list[str] = []
    diags: list[str] = []
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    for c in chunks:
        if not c.choices:
            continue
        ch = c.choices[0]
        assert not finish, "a chunk after the one with finish_reason"
        d = ch.delta
        content.append(d.content or "")
        reasoning.append((d.model_extra or {}).get("reasoning_content") or "")
        for tc in d.tool_calls or ():
            if tc.id is not None:
                assert tc.index not in calls
                ids[tc.index] = tc.id
                calls[tc.index] = [tc.function.name, ""]
            calls[tc.index][1] += tc.function.arguments or ""
        if ch.finish_reason is not None:
            finish.append(ch.finish_reason)
            diags = sorted(x["kind"] for x in (ch.model_extra or {})["xtml_diagnostics"])
    assert len(finish) == 1
    assert all(i.startswith("call_") for i in ids.values())
    return {"content": "".join(content), "reasoning_content": "".join(reasoning),
            "calls": [tuple(calls[k]) for k in sorted(calls)], "finish_reason": finish[0], "diagnostics": diags}


class Rig:
    """A stand-in engine and a gateway in front of it."""

    def __init__(self, kind: str, **options: Any) -> None:
        self.kind = kind
        b = K3.bind(vocab())
        self.engine = StandIn(kind, eog=b.stop_ids, vocab_size=vocab().size, token_bytes=b.text_table())
        self._backend = running(self.engine)
        self.backend = self._backend.__enter__()
        self._gateway = running(create_app(K3, vocab(), options.pop("url", self.backend.url), kind=kind,
                                           **options))
        self.gateway = self._gateway.__enter__()
        self.url = self.gateway.url
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=30)

    def close(self) -> None:
        self.client.close()
        self._gateway.__exit__(None, None, None)
        self._backend.__exit__(None, None, None)

    def prompt(self, k: int = -1) -> list[int]:
        body = self.engine.requests[k]
        return list(body["input_ids"] if self.kind == "sglang" else body["prompt"])

    def post(self, body: Any, timeout: float = 30) -> httpx.Response:
        # json.dumps, not httpx's encoder: a client may send NaN, which
        # Python's JSON writes and reads.
        return httpx.post(self.url + "/v1/chat/completions", content=json.dumps(body).encode(),
                          headers={"content-type": "application/json"}, timeout=timeout)


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``cond`` comes true within ``timeout`` seconds (what an
    engine records arrives after the answer the client got)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# What the stand-in engines answer: reasoning and text; calls; marker
# literals inside reasoning, text and argument values (text, never markup);
# a json block.
MESSAGES: dict[str, dict[str, Any]] = {
    "text": {"role": "assistant", "reasoning_content": "Easy.", "content": "Four, and the spec is at xtml.dev."},
    "calls": {"role": "assistant", "reasoning_content": "Look it up.", "content": "",
              "tool_calls": [
                  {"type": "function", "function": {"name": "search",
                                                    "arguments": json.dumps({"q": "xtml \"spec\"", "limit": 5})}},
                  {"type": "function", "function": {"name": "calc", "arguments": json.dumps({"expr": "2+2"})}}]},
    "literals": {"role": "assistant", "reasoning_content": "Think <|close|>think<|sep|> é",
                 "content": "Use <|open|>tools<|sep|> \"quoted\"\n",
                 "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": json.dumps(
                     {"q": "a<|close|>argument<|sep|>\"\\\n<|end_of_msg|>", "limit": -3})}}]},
    "json-block": {"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function", "function": {"name": "calc",
                                                                    "arguments": "not JSON <|end_of_msg|>"}}]},
}
ANSWERS = {k: answer_of(m) for k, m in MESSAGES.items()}
