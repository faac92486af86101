"""Gemma 4 read back: a whole prompt to its normal form (on ids of a
byte-level vocabulary with the format's tokens, and on text where no content
spells a token), an answer to its message (a reasoning block, content, calls
in Gemma's key:value syntax typed by the request's tools), the stream of an
answer in any grouping of its ids (each call's arguments through the value
syntax's stream reader), and training masks that train each answer and its
stop."""

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
from xtml.plugins.values import load_value_syntax

NAME = "gemma-4"
FILE = Path(xtml.__file__).resolve().parent / "dialects" / "gemma-4.toml"
FAMILIES = Path(__file__).resolve().parent / "data" / "families"
Q = '<|"|>'
END, WAIT = "<turn|>", "<|tool_response>"

tpl, cases = dialect_fixtures(NAME, FILE)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "units": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "noop", "description": "Nothing."}}]


def answer(tpl: xtml.Template, text: str, tools: Any = TOOLS, lenient: bool = True) -> dict[str, Any]:
    v = vocabulary(tpl)
    return tpl.parse(tpl.completion_ids(text, v), v, completion=True, lenient=lenient, tools=tools)


def kinds(message: dict[str, Any]) -> list[str]:
    return [d["kind"] for d in message.get("diagnostics", [])]


def test_every_reader_reads_it_and_the_others_stay_refused(tpl: xtml.Template) -> None:
    assert tpl.layout.render_only == ()  # type: ignore[attr-defined]
    assert tpl.layout.folded_turns  # type: ignore[attr-defined]
    v = vocabulary(tpl)
    ask = {"messages": [{"role": "user", "content": "q"}]}
    assert tpl.parse(tpl.encode(ask, v), v) == tpl.normalize(ask)
    ids = tpl.completion_ids("<|channel>thought\nhm\n<channel|>a<turn|>", v)
    assert tpl.reasoning_tokens(ids, v) == ids.index(tpl.completion_ids("<channel|>", v)[0]) + 1
    # Another kind of format (one message written as several): not this reader's.
    gpt = xtml.load("gpt-oss").layout  # type: ignore[attr-defined]
    assert not gpt.folded_turns
    mistral = xtml.load("mistral-small-3.1").layout  # type: ignore[attr-defined]
    assert mistral.render_only == () and not mistral.folded_turns


def test_parse_gives_the_normal_form_back(tpl: xtml.Template, cases: list[Case]) -> None:
    """On ids for every case the template renders, and on text where no
    content spells one of the format's tokens."""
    assert check_parse(tpl, cases) == (381, 299)


def _answers(tpl: xtml.Template, cases: list[Case]) -> list[tuple[list[int], dict[str, Any], dict[str, Any]]]:
    """Each answer of each rendered conversation as the model writes it
    after the prompt (up to its stop), and the message it reads as: the
    normal form's (an answer that continues a turn left open: its content).
    Calls whose arguments are objects, as a model writes them."""
    v = vocabulary(tpl)
    out = []
    for case, text, _ in cases:
        if text is None:
            continue
        msgs, opts = case["request"]["messages"], case["options"]
        for k, m in enumerate(msgs):
            if m["role"] != "assistant" or any(isinstance(c["function"]["arguments"], str)
                                               for c in m.get("tool_calls") or ()):
                continue  # string arguments: history's, not what a model writes
            req = {**case["request"], "messages": msgs[:k + 1]}
            try:
                whole = tpl.encode({**req, "add_generation_prompt": False}, v, **opts)
                prompt = tpl.encode({**req, "messages": msgs[:k], "add_generation_prompt": True}, v, **opts)
            except RequestError:
                continue
            block = tpl.completion_ids("<|channel>thought\n<channel|>", v)
            if whole[:len(prompt)] != prompt and prompt[-len(block):] == block:
                prompt = prompt[:-len(block)]  # the prompt's empty reasoning block, which history does not write
            if whole[:len(prompt)] != prompt:
                continue
            ids = whole[len(prompt):]
            stops = [j for j, t in enumerate(ids) if t in tpl.bind(v).stop_ids]
            if not stops:
                continue  # results left open: the next answer goes on
            normal = tpl.normalize(req, **opts)["messages"]
            last = next(x for x in reversed(normal) if x["role"] == "assistant")
            want = last if normal[-1]["role"] == "assistant" else {"role": "assistant", "content": last["content"]}
            out.append((ids[:stops[0] + 1], want, req))
    return out


def test_a_rendered_answer_parses_back_strictly_and_streams(tpl: xtml.Template, cases: list[Case]) -> None:
    v = vocabulary(tpl)
    rng = random.Random(4)
    n = calls = reasoning = 0
    for ids, want, req in _answers(tpl, cases):
        tools = req.get("tools")
        assert tpl.parse(ids, v, completion=True, tools=tools) == want, req
        events = stream_in_groupings(tpl, ids, rng, 7, lenient=False, tools=tools)
        assert [e.message for e in events if e.type == "message_end"] == [want]
        assert joined(events, "response") == want["content"]
        assert joined(events, "think") == want.get("reasoning_content", "")
        assert [e.call for e in events if e.type == "tool_call_end"] == want.get("tool_calls", [])
        assert [e.stop_reason for e in events if e.type == "message_end"] == \
            ["tool_calls" if want.get("tool_calls") else "stop"]
        n += 1
        calls += bool(want.get("tool_calls"))
        reasoning += bool(want.get("reasoning_content"))
    assert n >= 400 and calls >= 30 and reasoning >= 5, (n, calls, reasoning)


def test_the_normal_form(tpl: xtml.Template) -> None:
    """The system text trimmed, a developer message as the system message;
    tools as their declaration reads; content trimmed and cut; reasoning
    beside calls after the last user message; calls without ids, arguments
    sorted as written; results back as tool messages under the name
    written; an answer continuing a turn left open merged into it."""
    req: dict[str, Any] = {"messages": [
        {"role": "developer", "content": "  Be brief. "},
        {"role": "user", "content": [{"type": "text", "text": " a "}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "reasoning_content": "R", "tool_calls": [
            {"id": "x1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": {"days": 2, "city": "Oslo"}}},
            {"id": "x2", "type": "function", "function": {"name": "noop", "arguments": '{"raw": 1}'}}]},
        {"role": "tool", "tool_call_id": "x2", "content": " two "},
        {"role": "tool", "name": "other", "content": "one"},
        {"role": "assistant", "content": " done <|channel>x<channel|>"}], "tools": TOOLS[:1]}
    want = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "done", "reasoning_content": "R", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}},
            {"type": "function", "function": {"name": "noop", "arguments": '{"raw": 1}'}}]},
        {"role": "tool", "name": "noop", "content": " two "},
        {"role": "tool", "name": "other", "content": "one"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
            "properties": {"city": {"type": "STRING"}, "days": {"type": "INTEGER"},
                           "units": {"enum": ["c", "f"], "type": "STRING"}},
            "required": ["city"], "type": "OBJECT"}}}],
        "add_generation_prompt": True, "enable_thinking": True}
    v = vocabulary(tpl)
    assert tpl.normalize(req, enable_thinking=True) == want
    assert tpl.parse(tpl.encode(req, v, enable_thinking=True), v) == want
    assert tpl.parse(tpl.render(req, enable_thinking=True).text) == want
    r = tpl.render(req, enable_thinking=True)
    assert {(0, "role"), (-1, "tools"), (5, "content")} <= {(d.message, d.field) for d in r.dropped}


@pytest.mark.parametrize(("req", "opts", "field"), [
    # An empty system text beside the thinking turn reads back as none.
    ({"messages": [{"role": "system", "content": " "}, {"role": "user", "content": "q"}]}, {"enable_thinking": True},
     (0, "content")),
    # String arguments that read as the syntax's object.
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "a:1"}}]}]}, {}, (1, "tool_calls")),
    # A name holding what opens the arguments.
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f{x", "arguments": {}}}]}]}, {}, (1, "tool_calls")),
    # A later answer without calls after results left open: that turn's content.
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {}}}]}, {"role": "tool", "content": "r"},
        {"role": "assistant", "content": "after"}]}, {}, (3, "content")),
])
def test_what_reads_back_otherwise_is_reported(tpl: xtml.Template, req: dict[str, Any], opts: dict[str, Any],
                                               field: tuple[int, str]) -> None:
    v = vocabulary(tpl)
    r = tpl.render(req, **opts)
    assert field in {(d.message, d.field) for d in r.dropped}
    assert tpl.parse(tpl.encode(req, v, **opts), v) == tpl.normalize(req, **opts)
    assert tpl.parse(r.text) == tpl.normalize(req, **opts)


def test_a_declaration_that_does_not_read_is_reported_and_refused(tpl: xtml.Template) -> None:
    """Parameters without a type: the template leaves a brace open."""
    req = {"messages": [{"role": "user", "content": "q"}],
           "tools": [{"type": "function", "function": {"name": "f", "description": "F", "parameters": {
               "properties": {"a": {"type": "string"}}}}}]}
    r = tpl.render(req)
    assert (-1, "tools") in {(d.message, d.field) for d in r.dropped}
    with pytest.raises(xtml.ParseError) as e:
        tpl.parse(r.text)
    assert e.value.offset is not None and 0 < e.value.offset < len(r.text)
    with pytest.raises(xtml.OptionError, match="do not read back") as refused:
        tpl.normalize(req)
    assert refused.value.option == "tools"


def test_a_prompt_not_as_the_format_writes_one_is_a_located_error(tpl: xtml.Template) -> None:
    good = tpl.render({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a",
                                    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]},
                                   {"role": "tool", "content": "r"}], "tools": TOOLS}).text
    for bad in (good[:-len("<turn|>\n")], good.replace("<|turn>user", "<|turn>", 1), good.replace("call:f", "f"),
                good.replace("<tool_call|>", ""), good.replace("response:f{value:", "response:f"),
                good.replace("declaration:get_weather{", "declaration:get_weather"), good + "x"):
        with pytest.raises(xtml.ParseError) as e:
            tpl.parse(bad)
        assert e.value.offset is not None and 0 <= e.value.offset <= len(bad), bad


CALL = "<|tool_call>call:get_weather{city:" + Q + "Oslo" + Q + ",days:2}<tool_call|>"

HOSTILE: list[tuple[str, list[str], int]] = [
    # (answer, the repairs a lenient parse makes, in order, the calls it keeps)
    ("Sure. " + CALL + WAIT, [], 1),  # a call after text: content and call
    # A stop inside a call: the call is not closed, what follows the stop is not read.
    ("<|tool_call>call:get_weather{city:" + Q + "a}<turn|>,{" + Q + "}<tool_call|>" + WAIT, ["bad-call", "after-end"],
     0),
    ("<|tool_call>call:nobody{x:1}<tool_call|>" + WAIT, [], 1),  # unknown tool: read, the caller checks
    ("<|tool_call>call:get_weather{days:two}<tool_call|>" + WAIT, ["bad-argument"], 0),  # the schema's integer
    ("<|tool_call>call:get_weather{city:Oslo}<tool_call|>" + WAIT, [], 1),  # a bare word for a string
    (CALL[:-14], ["truncated", "truncated"], 0),  # cut inside a call
    (CALL + CALL[:30], ["truncated", "truncated"], 1),
    ("<|tool_call>call:get_weather{city:" + Q + "x" + Q + "<|tool_call>" + CALL[12:] + WAIT, ["bad-call"], 1),
    ("<|tool_call>get_weather{}<tool_call|>" + WAIT, ["bad-call"], 0),
    ("<|tool_call>call:{}<tool_call|>" + WAIT, ["bad-call"], 0),
    ("<|tool_call>call:noop<tool_call|>" + WAIT, ["bad-call"], 0),
    ("<|tool_call>call:noop{a:<|channel>1}<tool_call|>" + WAIT, ["stray-token"], 0),
    ("<|tool_call>call:noop{a:1}}<tool_call|>" + WAIT, ["bad-argument"], 0),
    (CALL + " and then" + WAIT, [], 1),  # content after calls, as the template writes it
    (CALL + "<channel|>" + CALL + WAIT, ["stray-token"], 2),
    ("a<|tool>b" + END, ["stray-token"], 0),
    ("<|channel>thought\nno end" + END, ["truncated"], 0),
    ("<|tool_call>call:noop{a:" + "[" * 5000 + "]" * 5000 + "}<tool_call|>" + WAIT, ["bad-argument"], 0),  # too deep
    ("hi" + END + "more", ["after-end"], 0),
    ("hi", ["truncated"], 0),
]


@pytest.mark.parametrize(("text", "repairs", "kept"), HOSTILE)
def test_hostile_answers_are_repaired_where_they_are(tpl: xtml.Template, text: str, repairs: list[str],
                                                     kept: int) -> None:
    """Lenient: never raises, each repair at its token; strict: a located
    ParseError wherever lenient repairs."""
    v = vocabulary(tpl)
    ids = tpl.completion_ids(text, v)
    got = tpl.parse(ids, v, completion=True, lenient=True, tools=TOOLS)
    assert kinds(got) == repairs
    assert len(got.get("tool_calls", [])) == kept
    assert all(0 <= d["offset"] <= len(ids) for d in got.get("diagnostics", []))
    if repairs:
        with pytest.raises(xtml.ParseError) as e:
            tpl.parse(ids, v, completion=True, tools=TOOLS)
        assert e.value.offset == got["diagnostics"][0]["offset"]
    else:
        assert tpl.parse(ids, v, completion=True, tools=TOOLS) == got
        assert tpl.parse(text, completion=True, tools=TOOLS) == got


@pytest.mark.parametrize(("text", "repairs", "kept"), HOSTILE)
def test_hostile_answers_stream_as_they_parse(tpl: xtml.Template, text: str, repairs: list[str], kept: int) -> None:
    v = vocabulary(tpl)
    ids = tpl.completion_ids(text, v)
    batch = tpl.parse(ids, v, completion=True, lenient=True, tools=TOOLS)
    diags = batch.pop("diagnostics", [])
    events = stream_in_groupings(tpl, ids, random.Random(len(ids)), 5, tools=TOOLS)
    assert [e.message for e in events if e.type == "message_end"] == [batch]
    assert [e.call for e in events if e.type == "tool_call_end"] == batch.get("tool_calls", [])
    assert [e.diagnostic for e in events if e.type == "diagnostic"] == diags


def test_hostile_answers_lose_nothing_silently(tpl: xtml.Template) -> None:
    """Each call written either read or said to be withheld: none lost
    without a repair. Marker text in a value is text in ids: read whole;
    the quote spelled as text is not a quote."""
    silent = 0
    for text, _, _ in HOSTILE:
        got = answer(tpl, text)
        if text.count("<|tool_call>") > len(got.get("tool_calls", [])) and not got.get("diagnostics"):
            silent += 1
    assert silent == 0
    v = vocabulary(tpl)
    inside = v.encode_texts(["<turn|> <|tool_call> } ,x:"])[0]
    ids = tpl.completion_ids("<|tool_call>call:get_weather{city:" + Q, v) + inside + \
        tpl.completion_ids(Q + "}<tool_call|>" + WAIT, v)
    got = tpl.parse(ids, v, completion=True, tools=TOOLS)
    assert json.loads(got["tool_calls"][0]["function"]["arguments"]) == {"city": "<turn|> <|tool_call> } ,x:"}
    spelled = tpl.completion_ids("<|tool_call>call:get_weather{city:", v) + v.encode_texts([Q + "a" + Q])[0] + \
        tpl.completion_ids("}<tool_call|>" + WAIT, v)
    got = tpl.parse(spelled, v, completion=True, lenient=True, tools=TOOLS)
    assert kinds(got) == ["bad-argument"] and "tool_calls" not in got
    typed = answer(tpl, "<|tool_call>call:get_weather{city:Oslo,days:3,units:c}<tool_call|>" + WAIT)
    assert json.loads(typed["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo", "days": 3, "units": "c"}
    assert kinds(answer(tpl, "<|tool_call>call:get_weather{city:Oslo}<tool_call|>" + WAIT, tools=None)) == \
        ["bad-argument"]


def test_a_completion_as_the_template_writes_it(tpl: xtml.Template) -> None:
    """Reasoning (label and the newline before the close gone), content
    trimmed, calls with their arguments as JSON text, either stop."""
    got = answer(tpl, "<|channel>thought\nfirst\n<channel|> Let me check. " + CALL + CALL + WAIT, lenient=False)
    assert got == {"role": "assistant", "content": "Let me check.", "reasoning_content": "first", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}}] * 2}
    assert answer(tpl, "<|channel>\nplain<channel|>\n hi \n" + END, lenient=False) == \
        {"role": "assistant", "content": "hi", "reasoning_content": "\nplain"}
    assert answer(tpl, CALL + END, lenient=False)["tool_calls"]


PIECES = ["hi", " ", "é", "\n", "<|channel>", "thought\n", "<channel|>", CALL, "<|tool_call>", "call:noop",
          "{a:", Q, "x", "1}", "<tool_call|>", "<|tool>", "}", ",b:2"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=10), st.sampled_from(["", END, WAIT]),
       st.randoms(use_true_random=False), st.integers(min_value=1, max_value=6))
def test_any_answer_streams_as_it_parses(tpl: xtml.Template, pieces: list[str], stop: str, rng: random.Random,
                                         most: int) -> None:
    """Any answer, in any grouping of its ids: the text events join to the
    batch parse's content and reasoning, the calls that end are the batch's
    calls, the stream ends with the batch parse, and the diagnostics are the
    batch's."""
    text = "".join(pieces) + stop
    v = vocabulary(tpl)
    ids = tpl.completion_ids(text, v)
    batch = tpl.parse(ids, v, completion=True, lenient=True, tools=TOOLS)
    diags = batch.pop("diagnostics", [])
    events = stream_in_groupings(tpl, ids, rng, most, tools=TOOLS)
    assert [e.message for e in events if e.type == "message_end"] == [batch]
    assert joined(events, "response") == batch["content"]
    assert joined(events, "think") == batch.get("reasoning_content", "")
    assert [e.call for e in events if e.type == "tool_call_end"] == batch.get("tool_calls", [])
    assert [e.diagnostic for e in events if e.type == "diagnostic"] == diags


def test_short_answers_stream_alike_in_every_grouping(tpl: xtml.Template) -> None:
    n = check_every_grouping(tpl, ["<|channel>a\n<channel|> c<turn|>", "x<|tool>y<turn|>z",
                                   "<|tool_call>call:f{a:1}<tool_call|>", "<|tool_call>c:" + Q + "<tool_call|>",
                                   "<|channel>thou\n<channel|>é\n"])
    assert n >= 300


def _trained_text(tpl: xtml.Template, req: dict[str, Any], opts: dict[str, Any]) -> str:
    """What each answer trains, as the model writes it: its shown reasoning
    and its calls, then the token that opens their results (or the content
    first, where no results follow); then what it writes after the results,
    and its end."""
    syntax = load_value_syntax("gemma")
    msgs = req["messages"]
    held = int(msgs[0]["role"] in ("system", "developer"))
    normal = [m for m in tpl.normalize({**req, "tools": None}, **opts)["messages"]]
    out = []
    n = 0
    for k, m in enumerate(msgs):
        if m["role"] != "assistant" or k < held:
            continue
        calls = m.get("tool_calls") or []
        answered = k + 1 < len(msgs) and msgs[k + 1]["role"] == "tool"
        text = _content(m)
        merged = not calls and _after_open(msgs, k, held)
        if calls:
            shown = [x for x in normal if x["role"] == "assistant"][n]
            if shown.get("reasoning_content"):
                out.append("<|channel>thought\n" + shown["reasoning_content"] + "\n<channel|>")
            for c in calls:
                a = c["function"]["arguments"]
                out.append("<|tool_call>call:" + c["function"]["name"]
                           + ("{" + a + "}" if isinstance(a, str) else syntax.write(a, {})) + "<tool_call|>")
            if answered:
                out.append(WAIT)
                if m.get("content"):
                    out.append(text + END)
            else:
                out.append(text + WAIT)
        else:
            out.append(text + END)
        n += not merged
    return "".join(out)


def _content(m: dict[str, Any]) -> str:
    c = m.get("content") or ""
    parts = [c] if isinstance(c, str) else [p["text"] for p in c]
    return "".join("".join(x.split("<|channel>", 1)[0] for x in p.split("<channel|>")).strip() for p in parts)


def _after_open(msgs: list[dict[str, Any]], k: int, held: int) -> bool:
    j = k - 1
    while j >= held and msgs[j]["role"] == "tool":
        j -= 1
    return j < k - 1 and msgs[j]["role"] == "assistant" and bool(msgs[j].get("tool_calls")) \
        and not msgs[j].get("content")


def test_training_trains_each_answer_and_its_stop(tpl: xtml.Template, cases: list[Case]) -> None:
    v = vocabulary(tpl)
    n = 0
    for case, text, _ in cases:
        req, opts = case["request"], case["options"]
        if text is None or not any(m["role"] == "assistant" for m in req["messages"]):
            continue
        try:
            ex = tpl.encode_training(req, v, **opts)
        except RequestError:
            continue  # refused where the template prints a Python repr
        assert ex.ids == tpl.encode(req, v, **opts)
        trained = [t for t, m in zip(ex.ids, ex.mask, strict=True) if m]
        assert v.decode(trained) == _trained_text(tpl, req, opts), req
        n += 1
    assert n >= 200


def test_a_streamed_call_feeds_each_character_once(tpl: xtml.Template, monkeypatch: pytest.MonkeyPatch) -> None:
    """The value syntax's stream reader gets each character of the
    arguments once, whatever their length (counts at 1x and 4x)."""
    syntax = load_value_syntax("gemma")
    real = syntax.reader
    fed: list[int] = []

    class Counted:
        def __init__(self, schema: Any) -> None:
            self.inner = real(schema)

        def feed(self, chunk: str) -> list[tuple[str, Any]]:
            fed.append(len(chunk))
            return self.inner.feed(chunk)

        def close(self) -> list[tuple[str, Any]]:
            return self.inner.close()

    monkeypatch.setattr(syntax, "reader", Counted)
    v = vocabulary(tpl)
    counts = []
    for n in (500, 2000):
        args = "{city:" + Q + "x" * n + Q + ",days:" + "1" * (n // 100) + "}"
        ids = tpl.completion_ids("<|tool_call>call:get_weather" + args + "<tool_call|>" + WAIT, v)
        fed.clear()
        events = stream_in_groupings(tpl, ids, random.Random(n), 3, tools=TOOLS)
        assert [e.call for e in events if e.type == "tool_call_end"] == \
            tpl.parse(ids, v, completion=True, tools=TOOLS)["tool_calls"]
        counts.append(sum(fed))
        assert counts[-1] == len(args)  # the quote token fed as its string
    assert counts[1] <= 4 * counts[0] + 100
