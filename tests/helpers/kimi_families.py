"""What the ``kimi-k2`` and ``kimi-k2-thinking`` tests share: the shape
of a case (request, options, and the official text or the template's
raise), the drops each template makes silently, and the checks of parse
and stream that hold for both formats alike."""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator
from typing import Any

import pytest

import xtml
from xtml.errors import MessageError, RequestError
from xtml.vocab.vocabulary import Vocabulary, byte_vocabulary

REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

Case = tuple[dict[str, Any], str | None, str | None]
"""A generated case, the official template's text, or what it raised."""


def given_reasoning(m: dict[str, Any]) -> Any:
    return next((m[k] for k in REASONING_KEYS if m.get(k) is not None), None)


_SPELLED = re.compile(r"functions\.(.+?):[0-9]+", re.S)


def spells(call: dict[str, Any]) -> bool:
    """Whether a call's id spells its name as Kimi K2 spells ids."""
    m = _SPELLED.fullmatch(call.get("id") or "")
    return m is not None and m.group(1) == call["function"]["name"]


def k2_drops(req: dict[str, Any], opts: dict[str, Any]) -> set[tuple[int, str]]:
    """What Kimi K2's template leaves out of a request it renders: names,
    reasoning, call ids other than the ones it makes."""
    out: set[tuple[int, str]] = set()
    for i, m in enumerate(req["messages"]):
        for k, v in m.items():
            if v in (None, "", [], {}) or k in ("role", "content"):
                continue
            if k in ("name", *REASONING_KEYS) or (k == "tool_call_id" and m["role"] != "tool"):
                out.add((i, k))
            elif k == "tool_calls" and any(c.get("id") and c["id"] != f"functions.{c['function']['name']}:{j}"
                                           for j, c in enumerate(v)):
                out.add((i, "tool_calls.id"))
    return out


def thinking_drops(req: dict[str, Any], opts: dict[str, Any]) -> set[tuple[int, str]]:
    """What Kimi K2 Thinking's template leaves out: reasoning up to the last
    assistant message without calls, and the names of calls whose ids do
    not spell them (it writes no name but the id)."""
    msgs = req["messages"]
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant" and not m.get("tool_calls")), default=-1)
    out: set[tuple[int, str]] = set()
    for i, m in enumerate(msgs):
        if m["role"] == "assistant" and given_reasoning(m) and i <= last:
            out.add((i, "reasoning_content"))
        if m.get("tool_calls") and not all(spells(c) for c in m["tool_calls"]):
            out.add((i, "tool_calls.function.name"))
        if m.get("tool_call_id") and m["role"] != "tool":
            out.add((i, "tool_call_id"))
    return out


def python_list(req: dict[str, Any]) -> list[int]:
    """Messages whose list content Kimi K2's template prints as a Python
    list (a tool result's, an assistant's beside its calls)."""
    return [i for i, m in enumerate(req["messages"]) if isinstance(m.get("content"), list)
            and (m["role"] == "tool" or (m["role"] == "assistant" and m.get("tool_calls")))]


def check_texts(tpl: xtml.Template, cases: list[Case], drops: Any, repr_refused: Any = None) -> dict[str, int]:
    """Text byte-equal wherever the template renders (but where it prints a
    Python repr, refused at that message), a located refusal wherever it
    raises, and the drops reported exactly."""
    counts = {"equal": 0, "refused": 0, "refused_repr": 0, "dropped": 0, "tools": 0, "parallel": 0,
              "results_in_a_row": 0, "reasoning_shown": 0, "parts": 0, "marker_text": 0, "ends_assistant": 0,
              "no_prompt": 0}
    for k, (case, want, raises) in enumerate(cases):
        req, opts = case["request"], case["options"]
        reprs = repr_refused(req) if repr_refused is not None else []
        if raises is not None or reprs:
            with pytest.raises(RequestError) as caught:
                tpl.render(req, **opts)
            assert caught.value.location, (k, req)
            if reprs:
                assert isinstance(caught.value, MessageError) and caught.value.index in reprs, (k, req)
                assert caught.value.path == "content"
            counts["refused_repr" if reprs else "refused"] += 1
            continue
        r = tpl.render(req, **opts)
        assert r.text == want, (k, req)
        counts["equal"] += 1
        assert {(d.message, d.field) for d in r.dropped} == drops(req, opts), (k, req, opts)
        msgs = req["messages"]
        counts["dropped"] += bool(r.dropped)
        counts["tools"] += bool(req.get("tools"))
        counts["parallel"] += any(len(m.get("tool_calls") or ()) > 1 for m in msgs)
        counts["results_in_a_row"] += any(a["role"] == b["role"] == "tool" for a, b in itertools.pairwise(msgs))
        counts["reasoning_shown"] += bool(re.search(r"<think>[^<]", want or ""))
        counts["parts"] += any(isinstance(m.get("content"), list) for m in msgs)
        counts["marker_text"] += bool(r.ambiguous)
        counts["ends_assistant"] += msgs[-1]["role"] == "assistant"
        counts["no_prompt"] += not req["add_generation_prompt"]
    return counts


def vocabulary(tpl: xtml.Template) -> Vocabulary:
    """Byte tokens and the format's tokens, each one special id: Kimi K2's
    own tokenizer is not packaged."""
    return byte_vocabulary(tpl.dialect.tokens)  # type: ignore[attr-defined]


def check_parse(tpl: xtml.Template, cases: list[Case]) -> tuple[int, int]:
    """parse(render(x)) == normalize(x), on ids and (where no content spells
    a token) on text."""
    vocab = vocabulary(tpl)
    n = texts = 0
    for case, _, _ in cases:
        req, opts = case["request"], case["options"]
        try:
            r = tpl.render(req, **opts)
        except RequestError:
            continue
        normal = tpl.normalize(req, **opts)
        assert tpl.parse(tpl.encode(req, vocab, **opts), vocab) == normal, req
        n += 1
        if not r.ambiguous:
            assert tpl.parse(r.text) == normal, req
            texts += 1
    return n, texts


def last_turns(tpl: xtml.Template, cases: list[Case]) -> Iterator[tuple[list[int], dict[str, Any], dict[str, Any]]]:
    """For each assistant message of each request: the ids a model writes
    after the generation prompt to give it, the message as the normal form
    of the conversation up to it holds it, and that conversation; where the
    message changes how the history before it is written, none."""
    vocab = vocabulary(tpl)
    for case, _, _ in cases:
        msgs = case["request"]["messages"]
        for k, m in enumerate(msgs):
            if m["role"] != "assistant" or all(x["role"] == "system" for x in msgs[:k]):
                continue
            # The conversation up to this answer, as a request of its own.
            req = {**case["request"], "messages": msgs[:k + 1]}
            yield from _last_turn(tpl, vocab, req, case["options"])


def _last_turn(tpl: xtml.Template, vocab: Vocabulary, req: dict[str, Any], opts: dict[str, Any]) -> Iterator[
        tuple[list[int], dict[str, Any], dict[str, Any]]]:
    msgs = req["messages"]
    try:
        tpl.render(req, **opts)
    except RequestError:
        return
    whole = tpl.encode({**req, "add_generation_prompt": False}, vocab, **opts)
    prompt = tpl.encode({**req, "messages": msgs[:-1], "add_generation_prompt": True}, vocab, **opts)
    if whole[:len(prompt)] != prompt:
        return  # a name as role text, or the history policy
    want = tpl.normalize(req, **opts)["messages"][-1]
    for k in ("name", "prefix"):
        want.pop(k, None)  # said by the turn's open, which the prompt writes
    yield whole[len(prompt):], want, req


def stream_in_groupings(tpl: xtml.Template, ids: list[int], rng: random.Random, most: int,
                        lenient: bool = True, tools: Any = None) -> list[Any]:
    parser = tpl.stream(vocabulary(tpl), lenient=lenient, tools=tools)
    events: list[Any] = []
    k = 0
    while k < len(ids):
        step = rng.randint(1, most)
        events += parser.feed_many(ids[k:k + step])
        k += step
    return events + parser.close()


def joined(events: list[Any], channel: str) -> str:
    return "".join(e.text or "" for e in events if e.type == "text" and e.channel == channel)


def check_answers(tpl: xtml.Template, cases: list[Case]) -> dict[str, int]:
    """Each rendered last turn parses back, strictly, to the message, and
    streams to it in random groupings; a turn whose calls the format cannot
    name (ids that spell no name) is refused strictly and withheld with a
    diagnostic leniently."""
    vocab = vocabulary(tpl)
    rng = random.Random(4)
    counts = {"answers": 0, "with_calls": 0, "nameless": 0}
    for answer, want, req in last_turns(tpl, cases):
        calls = want.get("tool_calls", [])
        if any(not c["function"]["name"] for c in calls):
            with pytest.raises(xtml.ParseError):
                tpl.parse(answer, vocab, completion=True)
            got = tpl.parse(answer, vocab, completion=True, lenient=True)
            kept = [c for c in calls if c["function"]["name"]]
            assert got.get("tool_calls", []) == kept, req
            assert [d["kind"] for d in got["diagnostics"]] == ["bad-call"] * (len(calls) - len(kept))
            counts["nameless"] += 1
            continue
        assert tpl.parse(answer, vocab, completion=True) == want, req
        events = stream_in_groupings(tpl, answer, rng, 7, lenient=False)
        assert [e.message for e in events if e.type == "message_end"] == [want]
        assert joined(events, "response") == want["content"]
        assert joined(events, "think") == want.get("reasoning_content", "")
        ends = [e.stop_reason for e in events if e.type == "message_end"]
        assert ends == ["tool_calls" if calls else "stop"]
        counts["answers"] += 1
        counts["with_calls"] += bool(calls)
    return counts


def check_any_answer_streams(tpl: xtml.Template, pieces: list[str], n: int = 400) -> None:
    """Random answers of the format's pieces, stray tokens and cuts, fed in
    random groupings: each channel's text joins to the batch parse's field,
    the stream ends with the batch parse, and a lenient parse never raises."""
    vocab = vocabulary(tpl)
    rng = random.Random(9)
    for _ in range(n):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.8:
            text += "<|im_end|>"
        ids = tpl.completion_ids(text, vocab)
        batch = tpl.parse(ids, vocab, completion=True, lenient=True)
        diags = batch.pop("diagnostics", [])
        assert all(isinstance(d["offset"], int) and 0 <= d["offset"] <= len(ids) for d in diags), text
        for most in (1, 3, 8):
            events = stream_in_groupings(tpl, ids, rng, most)
            assert [e.message for e in events if e.type == "message_end"] == [batch], text
            assert joined(events, "response") == batch.get("content", ""), text
            assert joined(events, "think") == batch.get("reasoning_content", ""), text
            assert [e.diagnostic for e in events if e.type == "diagnostic"] == diags, text


def check_every_grouping(tpl: xtml.Template, answers: list[str]) -> int:
    """Short answers fed in every grouping of their ids: each gives the
    batch parse's message, text and diagnostics."""
    vocab = vocabulary(tpl)
    n = 0
    for text in answers:
        ids = tpl.completion_ids(text, vocab)
        assert len(ids) <= 14, text
        batch = tpl.parse(ids, vocab, completion=True, lenient=True)
        diags = batch.pop("diagnostics", [])
        for cuts in range(1 << max(len(ids) - 1, 0)):
            parser = tpl.stream(vocab)
            events: list[Any] = []
            start = 0
            for k in range(1, len(ids)):
                if cuts >> (k - 1) & 1:
                    events += parser.feed_many(ids[start:k])
                    start = k
            events += parser.feed_many(ids[start:]) + parser.close()
            assert [e.message for e in events if e.type == "message_end"] == [batch], (text, cuts)
            assert joined(events, "response") == batch.get("content", ""), (text, cuts)
            assert joined(events, "think") == batch.get("reasoning_content", ""), (text, cuts)
            assert [e.diagnostic for e in events if e.type == "diagnostic"] == diags, (text, cuts)
            n += 1
    return n


def deepseek_drops(req: dict[str, Any], opts: dict[str, Any]) -> set[tuple[int, str]]:
    """What DeepSeek V3.1's template leaves out: tools, names, call ids,
    reasoning, content before an answer's first ``</think>`` (but after a
    tool result or beside calls), a prefix it does not show, and the
    generation prompt after anything but a user message."""
    thinking = opts.get("thinking", opts.get("enable_thinking", False))
    out: set[tuple[int, str]] = set()
    if req.get("tools"):
        out.add((-1, "tools"))
    prev = ""
    for i, m in enumerate(req["messages"]):
        for k, v in m.items():
            if v in (None, "", [], {}) or k in ("role", "content", "tool_calls", "prefix"):
                continue
            out.add((i, k))
        if m.get("tool_calls") and any(c.get("id") for c in m["tool_calls"]):
            out.add((i, "tool_calls.id"))
        if m["role"] == "assistant":
            calls = bool(m.get("tool_calls"))
            if not calls and prev != "tool" and "</think>" in (m.get("content") or ""):
                out.add((i, "content"))
            if m.get("prefix") and not (prev == "user" and thinking and not calls):
                out.add((i, "prefix"))
        if m["role"] != "system":
            prev = m["role"]
    if req["add_generation_prompt"] and prev != "user":
        out.add((-1, "add_generation_prompt"))
    return out
