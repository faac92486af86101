"""GLM-4.6's format as a layout dialect file, against GLM-4.6's own chat
template (``GLM-4.6.jinja`` of llama.cpp's sdist, rendered by transformers
at test time): byte-equal text wherever the official template renders, a
located refusal wherever it raises or prints a Python repr, and every field
it leaves out reported.

The file uses what the layout language says for it: a head written first
(``[gMASK]<sop>``), tools declared one by one in their own turn,
``/nothink`` added to user text with thinking off, an empty
``<think></think>`` on every answer, turns that no marker closes, and
arguments written as ``<arg_key>``/``<arg_value>`` pairs, read back typed by
the declared tools' schemas. Parse (prompts and answers, strict and
lenient) and the stream are tested here."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.family_cases import dialect_fixtures, names_its_reference, reference_template, texts_match
from tests.helpers.family_requests import hf_render
from tests.helpers.kimi_families import (
    REASONING_KEYS,
    Case,
    check_any_answer_streams,
    check_every_grouping,
    check_parse,
    given_reasoning,
    joined,
    last_turns,
    stream_in_groupings,
    vocabulary,
)
from xtml.errors import MessageError

NAME = "glm-4.6"


tpl, cases = dialect_fixtures(NAME)

def reads_otherwise(value: Any, prop: Any) -> bool:
    """Whether a value written as a pair (a string as it is, else JSON)
    reads back as another: a string no schema calls a string that reads as
    JSON other than a string, or a non-string a string property reads as
    text."""
    string = isinstance(prop, dict) and prop.get("type") == "string"
    if isinstance(value, str):
        if string or (isinstance(prop, dict) and prop.get("type") not in (None, "string")):
            return False
        try:
            return not isinstance(json.loads(value), str)
        except ValueError:
            return False
    return string


def glm_drops(req: dict[str, Any], opts: dict[str, Any]) -> set[tuple[int, str]]:
    """What GLM-4.6's template leaves out of a request it renders: names,
    tool_call_id, call ids, and reasoning up to the last user message; and
    what reads back otherwise: arguments (by the declared schemas), and an
    empty last answer (the thinking-off generation prompt's text)."""
    msgs = req["messages"]
    last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=-1)
    out: set[tuple[int, str]] = set()
    props = {t["function"]["name"]: t["function"].get("parameters", {}).get("properties", {})
             for t in req.get("tools") or ()}
    for i, m in enumerate(msgs):
        for c in m.get("tool_calls") or ():
            args = c["function"].get("arguments") or {}
            schema = props.get(c["function"]["name"], {})
            if isinstance(args, dict) and any(reads_otherwise(v, schema.get(k)) for k, v in args.items()):
                out.add((i, "tool_calls"))
    last = msgs[-1]
    if last["role"] == "assistant" and not req.get("add_generation_prompt", True) and not last.get("tool_calls"):
        content = last.get("content") or ""
        if isinstance(content, list):
            content = "".join(p if isinstance(p, str) else p.get("text", "") for p in content)
        given = given_reasoning(last)
        if given is None and "</think>" in content:
            given = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
        if not content.strip() and not (len(msgs) - 1 > last_user and (given or "").strip()):
            out.add((len(msgs) - 1, "content"))
    for i, m in enumerate(msgs):
        for k, v in m.items():
            if v in (None, "", [], {}) or k in ("role", "content", *REASONING_KEYS):
                continue
            if k in ("name", "tool_call_id"):
                out.add((i, k))
            elif k == "tool_calls" and any(c.get("id") for c in v):
                out.add((i, "tool_calls.id"))
        if m["role"] == "assistant" and i < last_user:
            given = given_reasoning(m)
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p if isinstance(p, str) else p.get("text", "") for p in content)
            if given:
                out.add((i, "reasoning_content"))
            elif given is None and isinstance(content, str) and "</think>" in content and \
                    content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n"):
                out.add((i, "content"))
    return out


def tool_lists(req: dict[str, Any]) -> list[int]:
    """Tool results given as a list: the template writes each item's Python
    repr (or its ``output``), which xtml does not reproduce."""
    return [i for i, m in enumerate(req["messages"]) if m["role"] == "tool" and isinstance(m.get("content"), list)]


test_the_file_names_its_reference = names_its_reference(NAME)


def test_text_against_the_official_template(tpl: xtml.Template, cases: list[Case]) -> None:
    counts = texts_match(tpl, cases, glm_drops, tool_lists)
    assert counts["refused"] >= 5 and counts["tools"] >= 50 and counts["reasoning_shown"] >= 10, counts


def test_spellings_the_template_has(tpl: xtml.Template) -> None:
    """Strings raw and anything else as JSON between <arg_value>s; one
    <|observation|> before a run of results; "/nothink" once; the block
    empty before the last user message."""
    req = {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": " Let me see. ", "reasoning_content": "hidden", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "when": None}}}]},
        {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "warm"},
        {"role": "user", "content": "thanks/nothink"}], "enable_thinking": False}
    r = tpl.render(req)
    assert r.text == (
        "[gMASK]<sop><|user|>\nWeather?/nothink<|assistant|>\n<think></think>\nLet me see.\n<tool_call>get_weather\n"
        "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
        "<arg_key>when</arg_key>\n<arg_value>null</arg_value>\n</tool_call><|observation|>\n<tool_response>\nsunny\n"
        "</tool_response>\n<tool_response>\nwarm\n</tool_response><|user|>\nthanks/nothink<|assistant|>\n"
        "<think></think>")
    assert {(d.message, d.field) for d in r.dropped} == {(1, "reasoning_content"), (1, "tool_calls.id")}


def test_arguments_as_json_text_are_refused_where_the_template_raises(tpl: xtml.Template) -> None:
    req: dict[str, Any] = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
                                                                           "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}]}
    with pytest.raises(MessageError, match="as key/value pairs: give them as an object") as e:
        tpl.render(req)
    assert (e.value.index, e.value.path) == (1, "tool_calls[0].function.arguments")
    # None or empty arguments are no pairs, as the template reads them.
    req["messages"][1]["tool_calls"][0]["function"]["arguments"] = None
    assert "<tool_call>f\n</tool_call>" in tpl.render(req).text


@pytest.mark.parametrize("messages", [
    # No user message: the template shows every answer's reasoning.
    [{"role": "system", "content": "s"}, {"role": "assistant", "content": "ok", "reasoning_content": "R"}],
    [{"role": "assistant", "content": " a ", "reasoning_content": " r "}, {"role": "user", "content": "u"},
     {"role": "assistant", "content": "<think>x</think>\n\ny", "tool_calls": [
         {"type": "function", "function": {"name": "f", "arguments": {"k": [1, "é"], "s": "raw \"q\""}}}]}],
])
def test_edges_against_the_official_template(tpl: xtml.Template, messages: list[Any]) -> None:
    template = reference_template(NAME)
    case = {"request": {"messages": messages, "add_generation_prompt": False}, "options": {}}
    assert tpl.render(case["request"]).text == hf_render(NAME, template, case)


def test_what_a_turns_format_does_not_write_is_refused_in_its_file(tmp_path: Path) -> None:
    from xtml.chat.template_file import builtin_files

    text = builtin_files(layout=True)["llama-3.1"].read_text(encoding="utf-8")
    bad = text.replace("[tools]\n", "[system]\nhead = \"<|begin_of_text|>\"\n\n[tools]\n", 1)
    path = tmp_path / "bad.toml"
    path.write_text(bad, encoding="utf-8")
    with pytest.raises(xtml.TemplateError, match="a head is not written with \\[turns\\]"):
        xtml.load(str(path))


def test_an_assistant_body_that_asks_has_text_renders_and_only_renders(tmp_path: Path) -> None:
    from xtml.chat.template_file import builtin_files

    text = builtin_files(layout=True)["smollm2"].read_text(encoding="utf-8")
    assert "[roles.body]" not in text
    path = tmp_path / "t.toml"
    path.write_text(text.replace("[roles]\n", "[roles.body]\nassistant = \"{?has_text}T:{/}{content}\"\n\n[roles]\n",
                                 1), encoding="utf-8")
    t = xtml.load(str(path))
    req: dict[str, Any] = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}],
           "add_generation_prompt": False}
    assert "T:" not in t.render(req).text
    assert "T:a" in t.render({**req, "messages": [req["messages"][0], {"role": "assistant", "content": "a"}]}).text
    with pytest.raises(xtml.OptionError, match="content written where it holds more than whitespace"):
        t.normalize(req)


def test_parse_gives_the_normal_form_back(tpl: xtml.Template, cases: list[Case]) -> None:
    n, texts = check_parse(tpl, cases)
    print(NAME, {"ids": n, "text": texts})
    assert n >= 380 and texts >= 250


def test_a_rendered_answer_parses_back_strictly_and_streams(tpl: xtml.Template, cases: list[Case]) -> None:
    """Each assistant message of each request, as the model writes it after
    the generation prompt (its stop: <|observation|> after calls, else
    <|user|>), parses back strictly to the message, its arguments typed by
    the request's tools, and streams to it in random groupings."""
    vocab = vocabulary(tpl)
    rng = random.Random(4)
    counts = {"answers": 0, "with_calls": 0, "typed": 0}
    for answer, want, req in last_turns(tpl, cases):
        if want["role"] != "assistant":
            continue  # an empty last answer, which reads as the generation prompt
        tools = req.get("tools")
        calls = want.get("tool_calls", [])
        ids = answer + tpl.completion_ids("<|observation|>" if calls else "<|user|>", vocab)
        assert tpl.parse(ids, vocab, completion=True, tools=tools) == want, req
        events = stream_in_groupings(tpl, ids, rng, 7, lenient=False, tools=tools)
        assert [e.message for e in events if e.type == "message_end"] == [want]
        assert joined(events, "response") == want["content"]
        assert joined(events, "think") == want.get("reasoning_content", "")
        counts["answers"] += 1
        counts["with_calls"] += bool(calls)
        counts["typed"] += bool(calls and tools)
    print(NAME, counts)
    assert counts["answers"] >= 300 and counts["with_calls"] >= 60 and counts["typed"] >= 20


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "s": {"type": "string"}, "n": {"type": "integer"}, "o": {"type": "object"}, "e": {"enum": ["1", "2"]}}}}}]


def answer_ids(tpl: xtml.Template, text: str) -> list[int]:
    return tpl.completion_ids(text, vocabulary(tpl))


def call(name: str, **pairs: str) -> str:
    return f"\n<tool_call>{name}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
                                              for k, v in pairs.items()) + "</tool_call>"


def test_values_are_typed_by_the_declared_schema(tpl: xtml.Template) -> None:
    v = vocabulary(tpl)
    ids = answer_ids(tpl, "\n<think>hm</think>\nSure." + call("f", s="42", n="42", o='{"a": [1]}', e="1", x="true",
                                                                   y="plain") + "<|observation|>")
    got = tpl.parse(ids, v, completion=True, tools=TOOLS)
    assert got["reasoning_content"] == "hm" and got["content"] == "Sure."
    assert json.loads(got["tool_calls"][0]["function"]["arguments"]) == {
        "s": "42", "n": 42, "o": {"a": [1]}, "e": "1", "x": True, "y": "plain"}
    # Without the schema: what reads as a JSON number, boolean, null, object or array is that value.
    # The stream's message is the parse's, with the tools and without.
    for tools in (TOOLS, None):
        parser = tpl.stream(v, tools=tools)
        ended = [e.message for e in parser.feed_many(ids) + parser.close() if e.type == "message_end"]
        assert ended == [tpl.parse(ids, v, completion=True, lenient=True, tools=tools)]
    streamed = json.loads(ended[0]["tool_calls"][0]["function"]["arguments"])
    assert streamed["s"] == 42 and streamed["n"] == 42
    bare = tpl.parse(ids, v, completion=True)
    assert json.loads(bare["tool_calls"][0]["function"]["arguments"])["s"] == 42
    # A value that is not JSON of its declared type: refused strictly, withheld leniently.
    bad = answer_ids(tpl, call("f", n="many") + "<|observation|>")
    with pytest.raises(xtml.ParseError, match="'n' of tool call 1 is not JSON of its declared type"):
        tpl.parse(bad, v, completion=True, tools=TOOLS)
    got = tpl.parse(bad, v, completion=True, lenient=True, tools=TOOLS)
    assert "tool_calls" not in got and [d["kind"] for d in got["diagnostics"]] == ["bad-argument"]


def test_render_reports_what_reads_back_otherwise(tpl: xtml.Template) -> None:
    """A string that reads back as a number where no schema says it is a
    string, and an empty last answer written as the thinking-off prompt."""
    req = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "g", "arguments": {"a": "7", "b": "x"}}}]}],
        "add_generation_prompt": False}
    r = tpl.render(req)
    assert [(d.message, d.field) for d in r.dropped] == [(1, "tool_calls")] and "'a'" in r.dropped[0].why
    assert tpl.parse(r.text) == tpl.normalize(req)
    assert json.loads(tpl.normalize(req)["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"a": 7, "b": "x"}
    # Declared a string: nothing to report, the string comes back.
    typed = {**req, "tools": [{"type": "function", "function": {"name": "g", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}]}
    assert tpl.render(typed).dropped == ()
    assert tpl.parse(tpl.render(typed).text) == tpl.normalize(typed)
    empty = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}],
             "add_generation_prompt": False}
    r = tpl.render(empty)
    assert r.text.endswith("<|user|>\nq<|assistant|>\n<think></think>")  # the thinking-off prompt's text
    assert [(d.message, d.field) for d in r.dropped] == [(1, "content")]
    assert tpl.normalize(empty) == tpl.parse(r.text) == {
        "messages": [{"role": "user", "content": "q"}], "add_generation_prompt": True, "enable_thinking": False}


def test_hostile_answers_lose_nothing_silently(tpl: xtml.Template) -> None:
    v = vocabulary(tpl)
    # Marker text inside a value is text in ids: the value reads whole.
    inside = v.encode_texts(["a </arg_value> <|observation|> b"])[0]
    ids = answer_ids(tpl, "\n<think></think>" + "\n<tool_call>f\n<arg_key>s</arg_key>\n<arg_value>") + inside + \
        answer_ids(tpl, "</arg_value>\n</tool_call><|observation|>")
    got = tpl.parse(ids, v, completion=True, tools=TOOLS)
    assert json.loads(got["tool_calls"][0]["function"]["arguments"]) == {"s": "a </arg_value> <|observation|> b"}
    # Cut inside a call: withheld and said, never half read.
    cut = tpl.parse(answer_ids(tpl, "Sure." + call("f", s="x")[:-20]), v, completion=True, lenient=True)
    assert "tool_calls" not in cut and cut["content"] == "Sure."
    assert [d["kind"] for d in cut["diagnostics"]] == ["truncated", "truncated"]
    with pytest.raises(xtml.ParseError):
        tpl.parse(answer_ids(tpl, "Sure." + call("f", s="x")[:-20]), v, completion=True)
    # A call, then text: the text is a repair, the call kept.
    after = tpl.parse(answer_ids(tpl, call("f", s="x") + " and more<|observation|>"), v, completion=True,
                      lenient=True)
    assert len(after["tool_calls"]) == 1 and [d["kind"] for d in after["diagnostics"]] == ["stray-content"]
    # A key given twice, pairs not as the format writes them: withheld with a diagnostic.
    twice = call("f", s="x").replace("</tool_call>", "<arg_key>s</arg_key>\n<arg_value>y</arg_value>\n</tool_call>")
    for text, kind in ((twice, "bad-call"), (call("f", s="x").replace("</arg_key>\n", "</arg_key>"), "bad-argument")):
        got = tpl.parse(answer_ids(tpl, text + "<|observation|>"), v, completion=True, lenient=True)
        assert "tool_calls" not in got and [d["kind"] for d in got["diagnostics"]] == [kind], text
    # Two calls, one to a tool the request does not declare: both read (the caller checks names).
    two = tpl.parse(answer_ids(tpl, "ok" + call("f", s="1") + call("unknown", q="[1]") + "<|observation|>"), v,
                    completion=True, tools=TOOLS)
    assert two["content"] == "ok" and [c["function"]["arguments"] for c in two["tool_calls"]] == [
        '{"s": "1"}', '{"q": [1]}']
    # A reasoning block cut off, and ids after the stop.
    cut = tpl.parse(answer_ids(tpl, "\n<think>deep"), v, completion=True, lenient=True)
    assert cut["reasoning_content"] == "deep" and [d["kind"] for d in cut["diagnostics"]] == ["truncated",
                                                                                             "truncated"]
    late = tpl.parse(answer_ids(tpl, "hi<|user|>more"), v, completion=True, lenient=True)
    assert late["content"] == "hi" and [d["kind"] for d in late["diagnostics"]] == ["after-end"]


def test_any_answer_streams_as_it_parses(tpl: xtml.Template) -> None:
    check_any_answer_streams(tpl, [
        "hm", " ok ", "\n", "é", "<think>", "</think>", "<tool_call>", "f\n", "<arg_key>", "k", "</arg_key>",
        "<arg_value>", "1", "</arg_value>", "</tool_call>", "<|observation|>", "<|user|>", "<|system|>"])


def test_short_answers_stream_alike_in_every_grouping(tpl: xtml.Template) -> None:
    n = check_every_grouping(tpl, [
        " <think>r </think>a ", "\n<think>x<tool_call></think>y<|user|>", " x <arg_key> y \n<|observation|>z",
        "a \n<tool_call>f\n</tool_call>",
        "<tool_call>f\n<arg_key>k</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"])
    assert n >= 300


def test_the_cli_parses_an_answer_with_the_requests_tools(tmp_path: Path) -> None:
    from tests.helpers.cli import run

    answer = tmp_path / "answer.txt"
    answer.write_text("\n<think>hm</think>" + call("f", s="42", n="42") + "<|observation|>", encoding="utf-8")
    tools = tmp_path / "request.json"
    tools.write_text(json.dumps({"messages": [], "tools": TOOLS}), encoding="utf-8")
    code, out, err = run(["parse", "-t", NAME, "--completion", "--tools", str(tools), str(answer)])
    assert code == 0, err
    assert json.loads(json.loads(out)["tool_calls"][0]["function"]["arguments"]) == {"s": "42", "n": 42}
    code, out, _ = run(["parse", "-t", NAME, "--completion", str(answer)])
    assert code == 0 and json.loads(json.loads(out)["tool_calls"][0]["function"]["arguments"]) == {"s": 42, "n": 42}
    bad = tmp_path / "bad.json"
    bad.write_text('{"tools": 3}', encoding="utf-8")
    code, out, err = run(["parse", "-t", NAME, "--completion", "--tools", str(bad), str(answer)])
    assert code != 0 and out == "" and len(err.strip().splitlines()) == 1 and "expected a JSON list of tools" in err
