"""The cost of gpt-oss's tool declaration, counted: render writes the
tools' namespace and reads it back (to report tools that read back as
others), and a client sends the same tools with every request, so a
namespace is made once per content of the tools and read once per text,
each reading still handing out its own tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import xtml
from xtml.plugins import typescript
from xtml.plugins.typescript import TypeScriptNamespace
from xtml.template import LayoutTemplate

FILE = Path(xtml.__file__).resolve().parent / "dialects" / "gpt-oss.toml"

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "description": "Where."},
                                     "days": {"type": "number", "default": 3}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "noop", "description": "Nothing."}}]


def test_a_namespace_is_made_and_read_once_per_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    tpl = xtml.load(str(FILE))
    assert isinstance(tpl, LayoutTemplate)
    declare, read = TypeScriptNamespace.declare, typescript.read_namespace
    made: list[Any] = []
    texts: list[str] = []

    def counted_declare(self: TypeScriptNamespace, tools: Any) -> str:
        made.append(tools)
        return declare(self, tools)

    def counted_read(text: str) -> list[dict[str, Any]]:
        texts.append(text)
        return read(text)

    monkeypatch.setattr(TypeScriptNamespace, "declare", counted_declare)
    monkeypatch.setattr(typescript, "read_namespace", counted_read)
    tools = json.loads(json.dumps(TOOLS).replace("Weather.", "Weather, once."))
    req = {"messages": [{"role": "user", "content": "q"}], "tools": tools}
    first = tpl.render(req)
    assert len(made) == 1 and len(texts) == 1
    again = tpl.render(json.loads(json.dumps(req)))
    assert (again.text, again.dropped) == (first.text, first.dropped)
    assert len(made) == 1 and len(texts) == 1
    # Each reading is its own: changing one changes no other.
    got = typescript.syntax.declared(texts[0])
    got[0]["function"]["parameters"]["properties"].clear()
    assert typescript.syntax.declared(texts[0]) == read(texts[0])
    # The same list changed in place is other tools: declared and read again.
    tools[0]["function"]["description"] = "Weather, twice."
    assert "Weather, twice." in tpl.render(req).text
    assert len(made) == 2 and len(texts) == 2
