"""The ``qwen3`` layout dialect against Qwen3's own chat template
(``Qwen-Qwen3-0.6B.jinja`` of llama.cpp's sdist, rendered by transformers):
byte-equal text wherever the official template renders, a located refusal
wherever it raises, and every field it leaves out reported."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

import xtml
from tests.helpers.families import (
    QWEN3_SHA256,
    chatml_requests,
    hf_render,
    llama_template,
    smollm2_gguf,
    spells_marker,
    whole_ids,
)
from xtml.errors import MessageError, RequestError
from xtml.vocab.vocabulary import byte_vocabulary

N_REQUESTS = 400


@pytest.fixture(scope="module")
def tpl() -> xtml.Template:
    return xtml.load("qwen3")


@pytest.fixture(scope="module")
def official() -> str:
    return llama_template("Qwen-Qwen3-0.6B.jinja", QWEN3_SHA256)


def _last_query(msgs: list[dict[str, Any]]) -> int:
    for k in range(len(msgs) - 1, -1, -1):
        c = str(msgs[k].get("content") or "")
        if msgs[k]["role"] == "user" and not (c.startswith("<tool_response>") and c.endswith("</tool_response>")):
            return k
    return len(msgs) - 1


def _expected_drops(req: dict[str, Any]) -> set[tuple[int, str]]:
    """What the official template leaves out of a request it renders."""
    out: set[tuple[int, str]] = set()
    msgs = req["messages"]
    lq = _last_query(msgs)
    for i, m in enumerate(msgs):
        for k, v in m.items():
            if v in (None, "", [], {}) or k in ("role", "content"):
                continue
            if k in ("name", "tool_call_id", "id"):
                out.add((i, k))
            elif k == "tool_calls" and any(c.get("id") for c in v):
                out.add((i, "tool_calls.id"))
        if m["role"] != "assistant":
            continue
        given = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None), None)
        content = m.get("content") or ""
        if given is None and "</think>" in content:
            r = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            if r and i <= lq:
                out.add((i, "content"))
        elif given and i <= lq:
            out.add((i, "reasoning_content"))
    return out


def test_the_dialect_names_its_reference(tpl: xtml.Template) -> None:
    assert tpl.dialect.reference["sha256"] == QWEN3_SHA256  # type: ignore[attr-defined]


def test_text_against_the_official_template(tpl: xtml.Template, official: str) -> None:
    counts = {"equal": 0, "refused": 0, "dropped": 0, "tools": 0, "parallel": 0, "grouped": 0, "thinking": 0,
              "no_thinking": 0}
    for k, req in enumerate(chatml_requests(3, N_REQUESTS, roles=("system", "user", "assistant", "tool"),
                                            thinking=True)):
        try:
            want = hf_render(official, req)
        except Exception:
            with pytest.raises(RequestError) as caught:
                tpl.render(req)
            assert caught.value.location, (k, req)
            if isinstance(caught.value, MessageError):
                assert 0 <= caught.value.index < len(req["messages"])
            counts["refused"] += 1
            continue
        r = tpl.render(req)
        assert r.text == want, (k, req)
        counts["equal"] += 1
        assert {(d.message, d.field) for d in r.dropped} == _expected_drops(req), (k, req)
        counts["dropped"] += bool(r.dropped)
        counts["tools"] += bool(req.get("tools"))
        counts["parallel"] += any(len(m.get("tool_calls") or ()) > 1 for m in req["messages"])
        counts["grouped"] += "</tool_response>\n<tool_response>" in want
        counts["thinking"] += "<think>\n" in want and "<think>\n\n</think>" not in want
        counts["no_thinking"] += req.get("enable_thinking") is False and bool(req.get("add_generation_prompt"))
    print("qwen3:", counts)
    assert counts["equal"] + counts["refused"] == N_REQUESTS
    assert counts["equal"] >= 300
    assert min(counts.values()) >= 10, counts


def test_parse_gives_the_normal_form_back(tpl: xtml.Template, official: str) -> None:
    vocab = byte_vocabulary(QWEN3_TOKENS)
    n = texts = 0
    for req in chatml_requests(3, N_REQUESTS, roles=("system", "user", "assistant", "tool"), thinking=True):
        try:
            r = tpl.render(req)
        except RequestError:
            continue
        normal = tpl.normalize(req)
        assert tpl.parse(tpl.encode(req, vocab), vocab) == normal, req
        n += 1
        if not r.ambiguous:
            assert tpl.parse(r.text) == normal, req
            texts += 1
    assert n >= 300 and texts >= 100


QWEN3_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                "<tool_response>", "</tool_response>")


def _answer(req: dict[str, Any]) -> dict[str, Any]:
    """The last (assistant) message as a parse of its rendered turn gives it
    back: reasoning taken out of content as the template takes it, shown
    after the last query, call ids and empty reasoning left out."""
    msgs = req["messages"]
    m = msgs[-1]
    content = m.get("content") or ""
    given = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None), None)
    if given is None and "</think>" in content:
        given = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        content = content.split("</think>")[-1].lstrip("\n")
    out: dict[str, Any] = {"role": "assistant"}
    if len(msgs) - 1 > _last_query(msgs):
        content = content.lstrip("\n")
        if given and given.strip("\n"):
            out["reasoning_content"] = given.strip("\n")
    out["content"] = content
    calls = []
    for c in m.get("tool_calls") or ():
        args = c["function"]["arguments"]
        calls.append({"type": "function", "function": {
            "name": c["function"]["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
    if calls:
        out["tool_calls"] = calls
    return out


def test_a_rendered_answer_parses_back_strictly_and_streams(tpl: xtml.Template, official: str) -> None:
    vocab = byte_vocabulary(QWEN3_TOKENS)
    rng = random.Random(4)
    n = 0
    for req in chatml_requests(3, N_REQUESTS, roles=("system", "user", "assistant", "tool"), thinking=True):
        msgs = req["messages"]
        if len(msgs) < 2 or msgs[-1]["role"] != "assistant" or req.get("enable_thinking") is False:
            continue
        try:
            tpl.render(req)
        except RequestError:
            continue
        whole = tpl.encode({**req, "add_generation_prompt": False}, vocab)
        prompt = tpl.encode({**req, "messages": msgs[:-1], "add_generation_prompt": True}, vocab)
        if whole[:len(prompt)] != prompt:
            continue  # the last message changes how the history is written (the template's policy)
        answer = whole[len(prompt):-1]  # the turn's trailing newline is the template's
        want = _answer(req)
        assert tpl.parse(answer, vocab, completion=True) == want, req
        k = 0
        parser = tpl.stream(vocab, lenient=False)
        events = []
        while k < len(answer):
            step = rng.randint(1, 7)
            events += parser.feed_many(answer[k:k + step])
            k += step
        events += parser.close()
        assert [e.message for e in events if e.type == "message_end"] == [want]
        assert "".join(e.text or "" for e in events if e.type == "text" and e.channel == "response") \
            == want["content"]
        assert "".join(e.text or "" for e in events if e.type == "text" and e.channel == "think") \
            == want.get("reasoning_content", "")
        n += 1
    assert n >= 40


def test_any_answer_streams_as_it_parses(tpl: xtml.Template) -> None:
    """Random answers of reasoning, content, calls, stray tokens and cuts,
    fed in random groupings: the text events of each channel join to the
    batch parse's fields, and the stream ends with that parse."""
    vocab = byte_vocabulary(QWEN3_TOKENS)
    rng = random.Random(9)
    pieces = ["<think>", "</think>", "\n", "\n\n", "hm", "ok ", "<tool_call>", "</tool_call>", "<tool_response>",
              '\n{"name": "f", "arguments": {"a": 1}}\n', "é", "<|im_start|>"]
    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.8:
            text += "<|im_end|>"
        ids = tpl.completion_ids(text, vocab)
        batch = tpl.parse(ids, vocab, completion=True, lenient=True)
        diags = batch.pop("diagnostics", [])
        parser = tpl.stream(vocab)
        events = []
        k = 0
        while k < len(ids):
            step = rng.randint(1, 4)
            events += parser.feed_many(ids[k:k + step])
            k += step
        events += parser.close()
        assert [e.message for e in events if e.type == "message_end"] == [batch], text
        for channel, key in (("response", "content"), ("think", "reasoning_content")):
            joined = "".join(e.text or "" for e in events if e.type == "text" and e.channel == channel)
            assert joined == batch.get(key, ""), (text, channel)
        assert [e.diagnostic for e in events if e.type == "diagnostic"] == diags


def test_hostile_answers_lose_nothing_silently(tpl: xtml.Template) -> None:
    vocab = byte_vocabulary(QWEN3_TOKENS)

    def ids(text: str) -> list[int]:
        return tpl.completion_ids(text, vocab)

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    # Marker text inside arguments is text in ids (no token): the call reads whole.
    args = '{"q": "a </tool_call> b"}'
    text = vocab.encode_texts(['\n{"name": "f", "arguments": ' + args + "}\n"])[0]
    out = tpl.parse(ids("<tool_call>") + text + ids("</tool_call><|im_end|>"), vocab, completion=True)
    assert out["tool_calls"][0]["function"]["arguments"] == args
    # Cut inside a call: withheld and said, never half read.
    cut = tpl.parse(ids("Sure.\n" + call[:30]), vocab, completion=True, lenient=True)
    assert "tool_calls" not in cut and [d["kind"] for d in cut["diagnostics"]] == ["truncated", "truncated"]
    with pytest.raises(xtml.ParseError):
        tpl.parse(ids("Sure.\n" + call[:30]), vocab, completion=True)
    # A call, then text: the text is a repair, the call kept.
    after = tpl.parse(ids(call + "and more<|im_end|>"), vocab, completion=True, lenient=True)
    assert len(after["tool_calls"]) == 1 and [d["kind"] for d in after["diagnostics"]] == ["stray-content"]
    # Arguments that are not JSON: withheld with a diagnostic.
    bad = tpl.parse(ids('<tool_call>\n{"name": "f", "arguments": {oops}\n</tool_call><|im_end|>'), vocab,
                    completion=True, lenient=True)
    assert "tool_calls" not in bad and [d["kind"] for d in bad["diagnostics"]] == ["bad-argument"]
    # Reasoning, content and two calls.
    both = tpl.parse(ids("<think>\nhm\n</think>\n\nok\n" + call + "\n" + call + "<|im_end|>"), vocab,
                     completion=True)
    assert both["reasoning_content"] == "hm" and both["content"] == "ok" and len(both["tool_calls"]) == 2
    thought = ids("<think>\nhm\n</think>")
    assert tpl.reasoning_tokens(thought + ids("\n\nok<|im_end|>"), vocab) == len(thought)


def test_over_a_vocabulary_without_the_added_tokens(tpl: xtml.Template, official: str) -> None:
    """Over SmolLM2's vocabulary, which has Qwen3's three special tokens but
    not its added ones: those are written and read as text. The ids are
    the official text tokenized whole; an answer that spells a call in
    plain text tokens reads back as the call."""
    smol = xtml.load_tokenizer(smollm2_gguf())
    checked = 0
    for req in chatml_requests(3, N_REQUESTS // 2, roles=("system", "user", "assistant", "tool"), thinking=True):
        try:
            want = hf_render(official, req)
        except Exception:
            continue
        if spells_marker(req, ("<|im_start|>", "<|im_end|>", "<|endoftext|>")):
            continue
        assert tpl.encode(req, smol) == whole_ids(smol, want), req
        checked += 1
    assert checked >= 100
    answer = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ids = smol.encode_texts([answer])[0] + [smol.special_id("<|im_end|>") or 0]
    out = tpl.parse(ids, smol, completion=True)
    assert out == {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
