"""xtml's parsers in vLLM's own chat-completions server code, end to end on
CPU: tests/helpers/vllm_serving_driver.py builds vLLM's ``OpenAIServingChat``
(``--tool-call-parser xtml --reasoning-parser xtml
--enable-auto-tool-choice``) over a model folder with no weights (the
tokenizer folder ``xtml export hf`` writes, and a ``config.json``), in the
venv tests/run makes (``XTML_VLLM_PYTHON``), with an engine whose model is a
script of K3 answer ids. The OpenAI objects ``create_chat_completion``
returns, whole and streamed, are read with the openai SDK and must be what
``Template.parse`` makes of the ids the engine generated, and what
``xtml serve`` returns for the same ids."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.helpers.need import need
from tests.helpers.serve import K3, REQUEST, Rig, answer_of, expected, got_stream, got_whole, vocab
from tests.helpers.vllm import as_json, dist_folder
from xtml.exports.hf import export_hf

pytestmark = pytest.mark.engines

ROOT = Path(__file__).parent.parent
DRIVER = Path(__file__).parent / "helpers" / "vllm_serving_driver.py"

SEARCH = "search"
MESSAGES: dict[str, dict[str, Any]] = {
    "plain": {"role": "assistant", "content": "Four, and the spec is at xtml.dev."},
    "call": {"role": "assistant", "reasoning_content": "Look it up.", "content": "Searching.",
             "tool_calls": [{"type": "function", "function": {
                 "name": SEARCH, "arguments": json.dumps({"q": "xtml \"spec\"", "limit": 5})}}]},
    # Marker text inside an argument value: text in the ids, markup if read
    # from decoded text.
    "hostile": {"role": "assistant", "content": "ok", "tool_calls": [{"type": "function", "function": {
        "name": SEARCH, "arguments": json.dumps({"q": "os<|close|>argument<|sep|>sify", "limit": 1})}}]},
    "cut": {"role": "assistant", "content": "On it.", "tool_calls": [
        {"type": "function", "function": {"name": SEARCH, "arguments": json.dumps({"q": "xyz", "limit": 2})}},
        {"type": "function", "function": {"name": "calc", "arguments": json.dumps({"expr": "a long one, cut here"})}}]},
}
# The cut answer stops at max_tokens inside its second call.
LIMITS = {"cut": len(answer_of(MESSAGES["cut"])) - 12}


def request(name: str) -> dict[str, Any]:
    body: dict[str, Any] = {**REQUEST, "model": "kimi-k3"}
    if name in LIMITS:
        body["max_completion_tokens"] = LIMITS[name]
    return body


def answer(name: str) -> list[int]:
    # The model writes on past its end marker: the engine stops at the stop id.
    return [*answer_of(MESSAGES[name]), 100, 200]


def model_folder(where: Path) -> Path:
    """A model folder vLLM's ModelConfig loads without weights or network."""
    export_hf(K3, vocab(), where)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab().size,
              "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
              "num_key_value_heads": 4, "max_position_embeddings": 8192, "torch_dtype": "float32"}
    (where / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return where


@cache
def served() -> dict[str, Any]:
    python = need("vLLM python", "tests/run sets it up", env="XTML_VLLM_PYTHON")
    with tempfile.TemporaryDirectory(prefix="xtml-vllm-serving-") as tmp:
        job = {"model": str(model_folder(Path(tmp) / "model")), "dist": str(dist_folder(Path(tmp) / "dist")),
               "cases": [{"request": request(name), "answer": answer(name)} for name in MESSAGES]}
        env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_PLUGINS": "xtml", "XTML_TEMPLATE": "kimi-k3",
               "HF_HUB_OFFLINE": "1"}
        # -P: the script's folder (tests/helpers, with its tokenizers.py)
        # must not shadow the tokenizers package.
        run = subprocess.run([python, "-P", str(DRIVER)], input=json.dumps(job), capture_output=True, text=True,
                             timeout=600, env=env, cwd=tmp)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout)
    return dict(zip(MESSAGES, out["results"], strict=True)) | {"vllm": out["vllm"], "hands_ids": out["hands_ids"]}


@cache
def gateway() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """What xtml serve returns for the same ids (whole, streamed), in front
    of a stand-in vLLM engine."""
    rig = Rig("vllm")
    try:
        out = {}
        for name in MESSAGES:
            rig.engine.answer = answer(name)
            body = request(name)
            whole = got_whole(rig.client.chat.completions.create(**body))
            stream = got_stream(list(rig.client.chat.completions.create(stream=True, **body)))
            out[name] = whole, stream
        return out
    finally:
        rig.close()


def message(got: dict[str, Any]) -> dict[str, Any]:
    """The fields both servers return, arguments read as JSON."""
    return {"content": got["content"], "reasoning": got["reasoning_content"],
            "calls": [(name, as_json(args)) for name, args in got["calls"]], "finish_reason": got["finish_reason"]}


def vllm_whole(body: dict[str, Any]) -> dict[str, Any]:
    r = openai.types.chat.ChatCompletion.model_validate(body)
    (choice,) = r.choices
    m = choice.message
    calls = m.tool_calls or []
    assert all(c.id for c in calls) and len({c.id for c in calls}) == len(calls)
    return {"content": m.content or "", "reasoning_content": (m.model_extra or {}).get("reasoning") or "",
            "calls": [(c.function.name, c.function.arguments) for c in calls], "finish_reason": choice.finish_reason}


def vllm_stream(sse: list[str]) -> dict[str, Any]:
    """What a client assembles from the server-sent events: each call
    announced once with its id and name, its arguments joined."""
    assert sse[-1] == "data: [DONE]\n\n"
    assert all(s.startswith("data: {") and s.endswith("\n\n") and "\n" not in s[:-2] for s in sse[:-1])
    bodies = [json.loads(s[len("data: "):]) for s in sse[:-1]]
    assert not [b for b in bodies if "error" in b]
    chunks = [openai.types.chat.ChatCompletionChunk.model_validate(b) for b in bodies]
    assert chunks[0].choices[0].delta.role == "assistant"
    content, reasoning, finish = [], [], []
    calls: dict[int, list[str]] = {}
    for c in chunks:
        (ch,) = c.choices
        assert not finish, "a chunk after the one with finish_reason"
        d = ch.delta
        content.append(d.content or "")
        reasoning.append((d.model_extra or {}).get("reasoning") or "")
        for tc in d.tool_calls or ():
            if tc.id is not None:
                assert tc.index not in calls and tc.function is not None and tc.function.name
                calls[tc.index] = [tc.function.name, ""]
            calls[tc.index][1] += (tc.function.arguments if tc.function else None) or ""
        if ch.finish_reason is not None:
            finish.append(ch.finish_reason)
    assert len(finish) == 1
    return {"content": "".join(content), "reasoning_content": "".join(reasoning),
            "calls": [tuple(calls[k]) for k in sorted(calls)], "finish_reason": finish[0]}


def test_vllm_version() -> None:
    assert served()["vllm"].startswith("0.33.")


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_the_engine_gets_xtmls_prompt_and_stops_where_vllm_stops(name: str) -> None:
    """vLLM's renderer, with the exported chat template, hands the engine
    Template.encode's ids of the request as vLLM's request model gives it
    to the template (a tool without a description has a null one there);
    the engine stops at the end marker (the eos of the exported tokenizer),
    or at max_tokens."""
    got = served()[name]
    as_vllm_hands_it = copy.deepcopy(REQUEST)
    for tool in as_vllm_hands_it["tools"]:
        tool["function"].setdefault("description", None)
    assert got["prompt"] == K3.encode(as_vllm_hands_it, vocab())
    ids = answer_of(MESSAGES[name])
    assert got["steps"] == ids[:LIMITS.get(name, len(ids))]


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_streamed_answer_is_what_xtml_reads_in_the_ids(name: str) -> None:
    """One id a step through vLLM's output processor and its streaming
    server: the joined deltas are Template.parse's message of the generated
    ids, with its finish_reason; the call an answer was cut off in never
    starts."""
    got = served()[name]
    want = message(expected(got["steps"]))
    assert message(vllm_stream(got["sse"])) == want


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_whole_answer_is_what_xtml_reads_in_the_ids(name: str) -> None:
    """Whole, the plugin hands the generated ids vLLM's server passes to
    DelegatingParser.parse on to xtml's parsers (docs/vllm.md): the answer
    is the ids' message, with usage counted on the generated ids, and one
    warning where the parse withheld something (the call the cut answer was
    cut off in), none elsewhere."""
    got = served()[name]
    assert served()["hands_ids"] is True
    assert message(vllm_whole(got["whole"])) == message(expected(got["steps"]))
    assert got["whole_warnings"] == (1 if expected(got["steps"])["diagnostics"] else 0)
    assert (got["whole_warnings"] == 1) is (name == "cut")
    usage = got["whole"]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(got["prompt"]), len(got["steps"]))


def test_whole_answer_with_marker_text_keeps_it() -> None:
    """The argument value ``os<|close|>argument<|sep|>sify`` is text in the
    ids, and stays text whole as streamed: its decoded text, which reads as
    markup, is not what the parsers read."""
    got = served()["hostile"]
    want = message(expected(got["steps"]))
    assert want["calls"] == [(SEARCH, {"q": "os<|close|>argument<|sep|>sify", "limit": 1})]
    assert message(vllm_whole(got["whole"])) == want
    assert got["whole_warnings"] == 0


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_as_xtml_serve_returns_it(name: str) -> None:
    """The same ids through xtml serve: vLLM's server with xtml's parsers
    returns the same content, reasoning, calls and finish_reason, whole and
    streamed."""
    got = served()[name]
    whole, stream = gateway()[name]
    # xtml serve streams a call's start when its element opens, so the call
    # an answer was cut off in has started there; vLLM's parser sends each
    # call whole when it closes, so that one never starts.
    stream = {**stream, "calls": stream["calls"][:len(whole["calls"])]}
    assert message(vllm_stream(got["sse"])) == message(stream) == message(whole)
    assert message(vllm_whole(got["whole"])) == message(whole)
