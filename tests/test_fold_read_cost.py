"""The cost of Gemma 4's reading back, counted: a tool declaration the
format has read once is not read again (a client sends the same tools with
every request, and render reads its declaration back to report what does
not read back as given), each reading still handing out its own tools; an
arguments text is read with the same Python work at 1x and 4x its length
(the syntax's own reading apart), its tokens spelled out and a failure
located from the tokens alone; a prompt's call with string arguments is
read with the same Python work at both lengths."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import xtml
from tests.helpers.kimi_families import vocabulary
from xtml.chat import layout_fold_answer, layout_fold_read
from xtml.chat.layout_fold_answer import fold_reader, read_arguments
from xtml.plugins.gemma_values import GemmaValues
from xtml.template import LayoutTemplate

FILE = Path(xtml.__file__).resolve().parent / "dialects" / "gemma-4.toml"
Q = '<|"|>'

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "units": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "noop", "description": "Nothing."}}]


@pytest.fixture(scope="module", name="tpl")
def _tpl() -> LayoutTemplate:
    t = xtml.load(str(FILE))
    assert isinstance(t, LayoutTemplate)
    return t


def _events(files: set[str], run: Callable[[], Any]) -> int:
    """Python and builtin calls made from code of ``files`` while ``run``
    runs."""
    n = 0

    def count(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal n
        if frame.f_code.co_filename in files:
            n += 1

    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
    return n


def test_a_declaration_read_once_is_not_read_again(tpl: LayoutTemplate, monkeypatch: pytest.MonkeyPatch) -> None:
    read = GemmaValues.read
    texts: list[str] = []

    def counted(self: GemmaValues, text: str, schema: Any = None) -> dict[str, Any]:
        texts.append(text)
        return read(self, text, schema)

    monkeypatch.setattr(GemmaValues, "read", counted)
    v = vocabulary(tpl)
    # Descriptions no other test declares: the first reading is this test's.
    tools = json.loads(json.dumps(TOOLS).replace("Weather.", "Weather, once.").replace("Nothing.", "Nothing, once."))
    req = {"messages": [{"role": "user", "content": "q"}], "tools": tools}
    ids = tpl.encode(req, v)
    assert len(texts) == len(tools)
    texts.clear()
    assert tpl.encode(req, v) == ids
    parsed = tpl.parse(ids, v)
    assert texts == []  # neither render's reading back nor the parse reads them again
    assert parsed == tpl.normalize(req)
    # Each reading hands out its own tools: changing one changes no other.
    parsed["tools"][0]["function"]["parameters"]["properties"].clear()
    assert tpl.parse(ids, v) == tpl.normalize(req)
    # A declaration is kept by its text: another tool is read, the same one not.
    tools[1]["function"]["description"] = "Nothing, twice."
    tpl.encode(req, v)
    assert len(texts) == 1 and "Nothing, twice." in texts[0]


def test_arguments_are_read_with_the_same_python_work_at_any_length(tpl: LayoutTemplate) -> None:
    d = tpl.layout
    f = fold_reader(d)
    (q,) = f.quotes
    files = {layout_fold_answer.__file__}
    got = []
    for n in (500, 2000):
        body = "x" * n
        good = "{a:" + q + body + q + ",b:" + q + "y" + q + "}"
        # A string never closed: the failure is at its quote, after others.
        bad = "{a:" + q + "y" + q + ",b:" + q + body
        obj, at, _ = read_arguments(d, f, good, None)
        assert obj == {"a": body, "b": "y"} and at == -1
        obj, at, why = read_arguments(d, f, bad, None)
        # Located in the lexed text, where each token before is one character.
        assert obj is None and "never closed" in why and at == bad.rindex(q)
        got.append((_events(files, partial(read_arguments, d, f, good, None)),
                    _events(files, partial(read_arguments, d, f, bad, None))))
    assert got[0] == got[1], got


def test_a_prompts_string_arguments_are_read_with_the_same_python_work_at_any_length(tpl: LayoutTemplate) -> None:
    v = vocabulary(tpl)
    files = {layout_fold_answer.__file__, layout_fold_read.__file__}
    got = []
    for n in (500, 2000):
        call = {"type": "function", "function": {"name": "get_weather",
                                                 "arguments": json.dumps({"city": "Paris " * n})}}
        req = {"messages": [{"role": "user", "content": "q"},
                            {"role": "assistant", "content": "", "tool_calls": [call]},
                            {"role": "tool", "name": "get_weather", "content": "sunny"}], "tools": TOOLS}
        ids = tpl.encode(req, v)
        assert tpl.parse(ids, v) == tpl.normalize(req)
        got.append(_events(files, partial(tpl.parse, ids, v)))
    assert got[0] == got[1], got


def test_a_declaration_is_made_once_per_content(tpl: LayoutTemplate, monkeypatch: pytest.MonkeyPatch) -> None:
    declare = GemmaValues.declare
    made: list[Any] = []

    def counted(self: GemmaValues, tools: Any) -> str:
        made.append(tools)
        return declare(self, tools)

    monkeypatch.setattr(GemmaValues, "declare", counted)
    tools = json.loads(json.dumps(TOOLS).replace("Weather.", "Weather, made once."))
    req = {"messages": [{"role": "user", "content": "q"}], "tools": tools}
    text = tpl.render(req).text
    # Render writes it and reads it back: one declaration made.
    assert len(made) == 1
    assert tpl.render(req).text == text and tpl.render(json.loads(json.dumps(req))).text == text
    assert len(made) == 1
    # The same list changed in place is other tools: declared again, as they now are.
    tools[0]["function"]["description"] = "Weather, made twice."
    assert "Weather, made twice." in tpl.render(req).text
    assert len(made) == 2


def test_tools_alike_only_in_json_are_not_the_same_content() -> None:
    from xtml.chat.layout_fold import _content

    def key(default: Any) -> Any:
        return _content([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "number", "default": default}}}}}])

    keys = [key(1), key(1.0), key(True), key(0.0), key(-0.0), key([1]), key((1,)), key("1"), key(None)]
    assert None not in keys and len(set(keys)) == len(keys)
    assert key(1) == key(1) and key([1, "a"]) == key([1, "a"])
    assert _content([{1: "x"}]) is None and _content([{"x": {1, 2}}]) is None  # not JSON's: never kept

    class Text(str):
        pass

    assert _content([{"x": Text("a")}]) is None


def test_tools_of_more_text_than_a_kept_declaration_are_not_kept() -> None:
    from xtml.chat.layout_fold import _DECLARED_TEXT, _content

    # A schema keyword the declaration does not write still counts.
    def tool(n: int) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "f", "parameters": {"examples": ["x" * n]}}}

    assert _content([tool(_DECLARED_TEXT)]) is None
    assert _content([tool(100)]) is not None
