"""gpt-oss (harmony) read back: a whole prompt to its normal form (on ids of
a byte-level vocabulary with the format's tokens, and on text where no
content spells a token), an answer written as several messages to one
message (analysis → reasoning, final and preambles → content, a message to
functions.NAME → a call), headers models write slightly malformed as
located repairs, the stream of an answer in any grouping of its ids,
training masks that train each answer's messages and its close, and the
reasoning the analysis channel holds."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xtml
from tests.helpers.family_cases import dialect_fixtures
from tests.helpers.kimi_families import Case, check_every_grouping, check_parse, joined, stream_in_groupings, vocabulary
from xtml.errors import RequestError

NAME = "gpt-oss"
FILE = Path(xtml.__file__).resolve().parent / "dialects" / "gpt-oss.toml"

tpl, cases = dialect_fixtures(NAME, FILE)

CALL = ' to=functions.get<|channel|>commentary json<|message|>{"a": 1}<|call|>'
GET = {"type": "function", "function": {"name": "get", "arguments": '{"a": 1}'}}


def answer(tpl: xtml.Template, text: str) -> dict[str, Any]:
    return tpl.parse(tpl.completion_ids(text, vocabulary(tpl)), vocabulary(tpl), completion=True, lenient=True)


def kinds(message: dict[str, Any]) -> list[str]:
    return [d["kind"] for d in message.get("diagnostics", [])]


def test_every_reader_reads_it(tpl: xtml.Template) -> None:
    assert tpl.layout.render_only == ()  # type: ignore[attr-defined]
    v = vocabulary(tpl)
    ask = {"messages": [{"role": "user", "content": "q"}], "date": "2025-02-03"}
    assert tpl.parse(tpl.encode(ask, v), v) == tpl.normalize(ask)
    ids = tpl.completion_ids("<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final"
                             "<|message|>a<|return|>", v)
    assert tpl.reasoning_tokens(ids, v) == 1 + len("analysis") + 1 + 2 + 1
    # <|end|> lets the model go on: generation stops at <|return|> and <|call|> only.
    b = tpl.bind(v)
    assert sorted(b.stop_ids) == sorted(b.token_ids[t] for t in ("<|return|>", "<|call|>"))  # type: ignore[attr-defined]


def test_parse_gives_the_normal_form_back(tpl: xtml.Template, cases: list[Case]) -> None:
    """On ids for every case the template renders, and on text where no
    content spells one of the format's tokens."""
    assert check_parse(tpl, cases) == (333, 233)


def last_answers(tpl: xtml.Template, cases: list[Case]) -> list[tuple[list[int], dict[str, Any]]]:
    """Each answer of each request as the ids the model writes after the
    generation prompt (the answer ending the render: closed by <|return|>,
    its reasoning shown wherever given), and the message the normal form
    holds."""
    v = vocabulary(tpl)
    out = []
    for case, _, _ in cases:
        msgs = case["request"]["messages"]
        for k, m in enumerate(msgs):
            if m["role"] != "assistant" or all(x["role"] == "system" for x in msgs[:k]):
                continue
            req, opts = {**case["request"], "messages": msgs[:k + 1]}, case["options"]
            try:
                tpl.render(req, **opts)
            except RequestError:
                continue
            whole = tpl.encode({**req, "add_generation_prompt": False}, v, **opts)
            prompt = tpl.encode({**req, "messages": msgs[:k], "add_generation_prompt": True}, v, **opts)
            if whole[:len(prompt)] != prompt:
                continue  # the history policy shows reasoning otherwise once the answer follows
            want = tpl.normalize({**req, "add_generation_prompt": False}, **opts)["messages"][-1]
            out.append((whole[len(prompt):], want))
    return out


def test_a_rendered_answer_parses_back_strictly_and_streams(tpl: xtml.Template, cases: list[Case]) -> None:
    rng = random.Random(4)
    v = vocabulary(tpl)
    n = with_calls = with_reasoning = 0
    for ids, want in last_answers(tpl, cases):
        assert tpl.parse(ids, v, completion=True) == want
        events = stream_in_groupings(tpl, ids, rng, 7, lenient=False)
        assert [e.message for e in events if e.type == "message_end"] == [want]
        assert joined(events, "response") == want["content"]
        assert joined(events, "think") == want.get("reasoning_content", "")
        ends = [e.stop_reason for e in events if e.type == "message_end"]
        assert ends == ["tool_calls" if want.get("tool_calls") else "stop"]
        n += 1
        with_calls += "tool_calls" in want
        with_reasoning += "reasoning_content" in want
    assert n >= 400 and with_calls >= 100 and with_reasoning >= 50, (n, with_calls, with_reasoning)


def test_the_normal_form(tpl: xtml.Template) -> None:
    """The options the system message shows, the first system text, tools
    as the namespace reads back, an answer's first call with its reasoning
    where shown, a result named by its call, later system messages and
    hidden reasoning gone (the content beside a call is its reasoning,
    hidden where a later answer without calls follows)."""
    tools = [{"type": "function", "function": {"name": "get", "description": "Get.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "description": "A.", "default": 3},
                                         "b": {"type": "string", "enum": ["x", "y"]},
                                         "c": {"type": "array", "items": {"type": "string"}}},
        "required": ["a"]}}}]
    req: dict[str, Any] = {"messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "I'll look.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get", "arguments": {"a": 1}}},
            {"id": "c2", "type": "function", "function": {"name": "get", "arguments": '{"a": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r"}]},
        {"role": "system", "content": "later"},
        {"role": "assistant", "content": "done", "reasoning_content": "checked"}],
        "tools": tools, "builtin_tools": ["python", "shell"], "add_generation_prompt": False}
    opts = {"date": "2025-03-04", "reasoning_effort": "high"}
    r = tpl.render(req, **opts)
    normal = tpl.normalize(req, **opts)
    assert normal == {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"},
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"type": "function", "function": {"name": "get", "arguments": '{"a": 1}'}}]},
                     {"role": "tool", "name": "get", "content": [{"type": "text", "text": "r"}]},
                     {"role": "assistant", "content": "done", "reasoning_content": "checked"}],
        "add_generation_prompt": False, "date": "2025-03-04", "reasoning_effort": "high",
        "model_identity": "You are ChatGPT, a large language model trained by OpenAI.", "builtin_tools": ["python"],
        "tools": [{"type": "function", "function": {"name": "get", "description": "Get.", "parameters": {
            "type": "object", "properties": {"a": {"type": "number", "description": "A.", "default": 3},
                                             "b": {"type": "string", "enum": ["x", "y"]},
                                             "c": {"type": "array", "items": {"type": "string"}}},
            "required": ["a"]}}}]}
    assert tpl.parse(r.text) == normal
    # integer reads back as number: reported, as every drop is.
    assert {(d.message, d.field) for d in r.dropped} == {
        (-1, "builtin_tools"), (-1, "tools"), (2, "content"), (2, "tool_calls.id"), (2, "tool_calls[1]"),
        (3, "tool_call_id"), (4, "content")}


def test_tools_that_read_back_as_given_are_not_reported(tpl: xtml.Template) -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": "F.", "parameters": {
        "type": "object", "properties": {"o": {"type": "object", "properties": {"n": {"type": "number"}},
                                               "required": ["n"]}, "s": {"type": "string", "nullable": True}}}}},
             {"type": "function", "function": {"name": "g", "description": "G."}}]
    req = {"messages": [{"role": "user", "content": "q"}], "tools": tools}
    r = tpl.render(req, date="2025-01-01")
    assert r.dropped == ()
    assert tpl.parse(r.text)["tools"] == tools == tpl.normalize(req, date="2025-01-01")["tools"]


@pytest.mark.parametrize(("text", "want"), [
    ("<|start|>system<|message|>x<|end|>", "the format's system turn"),
    (None, "an answer's message that is not written"),
    (None, "reasoning that no call or answer follows"),
    (None, "a message that is not of the format"),
])
def test_a_prompt_not_as_the_format_writes_one_is_a_located_error(tpl: xtml.Template, text: str | None,
                                                                   want: str) -> None:
    base = tpl.render({"messages": [{"role": "user", "content": "q"}]}, date="2025-01-01").text
    bad = text if text is not None else {
        "an answer's message that is not written": base + "<|channel|>final<|message|>a<|call|>",
        "reasoning that no call or answer follows": base + "<|channel|>analysis<|message|>a<|end|>",
        "a message that is not of the format": base.replace("<|start|>user", "<|start|>critic")}[want]
    with pytest.raises(xtml.ParseError, match=want) as e:
        tpl.parse(bad)
    assert e.value.offset is not None and e.value.line is not None


HOSTILE = [
    # (text, repairs, what is read)
    (" to=functions.get<|channel|>commentary<|message|>{\"a\": 1}<|call|>", ["header"], {"tool_calls": [GET]}),
    (" to=functions.get<|channel|>commentary <|constrain|><|message|>{\"a\": 1}<|call|>", ["header", "header"],
     {"tool_calls": [GET]}),
    ("<|channel|>thinking<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>ok<|return|>",
     ["unknown-channel"], {"reasoning_content": "hm", "content": "ok"}),
    ("<|message|>plain<|return|>", ["header"], {"content": "plain"}),
    (" to=python<|channel|>analysis code<|message|>print(1)<|call|>", ["header", "header", "bad-call"], {}),
    (" to=functions.get<|channel|>commentary json<|message|>{\"a\": ", ["truncated"], {}),
    (" to=functions.get<|channel|>commentary json<|message|>[1]<|call|>", ["bad-argument"], {}),
    (" to=functions.get<|channel|>commentary json<|message|>{\"a\": 1}<|end|>", ["bad-close", "truncated"],
     {"tool_calls": [GET]}),
    ("<|channel|>final<|message|>x<|call|>", ["bad-close"], {"content": "x"}),
    ("<|channel|>final<|message|>x<|return|>junk", ["after-end"], {"content": "x"}),
    ("<|channel|>final<|message|>x<|end|><|start|>user<|message|>more<|end|>", ["stray-message"], {"content": "x"}),
    ("<|channel|>final<|message|>x<|end|>y<|start|>assistant<|channel|>final<|message|>z<|return|>",
     ["stray-content"], {"content": "x\n\nz"}),
    ("<|channel|>final<|message|>a<|channel|>b<|return|>", ["stray-token"], {"content": "ab"}),
    ("<|channel|>final<|message|>a<|start|>assistant<|channel|>final<|message|>b<|return|>", ["unclosed"],
     {"content": "a\n\nb"}),
    ("<|channel|>analysis<|message|>a<|end|>", ["truncated"], {"reasoning_content": "a"}),
    ("<|channel|>analysis<|message|>cut", ["truncated"], {"reasoning_content": "cut"}),
    ("<|channel|>analy", ["truncated"], {}),
    ("", ["truncated"], {}),
    ("<|return|>", ["header"], {}),
    # Read as models write them, with no repair: a preamble, text before a call, harmony's constraint
    # and its recipient after the channel.
    ("<|channel|>commentary to=functions.get json<|message|>{\"a\": 1}<|call|>", [], {"tool_calls": [GET]}),
    ("<|channel|>commentary to=functions.get <|constrain|>json<|message|>{\"a\": 1}<|call|>", [],
     {"tool_calls": [GET]}),
    ("<|channel|>commentary<|message|>Looking.<|end|><|start|>assistant" + CALL, [],
     {"content": "Looking.", "tool_calls": [GET]}),
    ("<|channel|>final<|message|>text<|end|><|start|>assistant" + CALL, [], {"content": "text", "tool_calls": [GET]}),
    (" to=functions.get<|channel|>commentary <|constrain|>json<|message|>{\"a\": 1}<|call|>", [],
     {"tool_calls": [GET]}),
    (" to=functions.nowhere<|channel|>commentary json<|message|>\"{\\\"a\\\": 1}\"<|call|>", [],
     {"tool_calls": [{"type": "function", "function": {"name": "nowhere", "arguments": '{"a": 1}'}}]}),
    ("<|channel|>final<|message|>Hi<|end|>", [], {"content": "Hi"}),
]


@pytest.mark.parametrize(("text", "repairs", "read"), HOSTILE)
def test_hostile_answers_are_repaired_where_they_are(tpl: xtml.Template, text: str, repairs: list[str],
                                                     read: dict[str, Any]) -> None:
    v = vocabulary(tpl)
    ids = tpl.completion_ids(text, v)
    got = answer(tpl, text)
    assert kinds(got) == repairs
    assert all(0 <= d["offset"] <= len(ids) for d in got.get("diagnostics", []))
    assert {k: v for k, v in got.items() if k not in ("role", "diagnostics") and v != ""} == read
    if repairs:
        with pytest.raises(xtml.ParseError) as e:
            tpl.parse(ids, v, completion=True)
        assert e.value.offset == got["diagnostics"][0]["offset"]
    else:
        assert tpl.parse(ids, v, completion=True) == got
        assert tpl.parse(text, completion=True) == got


def test_marker_text_in_arguments_is_text_on_ids(tpl: xtml.Template) -> None:
    v = vocabulary(tpl)
    inside = v.encode_texts(["<|end|><|call|><|start|>assistant<|channel|>final<|message|>"])[0]
    ids = tpl.completion_ids(' to=functions.get<|channel|>commentary json<|message|>{"s": "', v) + inside + \
        tpl.completion_ids('"}<|call|>', v)
    got = tpl.parse(ids, v, completion=True)
    assert json.loads(got["tool_calls"][0]["function"]["arguments"]) == {
        "s": "<|end|><|call|><|start|>assistant<|channel|>final<|message|>"}


def test_nothing_is_lost_silently(tpl: xtml.Template) -> None:
    """Each call written is read or said to be withheld; each text read."""
    for text, _, _ in HOSTILE:
        got = answer(tpl, text)
        written = text.count("to=")
        assert written == len(got.get("tool_calls", [])) or got.get("diagnostics"), text


PIECES = ["<|channel|>", "analysis", "final", "commentary", " json", " <|constrain|>json", "<|message|>", "<|end|>",
          "<|start|>assistant", " to=functions.get", "<|call|>", "<|return|>", "hi", '{"a": 1}', "\n", "é",
          "<|start|>user", " to=python", "x y", "<|constrain|>"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=14), st.randoms(use_true_random=False),
       st.integers(min_value=1, max_value=6))
def test_any_answer_streams_as_it_parses(tpl: xtml.Template, pieces: list[str], rng: random.Random,
                                         most: int) -> None:
    """Any answer, in any grouping of its ids: the text events of each
    channel join to the batch parse's reasoning and content, the stream ends
    with the batch parse, and the diagnostics are the batch's."""
    text = "".join(pieces)
    v = vocabulary(tpl)
    ids = tpl.completion_ids(text, v)
    batch = tpl.parse(ids, v, completion=True, lenient=True)
    diags = batch.pop("diagnostics", [])
    assert all(0 <= d["offset"] <= len(ids) for d in diags)
    events = stream_in_groupings(tpl, ids, rng, most)
    assert [e.message for e in events if e.type == "message_end"] == [batch]
    assert joined(events, "response") == batch["content"]
    assert joined(events, "think") == batch.get("reasoning_content", "")
    assert [e.diagnostic for e in events if e.type == "diagnostic"] == diags
    opened = [e.channel for e in events if e.type == "channel_start"]
    closed = [e.channel for e in events if e.type == "channel_end"]
    assert sorted(opened) == sorted(closed)


def test_short_answers_stream_alike_in_every_grouping(tpl: xtml.Template) -> None:
    n = check_every_grouping(tpl, ["<|channel|>final<|message|>a<|end|>b", "<|message|>ab<|end|>c<|return|>d",
                                   "<|channel|>x<|message|>yz<|return|>", "<|message|>é<|start|>assistan",
                                   " to=f<|channel|>c<|message|>{}<|call|>"])
    assert n >= 1000


def _trained_text(tpl: xtml.Template, req: dict[str, Any], opts: dict[str, Any]) -> str:
    """Each answer as the model writes it after <|start|>assistant: its
    reasoning message where shown, then its call or final text, and the
    close (<|return|> where it ends the render)."""
    normal = tpl.normalize(req, **opts)
    answers = [m for m in normal["messages"] if m["role"] == "assistant"]
    last = normal["messages"][-1]
    out = []
    for m in answers:
        text = ""
        if "reasoning_content" in m:
            text += f"<|channel|>analysis<|message|>{m['reasoning_content']}<|end|><|start|>assistant"
        if m.get("tool_calls"):
            fn = m["tool_calls"][0]["function"]
            args = fn["arguments"]
            written = args if isinstance(json.loads(args), dict) and not _quoted(req, fn["name"]) else \
                json.dumps(args, ensure_ascii=False)
            text += f" to=functions.{fn['name']}<|channel|>commentary json<|message|>{written}<|call|>"
        else:
            # (A later system message, left out, still comes after it.)
            ends = m is last and req["messages"][-1]["role"] == "assistant" and not normal["add_generation_prompt"]
            text += f"<|channel|>final<|message|>{m['content']}{'<|return|>' if ends else '<|end|>'}"
        out.append(text)
    return "".join(out)


def _quoted(req: dict[str, Any], name: str) -> bool:
    """Whether the request gives that call's arguments as a string (written
    quoted)."""
    for m in req["messages"]:
        for c in (m.get("tool_calls") or ())[:1]:
            if c["function"]["name"] == name:
                return isinstance(c["function"]["arguments"], str)
    return False


def test_training_trains_each_answer_and_its_close(tpl: xtml.Template, cases: list[Case]) -> None:
    v = vocabulary(tpl)
    n = 0
    for case, text, _ in cases:
        req, opts = case["request"], case["options"]
        if text is None or not any(m["role"] == "assistant" for m in req["messages"]):
            continue
        calls = [c for m in req["messages"] for c in (m.get("tool_calls") or ())[:1]]
        if len({c["function"]["name"] for c in calls}) != len(calls):
            continue  # _quoted tells calls apart by name
        ex = tpl.encode_training(req, v, **opts)
        assert ex.ids == tpl.encode(req, v, **opts)
        trained = [t for t, m in zip(ex.ids, ex.mask, strict=True) if m]
        assert v.decode(trained) == _trained_text(tpl, req, opts), req
        n += 1
    assert n >= 150, n


def test_reading_costs_grow_linearly(tpl: xtml.Template) -> None:
    """An answer of many messages, and a prompt whose system message and
    options spell the system turn's own text again and again: at 4x the
    size, the calls made (Python functions and C functions alike, counted
    by a profile hook, not timed) grow 4x, no more."""
    import sys

    v = vocabulary(tpl)

    def calls(f: Any) -> int:
        n = 0

        def count(frame: Any, event: str, arg: Any) -> None:
            nonlocal n
            if event in ("call", "c_call"):
                n += 1

        sys.setprofile(count)
        try:
            f()
        finally:
            sys.setprofile(None)
        return n

    def costs(n: int) -> tuple[int, int]:
        text = "<|channel|>analysis<|message|>x y<|end|><|start|>assistant" * n
        text += "<|channel|>final<|message|>z<|return|>"
        ids = tpl.completion_ids(text, v)
        lit = "\nKnowledge cutoff: 2024-06\nCurrent date: 1\n\nReasoning: 2\n\n## browser\n\n" * n
        prompt = tpl.encode({"messages": [{"role": "system", "content": lit}, {"role": "user", "content": lit}]}, v,
                            model_identity=lit, date="d")
        return calls(lambda: tpl.parse(ids, v, completion=True)), calls(lambda: tpl.parse(prompt, v))

    small, large = costs(300), costs(1200)
    assert large[0] <= 4.2 * small[0] and large[1] <= 4.2 * small[1], (small, large)
