"""Mistral Small 3.1 read back: a whole prompt to its normal form (on ids of
a byte-level vocabulary with the format's tokens, and on text where no
content spells a token), an answer to its message (content, then calls as
one JSON array after [TOOL_CALLS]), the stream of an answer in any grouping
of its ids, and training masks that train each answer and its </s>."""

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
from tests.helpers.kimi_families import (
    Case,
    check_answers,
    check_every_grouping,
    check_parse,
    joined,
    stream_in_groupings,
    vocabulary,
)

NAME = "mistral-small-3.1"
FILE = Path(xtml.__file__).resolve().parent / "dialects" / "mistral-small-3.1.toml"

tpl, cases = dialect_fixtures(NAME, FILE)

_PARALLEL = "You are a helpful assistant that can call tools."


def answer(tpl: xtml.Template, text: str) -> dict[str, Any]:
    return tpl.parse(tpl.completion_ids(text, vocabulary(tpl)), vocabulary(tpl), completion=True, lenient=True)


def kinds(message: dict[str, Any]) -> list[str]:
    return [d["kind"] for d in message.get("diagnostics", [])]


def test_every_reader_reads_it_and_the_others_stay_refused(tpl: xtml.Template) -> None:
    assert tpl.layout.render_only == ()  # type: ignore[attr-defined]
    assert tpl.layout.system_turns  # type: ignore[attr-defined]
    v = vocabulary(tpl)
    ask = {"messages": [{"role": "user", "content": "q"}], "date": "2025-02-03"}
    assert tpl.parse(tpl.encode(ask, v), v) == tpl.normalize(ask)
    assert tpl.reasoning_tokens(tpl.completion_ids("a</s>", v), v) == 0
    for other in ("gpt-oss", "gemma-4"):
        # Read by a reader of its own kind, not this one.
        layout = xtml.load(other).layout  # type: ignore[attr-defined]
        assert layout.render_only == () and not layout.system_turns


def test_parse_gives_the_normal_form_back(tpl: xtml.Template, cases: list[Case]) -> None:
    """On ids for every case the template renders, and on text where no
    content spells one of the format's tokens."""
    assert check_parse(tpl, cases) == (354, 284)


def test_a_rendered_answer_parses_back_strictly_and_streams(tpl: xtml.Template, cases: list[Case]) -> None:
    counts = check_answers(tpl, cases)
    assert counts["answers"] >= 480 and counts["with_calls"] >= 100 and counts["nameless"] == 0, counts


def test_the_normal_form(tpl: xtml.Template) -> None:
    """The default system prompt gives its date back and no system message;
    a system message gives no date; tools read key by key (return left
    out, strings as written); ids cut; the content beside calls gone; a
    result's content as written; no generation prompt."""
    tools = [{"type": "function", "function": {"name": "f", "description": 'say "hi" \\n', "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}, "return": {"type": "string"}}}]
    req: dict[str, Any] = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": "beside", "tool_calls": [
            {"id": "call_abcdefghi", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}},
            {"id": "123456789", "type": "function", "function": {"name": "f", "arguments": "not json"}}]},
        {"role": "tool", "content": [{"type": "text", "text": "r"}], "tool_call_id": "call_abcdefghi"},
        {"role": "tool", "content": "plain", "tool_call_id": "123456789"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "q"}], "tools": tools, "date": "2025-02-03"}
    want = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}, "id": "abcdefghi"},
            {"type": "function", "function": {"name": "f", "arguments": "not json"}, "id": "123456789"}]},
        {"role": "tool", "content": "[{'type': 'text', 'text': 'r'}]", "tool_call_id": "abcdefghi"},
        {"role": "tool", "content": "plain", "tool_call_id": "123456789"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "q"}],
        "tools": [{"type": "function", "function": {"name": "f", "description": 'say "hi" \\n', "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}}}}}],
        "add_generation_prompt": False, "date": "2025-02-03"}
    v = vocabulary(tpl)
    assert tpl.normalize(req) == want
    assert tpl.parse(tpl.encode(req, v), v) == want
    assert tpl.parse(tpl.render(req).text) == want
    system = {**req, "messages": [{"role": "system", "content": "S"}, *req["messages"]]}
    normal = tpl.normalize(system)
    assert "date" not in normal and normal["messages"][0] == {"role": "system", "content": "S"}
    assert tpl.parse(tpl.encode(system, v), v) == normal
    # Tools with no user message: the tools' prompt alone, read as tools given, none declared.
    alone = {"messages": [{"role": "system", "content": "S"}], "tools": tools}
    assert tpl.normalize(alone)["tools"] == [] == tpl.parse(tpl.render(alone).text)["tools"]


def test_a_system_text_that_spells_the_formats_own_reads_back_as_it(tpl: xtml.Template) -> None:
    """Render reports it; the normal form is what the parse reads."""
    def turn(req: dict[str, Any]) -> str:
        text = tpl.render(req, date="2020-01-01").text
        return text[len("<s>[SYSTEM_PROMPT]"):text.index("[/SYSTEM_PROMPT]")]

    own = turn({"messages": [{"role": "user", "content": "q"}]})
    parallel = turn({"messages": [{"role": "system", "content": ""}], "tools": []})
    assert parallel.startswith(_PARALLEL)
    for system, read in ((own, {"date": "2020-01-01"}), (parallel + " x", {"tools": []})):
        req = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "q"}],
               "add_generation_prompt": False}
        r = tpl.render(req)
        assert [(d.message, d.field) for d in r.dropped] == [(0, "content")]
        normal = tpl.normalize(req)
        assert tpl.parse(r.text) == normal
        assert all(normal[k] == val for k, val in read.items())
    plain = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}],
             "add_generation_prompt": False}
    assert tpl.render(plain).dropped == ()


def test_a_quote_that_cuts_a_declared_string_short_is_reported(tpl: xtml.Template) -> None:
    """Strings are declared unescaped: one holding the text that follows a
    value may read back otherwise (the first reading of the declaration
    that reads whole is taken), reported; the normal form is that reading."""
    v = vocabulary(tpl)
    for description, reported in (('a", "k": "b', True), ('a ", "b', True), ('a "b" c', False), ('x"}}', False),
                                  ('end"', False)):
        tools = [{"type": "function", "function": {"name": "f", "description": description}},
                 {"type": "function", "function": {"name": "g"}}]
        req = {"messages": [{"role": "user", "content": "q"}], "tools": tools}
        r = tpl.render(req)
        assert ((-1, "tools") in {(d.message, d.field) for d in r.dropped}) == reported, description
        normal = tpl.normalize(req)
        assert tpl.parse(tpl.encode(req, v), v) == normal
        assert (normal["tools"] != tools) == reported, description


def test_a_prompt_not_as_the_format_writes_one_is_a_located_error(tpl: xtml.Template) -> None:
    good = tpl.render({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                       "tools": [{"type": "function", "function": {"name": "f"}}]}).text
    for bad in (good[:-len("</s>")], good.replace("[INST]", "", 1), good.replace("[SYSTEM_PROMPT]", ""),
                good.replace('"name": "f"', '"name" "f"'), good.replace("[/INST]", "[/INST][TOOL_CALLS] [x]")):
        with pytest.raises(xtml.ParseError) as e:
            tpl.parse(bad)
        assert e.value.offset is not None and 0 <= e.value.offset <= len(bad), bad


CALL = '{"name": "f", "arguments": {"a": 1}, "id": "abcdefghi"}'

HOSTILE: list[tuple[str, list[str], int]] = [
    # (answer, the repairs a lenient parse makes, in order, the calls it keeps)
    ("Sure.[TOOL_CALLS] [" + CALL + "]</s>", [], 1),  # a call after text: content and call
    ('[TOOL_CALLS] [{"name": "f", "arguments": {"s": "] }, ["}}]</s>', [], 1),  # JSON's own marks in a value
    ('[TOOL_CALLS] [{"name": "nobody", "arguments": {}}]</s>', [], 1),  # unknown tool: read, the caller checks
    ("[TOOL_CALLS] [" + CALL[:-12], ["truncated", "truncated"], 0),  # cut inside a call
    ("[TOOL_CALLS] [" + CALL + ", " + CALL[:20], ["truncated", "truncated"], 1),
    ("[TOOL_CALLS] [" + CALL + "</s>", ["bad-call"], 1),  # a missing ]
    ('[TOOL_CALLS] [{"name": "f", "arguments": {a: 1}}]</s>', ["bad-call"], 0),  # bad JSON
    ('[TOOL_CALLS] [{"name": "f", "arguments": "{oops"}, ' + CALL + "]</s>", ["bad-argument"], 1),
    ('[TOOL_CALLS] [{"name": "f", "arguments": [1]}]</s>', ["bad-argument"], 0),
    ('[TOOL_CALLS] [{"name": 3, "arguments": {}}]</s>', ["bad-call"], 0),
    ('[TOOL_CALLS] [{"name": "f", "arguments": {}, "extra": 1}]</s>', ["bad-call"], 0),
    ('[TOOL_CALLS] [{"name": "f", "arguments": {}, "id": 7}]</s>', ["bad-call"], 0),
    ('[TOOL_CALLS] [{"name": "f"}]</s>', ["bad-argument"], 0),
    ("[TOOL_CALLS] [" + CALL + "] and then</s>", ["stray-content"], 1),
    ("[TOOL_CALLS] [" + CALL + "] [" + CALL + "]</s>", ["stray-content"], 1),
    ("[TOOL_CALLS] []</s>", ["bad-call"], 0),
    ("[TOOL_CALLS] {" + CALL + "}</s>", ["bad-call"], 0),
    ("[TOOL_CALLS]</s>", ["bad-call"], 0),
    ("[TOOL_CALLS] [" + CALL + " " + CALL + "]</s>", ["bad-call"], 1),
    ('[TOOL_CALLS] [{"name": "f[INST]", "arguments": {}}]</s>', ["stray-token"], 1),
    ("a[IMG]b[TOOL_CALLS] [" + CALL + "][TOOL_CALLS]</s>", ["stray-token", "stray-token"], 1),
    ("hi</s>more", ["after-end"], 0),
    ("hi", ["truncated"], 0),
]


@pytest.mark.parametrize(("text", "repairs", "kept"), HOSTILE)
def test_hostile_answers_are_repaired_where_they_are(tpl: xtml.Template, text: str, repairs: list[str],
                                                     kept: int) -> None:
    """Lenient: never raises, each repair at its token; strict: a located
    ParseError wherever lenient repairs."""
    v = vocabulary(tpl)
    ids = tpl.completion_ids(text, v)
    got = tpl.parse(ids, v, completion=True, lenient=True)
    assert kinds(got) == repairs
    assert len(got.get("tool_calls", [])) == kept
    assert all(0 <= d["offset"] <= len(ids) for d in got.get("diagnostics", []))
    if repairs:
        with pytest.raises(xtml.ParseError) as e:
            tpl.parse(ids, v, completion=True)
        assert e.value.offset == got["diagnostics"][0]["offset"]
    else:
        assert tpl.parse(ids, v, completion=True) == got
        assert tpl.parse(text, completion=True) == got


def test_hostile_answers_lose_nothing_silently(tpl: xtml.Template) -> None:
    """Each call written either read or said to be withheld: none lost
    without a repair. Marker text in a value is text in ids: read whole."""
    silent = 0
    for text, _, _ in HOSTILE:
        got = answer(tpl, text)
        written = text.count('{"name"')
        if written > len(got.get("tool_calls", [])) and not got.get("diagnostics"):
            silent += 1
    assert silent == 0
    v = vocabulary(tpl)
    inside = v.encode_texts(["[INST] </s> [TOOL_CALLS] ]"])[0]
    ids = tpl.completion_ids('[TOOL_CALLS] [{"name": "f", "arguments": {"s": "', v) + inside + \
        tpl.completion_ids('"}}]</s>', v)
    got = tpl.parse(ids, v, completion=True)
    assert json.loads(got["tool_calls"][0]["function"]["arguments"]) == {"s": "[INST] </s> [TOOL_CALLS] ]"}
    after = answer(tpl, HOSTILE[0][0])
    assert after["content"] == "Sure." and after["tool_calls"][0]["id"] == "abcdefghi"
    quoted = answer(tpl, '[TOOL_CALLS][{"arguments": "{\\"x\\": 2}", "name": "g"}]</s>')
    assert quoted["tool_calls"] == [{"type": "function", "function": {"name": "g", "arguments": '{"x": 2}'}}]


PIECES = ["hi", " ", "é", "\n", "[TOOL_CALLS]", " [", "]", CALL, ", ", '{"name": "f", ', '"arguments": {}}',
          "[INST]", "[IMG]", "</s>", "{", '"', "x"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=10), st.booleans(), st.randoms(use_true_random=False),
       st.integers(min_value=1, max_value=6))
def test_any_answer_streams_as_it_parses(tpl: xtml.Template, pieces: list[str], stop: bool, rng: random.Random,
                                         most: int) -> None:
    """Any answer, in any grouping of its ids: the text events join to the
    batch parse's content, the stream ends with the batch parse, and the
    diagnostics are the batch's."""
    text = "".join(pieces) + ("</s>" if stop else "")
    v = vocabulary(tpl)
    ids = tpl.completion_ids(text, v)
    batch = tpl.parse(ids, v, completion=True, lenient=True)
    diags = batch.pop("diagnostics", [])
    events = stream_in_groupings(tpl, ids, rng, most)
    assert [e.message for e in events if e.type == "message_end"] == [batch]
    assert joined(events, "response") == batch["content"]
    assert [e.diagnostic for e in events if e.type == "diagnostic"] == diags


def test_short_answers_stream_alike_in_every_grouping(tpl: xtml.Template) -> None:
    n = check_every_grouping(tpl, ["a b[TOOL_CALLS] [{}]</s>", "x[INST]y</s>z", "[TOOL_CALLS][1, {", "é\n</s>",
                                   "ok[IMG][TOOL_CALLS]  []</s>"])
    assert n >= 300


def _trained_text(tpl: xtml.Template, req: dict[str, Any], opts: dict[str, Any]) -> str:
    """Each answer as the model writes it, then </s>: its content (none
    beside calls), or its calls as one JSON array, ids cut."""
    normal = [m for m in tpl.normalize(req, **opts)["messages"] if m["role"] == "assistant"]
    given = [m for m in req["messages"] if m["role"] == "assistant"]
    out = []
    for m, g in zip(normal, given, strict=True):
        if g.get("tool_calls"):
            out.append("[TOOL_CALLS] [" + ", ".join(
                f'{{"name": {json.dumps(c["function"]["name"], ensure_ascii=False)}, "arguments": '
                f'{json.dumps(c["function"]["arguments"], ensure_ascii=False)}, "id": "{c["id"][-9:]}"}}'
                for c in g["tool_calls"]) + "]")
        else:
            out.append(m["content"])
        out.append("</s>")
    return "".join(out)


def test_training_trains_each_answer_and_its_end(tpl: xtml.Template, cases: list[Case]) -> None:
    v = vocabulary(tpl)
    n = 0
    for case, text, _ in cases:
        req, opts = case["request"], case["options"]
        if text is None or not any(m["role"] == "assistant" for m in req["messages"]):
            continue
        ex = tpl.encode_training(req, v, **opts)
        assert ex.ids == tpl.encode(req, v, **opts)
        trained = [t for t, m in zip(ex.ids, ex.mask, strict=True) if m]
        assert v.decode(trained) == _trained_text(tpl, req, opts), req
        n += 1
    assert n >= 200


def _cascading(n: int) -> dict[str, Any]:
    """Tools whose every string can be cut at its quote, each cut read on
    into the next tool."""
    return {"messages": [{"role": "user", "content": "q"}], "add_generation_prompt": False,
            "tools": [{"type": "function", "function": {"name": f"f{i}", "description": 'a ", "b'}} for i in range(n)]}


def test_a_declaration_no_reading_reads_is_reported_and_refused(tpl: xtml.Template) -> None:
    req = _cascading(100)
    r = tpl.render(req)
    assert [(d.message, d.field) for d in r.dropped] == [(-1, "tools")]
    with pytest.raises(xtml.ParseError) as e:
        tpl.parse(r.text)
    assert e.value.offset is not None and 0 < e.value.offset < len(r.text)
    with pytest.raises(xtml.OptionError, match="do not read back") as refused:
        tpl.normalize(req)
    assert refused.value.option == "tools"


def test_other_readings_of_a_declaration_are_bounded(tpl: xtml.Template, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each string's ends are looked for once a reading, and the readings
    tried are bounded: the looks grow with the declaration, not past it."""
    from xtml.chat import layout_system_turn

    looks = [0]
    real = layout_system_turn._string_end

    def counted(*args: Any) -> int:
        looks[0] += 1
        return real(*args)

    monkeypatch.setattr(layout_system_turn, "_string_end", counted)
    counts = []
    for n in (100, 400):
        text = tpl.render(_cascading(n)).text.replace("}}][/AVAILABLE_TOOLS]", "}}}[/AVAILABLE_TOOLS]")
        looks[0] = 0
        with pytest.raises(xtml.ParseError):
            tpl.parse(text)
        counts.append(looks[0])
    assert counts[1] <= 4 * counts[0], counts
