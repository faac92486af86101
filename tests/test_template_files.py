"""Random and mutated template files load or fail with TemplateError, never anything else."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import xtml
from xtml.chat.template_file import from_dict

BASE = tomllib.loads(resources.files("xtml.dialects").joinpath("kimi-k3.toml").read_text(encoding="utf-8"))
_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=8),
                    st.lists(st.one_of(st.text(max_size=6), st.integers()), max_size=3),
                    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3))


@given(st.data())
def test_mutated_templates_load_or_refuse(data: st.DataObject) -> None:
    doc: Any = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    doc["system"] = {k: dict(v) for k, v in BASE["system"].items()}
    for _ in range(data.draw(st.integers(1, 4))):
        section = data.draw(st.sampled_from(sorted(doc)))
        if data.draw(st.booleans()) and isinstance(doc[section], dict) and doc[section]:
            key = data.draw(st.sampled_from(sorted(doc[section])))
            op = data.draw(st.sampled_from(["delete", "replace"]))
            if op == "delete":
                del doc[section][key]
            else:
                doc[section][key] = data.draw(_values)
        else:
            doc[section] = data.draw(_values)
    try:
        t = xtml.Template(from_dict(doc, "mutated"))
    except xtml.TemplateError:
        return
    rich = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
                {"type": "text", "text": "hi"}, {"type": "image"}]},
             {"role": "assistant", "reasoning_content": "r", "content": "a", "tool_calls": [
                 {"id": "1", "function": {"name": "f", "arguments": {"x": 1, "y": "z"}}}]},
             {"role": "tool", "tool_call_id": "1", "content": "ok"}],
            "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}
    for thinking in (True, False):
        try:
            text = t.render(rich, thinking=thinking).text
        except xtml.XtmlError:
            continue
        try:
            t.parse(text)
        except xtml.XtmlError:
            pass
        t.parse(text, lenient=True)


@given(st.text(max_size=200))
def test_random_files_load_or_refuse(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    path = Path(tmp_path_factory.mktemp("tpl")) / "t.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(xtml.TemplateError):
        xtml.load(str(path))
