"""GLM-4.6's format as a layout dialect file, against GLM-4.6's own chat
template (``GLM-4.6.jinja`` of llama.cpp's sdist, rendered by transformers
at test time): byte-equal text wherever the official template renders, a
located refusal wherever it raises or prints a Python repr, and every field
it leaves out reported.

The file (tests/data/families/glm-4.6.toml) uses what the layout language
says for it: a head written first (``[gMASK]<sop>``), tools declared one by
one in their own turn, ``/nothink`` added to user text with thinking off,
an empty ``<think></think>`` on every answer, and arguments written as
``<arg_key>``/``<arg_value>`` pairs. No reader reads those back yet, so
parse, the stream, the grammar and the exports refuse the dialect by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.families import llama_template
from tests.helpers.family_requests import REFERENCES, family_requests, hf_render
from tests.helpers.kimi_families import REASONING_KEYS, Case, check_texts, given_reasoning
from xtml.errors import MessageError

NAME = "glm-4.6"
FILE = Path(__file__).resolve().parent / "data" / "families" / "glm-4.6.toml"


@pytest.fixture(scope="module")
def tpl() -> xtml.Template:
    return xtml.load(str(FILE))


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    ref = REFERENCES[NAME]
    template = llama_template(ref.source, ref.sha256)
    out: list[Case] = []
    for case in family_requests(NAME):
        try:
            out.append((case, hf_render(NAME, template, case), None))
        except Exception as e:  # the template's raise is the reference
            out.append((case, None, str(e)))
    return out


def glm_drops(req: dict[str, Any], opts: dict[str, Any]) -> set[tuple[int, str]]:
    """What GLM-4.6's template leaves out of a request it renders: names,
    tool_call_id, call ids, and reasoning up to the last user message."""
    msgs = req["messages"]
    last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=-1)
    out: set[tuple[int, str]] = set()
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


def test_the_file_names_its_reference(tpl: xtml.Template) -> None:
    assert tpl.dialect.reference["sha256"] == REFERENCES[NAME].sha256  # type: ignore[attr-defined]


def test_text_against_the_official_template(tpl: xtml.Template, cases: list[Case]) -> None:
    counts = check_texts(tpl, cases, glm_drops, tool_lists)
    print(NAME, counts)
    assert counts["equal"] + counts["refused"] + counts["refused_repr"] == len(cases) == 400
    assert counts["equal"] >= 300
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
    req = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}]}
    with pytest.raises(MessageError, match="as key/value pairs: give them as an object") as e:
        tpl.render(req)
    assert (e.value.index, e.value.path) == (1, "tool_calls[0].function.arguments")
    # None or empty arguments are no pairs, as the template reads them.
    req["messages"][1]["tool_calls"][0]["function"]["arguments"] = None
    assert "<tool_call>f\n</tool_call>" in tpl.render(req).text


@pytest.mark.parametrize("call", [
    lambda t, v: t.parse(t.encode({"messages": [{"role": "user", "content": "q"}]}, v), v),
    lambda t, v: t.stream(v),
    lambda t, v: t.completion_grammar({"messages": [{"role": "user", "content": "q"}]}, v),
    lambda t, v: t.normalize({"messages": [{"role": "user", "content": "q"}]}),
    lambda t, v: t.encode_training({"messages": [{"role": "user", "content": "q"}]}, v),
])
def test_what_reads_it_back_refuses_it_by_name(tpl: xtml.Template, call: Any) -> None:
    from xtml.vocab.vocabulary import byte_vocabulary

    v = byte_vocabulary(tpl.dialect.tokens)  # type: ignore[attr-defined]
    with pytest.raises(xtml.OptionError, match=r"not yet available for the layout dialect 'glm-4.6' .*arguments as "
                                               r"key/value pairs.*only render is"):
        call(tpl, v)


def test_the_jinja_export_refuses_it_by_name(tpl: xtml.Template) -> None:
    from xtml.exports.layout_jinja import layout_jinja_template

    with pytest.raises(xtml.TemplateError, match="does not write the layout field 'head' yet"):
        layout_jinja_template(tpl.dialect)  # type: ignore[arg-type]


@pytest.mark.parametrize("messages", [
    # No user message: the template shows every answer's reasoning.
    [{"role": "system", "content": "s"}, {"role": "assistant", "content": "ok", "reasoning_content": "R"}],
    [{"role": "assistant", "content": " a ", "reasoning_content": " r "}, {"role": "user", "content": "u"},
     {"role": "assistant", "content": "<think>x</think>\n\ny", "tool_calls": [
         {"type": "function", "function": {"name": "f", "arguments": {"k": [1, "é"], "s": "raw \"q\""}}}]}],
])
def test_edges_against_the_official_template(tpl: xtml.Template, messages: list[Any]) -> None:
    ref = REFERENCES[NAME]
    template = llama_template(ref.source, ref.sha256)
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
    req = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}],
           "add_generation_prompt": False}
    assert "T:" not in t.render(req).text
    assert "T:a" in t.render({**req, "messages": [req["messages"][0], {"role": "assistant", "content": "a"}]}).text
    with pytest.raises(xtml.OptionError, match="content written where it holds more than whitespace"):
        t.normalize(req)


def test_serve_refuses_it_before_anything_listens(tpl: xtml.Template, tmp_path: Path) -> None:
    from tests.helpers.cli import run
    from xtml.serving.gateway import create_app
    from xtml.vocab.vocabulary import byte_vocabulary

    v = byte_vocabulary(tpl.dialect.tokens)  # type: ignore[attr-defined]
    with pytest.raises(xtml.OptionError, match=r"renders only .*xtml serve reads answers back") as e:
        create_app(tpl, v, "http://127.0.0.1:9", kind="llamacpp")
    assert e.value.option == "template"
    tok = tmp_path / "tokenizer.json"
    v.tokenizer.save(str(tok))
    code, out, err = run(["serve", "-t", str(FILE), "--tokenizer", str(tok), "--backend", "http://127.0.0.1:9",
                          "--backend-kind", "llamacpp"])
    lines = err.strip().splitlines()
    assert code != 0 and out == "" and len(lines) == 1 and "renders only" in lines[0] and "Traceback" not in err
