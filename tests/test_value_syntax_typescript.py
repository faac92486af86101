"""The ``typescript`` value syntax (xtml/plugins/typescript.py) against
gpt-oss's own chat template (llama.cpp's sdist, rendered by transformers):
the developer message's ``namespace functions`` byte-equal to the
template's on generated tools, a located refusal wherever the template
raises, and the operations it does not have refused where asked."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xtml.plugins
from tests.helpers.value_syntaxes import GPT_OSS, hf_render, template
from xtml.errors import ParseError, RequestError
from xtml.plugins import NoOperation, ValueSyntax, load_value_syntax

T: Any = load_value_syntax("typescript")

NAMES = st.text(alphabet="abAB_", min_size=1, max_size=3)
DESC = st.text(max_size=10)
TYPES = st.sampled_from(["string", "number", "integer", "boolean", "object", "array", "null"])
JSONS = st.recursive(st.none() | st.booleans() | st.integers(-9, 9) | st.floats(-2, 2) | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=2) | st.dictionaries(NAMES, inner, max_size=2),
                     max_leaves=4)


@st.composite
def specs(draw: st.DrawFn, depth: int = 0) -> Any:
    optional: dict[str, Any] = {
        "type": TYPES | st.lists(TYPES, min_size=1, max_size=3), "description": DESC,
        "enum": st.lists(st.text(max_size=3) | st.integers(-2, 2), max_size=3), "nullable": st.booleans(),
        # A default beside an enum or a oneOf is added to text: mostly strings.
        "default": st.text(max_size=4) | JSONS, "required": st.lists(NAMES, max_size=2)}
    if depth < 2:
        optional["items"] = specs(depth + 1) | st.just({})
        optional["properties"] = st.dictionaries(NAMES, specs(depth + 1), max_size=3)
        optional["oneOf"] = st.lists(specs(depth + 1), max_size=3)
    return draw(st.fixed_dictionaries({}, optional=optional))


@st.composite
def tools(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        params = draw(st.just({}) | st.fixed_dictionaries({"type": st.just("object")}, optional={
            "properties": st.dictionaries(NAMES, specs(), max_size=4), "required": st.lists(NAMES, max_size=3)}))
        out.append({"type": "function", "function": {
            "name": draw(st.sampled_from(["f", "get_weather", "x_1"])), "description": draw(DESC),
            "parameters": params}})
    return out


def _developer(namespace: str) -> str:
    return f"<|start|>developer<|message|># Tools\n\n{namespace}<|end|><|start|>user<|message|>hi<|end|>"


def test_the_namespace_equals_the_templates() -> None:
    text = template(GPT_OSS)
    counts = {"equal": 0, "refused": 0}

    @settings(max_examples=350, deadline=None)
    @given(tools())
    def run(ts: list[dict[str, Any]]) -> None:
        try:
            out = hf_render(text, [{"role": "user", "content": "hi"}], ts)
        except (jinja2.TemplateError, TypeError) as e:
            with pytest.raises(RequestError):
                T.declare(ts)
            counts["refused"] += 1
            assert "concatenate" in str(e) or "undefined" in str(e), e
            return
        mine = T.declare(ts)
        assert out.endswith(_developer(mine)), (out, mine)
        counts["equal"] += 1

    run()
    print("typescript declarations:", counts)
    assert counts["equal"] >= 200
    assert counts["refused"] >= 5


def test_a_namespace_spelled_out() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "units": {"type": "string", "enum": ["c", "f"], "default": "c"},
            "days": {"type": "integer", "default": 3},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}, "tags": {
                "type": "array", "items": {"type": "string"}}}, "required": ["lat"]}},
        "required": ["city"]}}}
    assert T.declare([tool]) == (
        "## functions\n\nnamespace functions {\n\n// Weather.\ntype get_weather = (_: {\n"
        "// The city\ncity: string,\n"
        'units?: "c" | "f", // default: c,\n'
        "days?: number, // default: 3,\n"
        "where?: {\nlat: \n                number, tags?: \n                string[]},\n"
        "}) => any;\n\n} // namespace functions")


def test_where_the_template_raises_declare_says_where() -> None:
    cases = [
        ({"name": "f"}, "tools[0].function.description"),
        ({"name": "f", "description": 3}, "tools[0].function.description"),
        ({"name": "f", "description": "d", "parameters": {"type": "object", "properties": {
            "u": {"type": "string", "enum": ["a"], "default": 1}}}},
         "tools[0].function.parameters.properties.u.default"),
    ]
    text = template(GPT_OSS)
    for fn, where in cases:
        ts = [{"type": "function", "function": fn}]
        with pytest.raises((jinja2.TemplateError, TypeError)):
            hf_render(text, [{"role": "user", "content": "hi"}], ts)
        with pytest.raises(RequestError) as e:
            T.declare(ts)
        assert e.value.location == where


def test_it_declares_and_reads_declarations_only() -> None:
    assert isinstance(T, ValueSyntax) and T.name == "typescript" and "typescript" in xtml.plugins.value_syntaxes()
    assert T.operations == {"declare", "declared", "jinja"}
    calls: dict[str, Callable[[], object]] = {
        "write": lambda: T.write({}, {}), "read": lambda: T.read("{}", {}), "reader": lambda: T.reader(),
        "grammar": lambda: T.grammar({"type": "object"})}
    for op, call in calls.items():
        with pytest.raises(NoOperation) as e:
            call()
        assert e.value.location == f"value syntax 'typescript', operation {op!r}"
        assert "has no" in e.value.msg and "declare" in e.value.msg


READ_BACK = [
    {"type": "function", "function": {"name": "f", "description": "F: it does \"f\".", "parameters": {
        "type": "object", "properties": {
            "s": {"type": "string", "description": "S.", "default": "x"},
            "e": {"type": "string", "enum": ["a", "b"], "default": "a"},
            "n": {"type": "number", "nullable": False},
            "o": {"type": "object", "properties": {"k": {"type": "array", "items": {"type": "boolean"}},
                                                   "m": {"type": "object"}}, "required": ["k"]},
            "u": {"type": ["string", "number"]},
            "v": {"oneOf": [{"type": "string"}, {"type": "number"}]},
            "a": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "string"}}}},
            "z": {}},
        "required": ["s", "o"]}}},
    {"type": "function", "function": {"name": "g", "description": ""}},
]


def test_a_declaration_reads_back_as_the_tools_it_spells() -> None:
    """Tools in the plainest schema of each spelling read back as given;
    the others as that schema (integer as number, a nullable string's
    list of types as nullable)."""
    want = json.loads(json.dumps(READ_BACK))
    want[0]["function"]["parameters"]["properties"]["n"] = {"type": "number"}
    assert T.declared(T.declare(READ_BACK)) == want
    other = [{"type": "function", "function": {"name": "h", "description": "H.", "parameters": {
        "type": "object", "properties": {"i": {"type": "integer"}, "t": {"type": ["string", "null"]}},
        "required": []}}}]
    assert T.declared(T.declare(other)) == [{"type": "function", "function": {"name": "h", "description": "H.",
                                                                               "parameters": {
        "type": "object", "properties": {"i": {"type": "number"}, "t": {"type": "string", "nullable": True}}}}}]


@pytest.mark.parametrize(("text", "at"), [
    ("namespace functions {}", "namespace"),
    ("## functions\n\nnamespace functions {\n\n// d\ntype f = (_: {\nx: float,\n}) => any;\n\n} "
     "// namespace functions", "float"),
    ("## functions\n\nnamespace functions {\n\ntype f = () => any;\n\n} // namespace functions", "type f"),
])
def test_a_namespace_it_does_not_spell_is_a_located_error(text: str, at: str) -> None:
    with pytest.raises(ParseError) as e:
        T.declared(text)
    assert e.value.offset == text.index(at)
