"""The ``gemma`` value syntax (xtml/plugins/gemma_values.py) against Gemma
4's own chat template (llama.cpp's sdist, rendered by transformers):
declarations and call arguments byte-equal to the template's macros on
generated schemas and arguments; arguments read back as written; the
llguidance fragment sound under random walks and complete on written
values; the stream reader equal to ``read`` in every chunking; bad text
located."""

from __future__ import annotations

import ast
import itertools
import json
import random
import subprocess
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xtml.plugins
from tests.helpers.gemma_grammar import gbnf_lark
from tests.helpers.need import need
from tests.helpers.value_syntaxes import GEMMA, QUOTE, TEXT, hf_render, objects, takes, template, values, walk
from xtml.errors import ParseError, RequestError
from xtml.plugins import NoOperation, ValueSyntax, load_value_syntax

G: Any = load_value_syntax("gemma")
COUNTS: dict[str, int] = {}

# -- declarations, as the template's format_function_declaration writes them --------------------

NAMES = st.text(alphabet="abAB_k", min_size=1, max_size=3) | st.sampled_from(
    ["type", "description", "properties", "required", "nullable", "items", "enum", "a", "A"])
DESC = st.text(max_size=8).filter(lambda s: QUOTE not in s)
TYPES = st.sampled_from(["string", "STRING", "number", "integer", "boolean", "array", "object", "Object", "null"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(-3, 3), DESC)


def _props(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(NAMES, _prop(depth), max_size=4)


@st.composite
def _items(draw: st.DrawFn, depth: int) -> dict[str, Any]:
    optional: dict[str, Any] = {
        "type": TYPES | st.lists(TYPES, max_size=2), "required": st.lists(NAMES, max_size=2), "description": DESC,
        "enum": st.lists(DESC | st.integers(-2, 2), max_size=2), "items": st.just({"type": "string"}),
        "maxItems": st.integers(0, 3), "nullable": st.none()}
    if depth < 2:
        optional["properties"] = _props(depth + 1)
    return draw(st.fixed_dictionaries({}, optional=optional))


@st.composite
def _prop(draw: st.DrawFn, depth: int) -> Any:
    optional: dict[str, Any] = {
        "description": DESC, "type": TYPES | st.lists(TYPES, max_size=2),
        "enum": st.lists(DESC | st.integers(), max_size=3),
        "nullable": st.booleans(), "required": st.lists(NAMES, max_size=2), "default": SCALARS,
        "minimum": st.integers(), "additionalProperties": st.booleans()}
    if depth < 2:
        optional["items"] = _items(depth)
        optional["properties"] = _props(depth + 1)
    return draw(st.fixed_dictionaries({}, optional=optional) | st.sampled_from([True, "x", 3]))


@st.composite
def tools(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for _ in range(draw(st.integers(1, 2))):
        params = draw(st.just({}) | st.fixed_dictionaries({}, optional={
            "type": st.sampled_from(["object", "OBJECT"]), "properties": _props(0),
            "required": st.lists(NAMES, max_size=3)}))
        fn = draw(st.fixed_dictionaries({"name": st.sampled_from(["f", "get_weather", "x_1"])}, optional={
            "description": DESC, "parameters": st.just(params),
            "response": st.fixed_dictionaries({}, optional={"description": DESC,
                                                            "type": st.sampled_from(["object", "string"])})}))
        out.append({"type": "function", "function": fn})
    return out


def _frame(declared: str) -> str:
    return f"<bos><|turn>system\n{declared}<turn|>\n<|turn>user\nhi<turn|>\n"


def test_declarations_equal_the_templates() -> None:
    text = template(GEMMA)
    done = 0

    @settings(max_examples=300, deadline=None)
    @given(tools())
    def run(ts: list[dict[str, Any]]) -> None:
        nonlocal done
        out = hf_render(text, [{"role": "user", "content": "hi"}], ts, bos_token="<bos>")
        assert out == _frame(G.declare(ts))
        done += 1

    run()
    COUNTS["declarations"] = done
    print("gemma declarations compared:", done)
    assert done >= 200


def test_a_declaration_spelled_out() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                         "units": {"type": "string", "enum": ["c", "f"]},
                                         "Days": {"type": "integer"}},
        "required": ["city"]}}}
    assert G.declare([tool]) == (
        '<|tool>declaration:get_weather{description:<|"|>Weather.<|"|>,parameters:{properties:{'
        'city:{description:<|"|>The city<|"|>,type:<|"|>STRING<|"|>},Days:{type:<|"|>INTEGER<|"|>},'
        'units:{enum:[<|"|>c<|"|>,<|"|>f<|"|>],type:<|"|>STRING<|"|>}},required:[<|"|>city<|"|>],'
        'type:<|"|>OBJECT<|"|>}}<tool|>')


# -- call arguments, as the template writes a call --------------------------------------------------

WRITABLE_KEYS = st.text(st.characters(codec="utf-8", exclude_characters=":,{}[]"), max_size=4).filter(
    lambda k: QUOTE not in k)
ARGS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(WRITABLE_KEYS, inner, max_size=3), max_leaves=8)


def test_arguments_equal_the_templates() -> None:
    text = template(GEMMA)
    done = 0

    @settings(max_examples=300, deadline=None)
    @given(st.dictionaries(WRITABLE_KEYS, ARGS, max_size=4))
    def run(args: dict[str, Any]) -> None:
        nonlocal done
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": args}}]}]
        out = hf_render(text, messages, None, bos_token="<bos>")
        assert out == f"<bos><|turn>user\nhi<turn|>\n<|turn>model\n<|tool_call>call:f{G.write(args, {})}" \
                      "<tool_call|><|tool_response>"
        done += 1

    run()
    COUNTS["arguments"] = done
    print("gemma arguments compared:", done)
    assert done >= 200


def test_arguments_spelled_out() -> None:
    args = {"city": "Paris", "days": 3, "b": True, "n": None, "x": 1.5, "big": 1e16, "tiny": 1e-05,
            "list": [1, "a", {"K": False}], "A": {}}
    assert G.write(args, {}) == ('{A:{},b:true,big:1e+16,city:<|"|>Paris<|"|>,days:3,list:[1,<|"|>a<|"|>,'
                                 '{K:false}],n:None,tiny:1e-05,x:1.5}')


# -- reading --------------------------------------------------------------------------------------


def _typed(x: Any) -> Any:
    """``x`` with every scalar's type beside it: True is not 1, 1.0 not 1."""
    if isinstance(x, dict):
        return {k: _typed(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_typed(v) for v in x]
    return (type(x).__name__, repr(x))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_read_gives_back_what_write_wrote(data: st.DataObject) -> None:
    s = data.draw(objects())
    v = data.draw(values(s))
    jsonschema.validate(v, s)
    assert _typed(G.read(G.write(v, s), s)) == _typed(v)


def test_a_bare_word_where_the_schema_says_string_is_that_string() -> None:
    s = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"},
                                          "u": {"enum": ["c", "f"]}}}
    assert G.read("{city:5,n:5,u:c}", s) == {"city": "5", "n": 5, "u": "c"}
    assert G.read('{city:<|"|>5<|"|>,n:5}', s) == {"city": "5", "n": 5}
    with pytest.raises(ParseError) as e:
        G.read("{city:Paris,n:five}", s)
    assert e.value.offset == 14


BAD = [
    ("", 0), ("x", 0), ("{", 1), ("{a", 2), ("{a:", 3), ("{a:1", 4), ("{a:1,", 5), ("{a:x}", 3), ("{a:1]", 4),
    ("{a:1}x", 5), ('{a:<|"|>x', 3), ("{a:[1}", 5), ("{a:{b:1}", 8), ("{a:1e999}", 3), ("{a:--1}", 3),
    ('{a<|"|>:1}', 2), ("{a:[1,]}", 6), ("{,}", 1), ("{a:1,,b:2}", 5), ("{a:1}}", 5), ("\n{a:1}", 0),
    ("{a:\n@}", 3),
]


@pytest.mark.parametrize(("text", "offset"), BAD)
def test_bad_text_is_located(text: str, offset: int) -> None:
    with pytest.raises(ParseError) as e:
        G.read(text, {})
    assert e.value.offset == offset, e.value
    assert e.value.line is not None and e.value.column is not None
    # The stream reader finds the same error, however the text comes.
    for size in (1, 2, 3, len(text) or 1):
        r = G.reader({})
        with pytest.raises(ParseError) as e2:
            for i in range(0, len(text), size):
                r.feed(text[i:i + size])
            r.close()
        assert e2.value.offset == offset, (size, e2.value)


def _cuts(n: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, n), max_size=8).map(sorted)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_stream_reader_equals_read_in_every_chunking(data: st.DataObject) -> None:
    s = data.draw(objects())
    v = data.draw(values(s))
    text = G.write(v, s)
    cuts = data.draw(_cuts(len(text)))
    bounds = [0, *cuts, len(text)]
    r = G.reader(s)
    pairs: list[tuple[str, Any]] = []
    # Where each pair's text ends: a pair is given once the ',' or '}'
    # after it has come.
    ends, at = [], 1
    for k, x in G.read(text, s).items():
        at += len(G.write({k: x}, {})) - 2
        ends.append(at)
        at += 1
    for a, b in itertools.pairwise(bounds):
        pairs += r.feed(text[a:b])
        assert len(pairs) == sum(1 for e in ends if e < b)
    pairs += r.close()
    assert pairs == list(G.read(text, s).items())


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_stream_reader_and_read_agree_on_damaged_text(data: st.DataObject) -> None:
    s = data.draw(objects())
    text = G.write(data.draw(values(s)), s)
    i = data.draw(st.integers(0, len(text)))
    text = text[:i] + data.draw(st.sampled_from(["", ",", "}", "]", "<|", '"', "{", ":", "x"])) + \
        text[i + data.draw(st.integers(0, 3)):]
    try:
        want: Any = G.read(text, s)
    except ParseError as e:
        assert 0 <= e.offset <= len(text)
        want = ("error", e.offset)
    size = data.draw(st.integers(1, 6))
    r = G.reader(s)
    try:
        got: Any = []
        for j in range(0, len(text), size):
            got += r.feed(text[j:j + size])
        got = dict(got + r.close())
    except ParseError as e:
        got = ("error", e.offset)
    assert got == want


def test_what_cannot_be_written_is_refused_where_it_is() -> None:
    for args, where in [({"a": f"x{QUOTE}y"}, "arguments.a"), ({"a": [1, {"b:c": 1}]}, 'arguments.a[1]["b:c"]'),
                        ({"a": float("nan")}, "arguments.a"), ({"k": {"x": object()}}, "arguments.k.x")]:
        with pytest.raises(RequestError) as e:
            G.write(args, {})
        assert e.value.location == where
    with pytest.raises(RequestError) as e:
        G.declare([{"type": "function", "function": {"name": "f", "description": f"a {QUOTE} b"}}])
    assert e.value.location == "tools[0].function.description"


# -- the grammar ----------------------------------------------------------------------------------

WALKS = 2


def _grammar(s: dict[str, Any], syntax: str) -> str:
    """The arguments' grammar in ``syntax`` as llguidance's Lark (GBNF through
    llguidance's converter), a text of them its whole language."""
    if syntax == "gbnf":
        return gbnf_lark("root ::= args\n" + G.grammar(s, "gbnf", "args"))
    lark: str = G.grammar(s)
    return "start: arguments\n" + lark


@pytest.mark.parametrize("syntax", ["llguidance", "gbnf"])
def test_walks_read_back_valid(syntax: str) -> None:
    done = 0

    @settings(max_examples=220, deadline=None)
    @given(objects(), st.integers(0, 2**32))
    def run(s: dict[str, Any], seed: int) -> None:
        nonlocal done
        grammar = _grammar(s, syntax)
        for k in range(WALKS):
            text = walk(grammar, random.Random(seed * WALKS + k))
            try:
                got = G.read(text, s)
            except ParseError as e:
                raise AssertionError(f"{e}\ntext: {text!r}\nschema: {json.dumps(s)}") from None
            try:
                jsonschema.validate(got, s)
            except jsonschema.ValidationError as e:
                raise AssertionError(f"{e.message}\ntext: {text!r}\nschema: {json.dumps(s)}") from None
            done += 1

    run()
    if syntax == "llguidance":
        COUNTS["walks"] = done
    print(f"gemma walks ({syntax}):", done)
    assert done >= 400


@pytest.mark.parametrize("syntax", ["llguidance", "gbnf"])
def test_the_grammar_takes_what_write_writes(syntax: str) -> None:
    @settings(max_examples=300, deadline=None)
    @given(st.data())
    def run(data: st.DataObject) -> None:
        s = data.draw(objects())
        v = data.draw(values(s))
        grammar = _grammar(s, syntax)
        text = G.write(v, s)
        assert takes(grammar, text), f"{text!r}\n{grammar}"

    run()


_CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 3}, "n": {"type": "integer"},
                                          "x": {"type": "number", "minimum": -1.5, "exclusiveMaximum": 10}},
         "required": ["city"], "additionalProperties": False}
_GOOD = ['{city:<|"|>Rom<|"|>,n:3}', '{city:<|"|><|"|>,n:-0,x:9.99}', '{city:<|"|>a<|"|>,n:3,x:-1.5}',
         '{city:<|"|>a<|"|>,x:1e-05}', '{city:<|"|>a<|"|>,x:-0.0}', '{city:<|"|>a<|"|>,x:9.999999999999998}']
_BAD = ['{city:<|"|>Paris<|"|>}', "{n:3}", '{city:<|"|>a<|"|>,n:1.5}', '{city:<|"|>a<|"|>,m:1}',
        '{n:3,city:<|"|>a<|"|>}', "{city:Rom}", '{city:<|"|>a<|"|>b<|"|>}', '{city:<|"|>a<|"|>,x:10}',
        '{city:<|"|>a<|"|>,x:10.0}', '{city:<|"|>a<|"|>,x:-1.6}', '{city:<|"|>a<|"|>,x:-2}',
        '{city:<|"|>a<|"|>,x:1e16}', '{city:<|"|>a<|"|>,x:9.9999999999999999}']
"""Texts of arguments of :data:`_CITY` the grammar takes, and texts it
refuses (the quote spelled inside a string, a number just past a bound,
or one whose float is the bound)."""


@pytest.mark.parametrize("syntax", ["llguidance", "gbnf"])
def test_the_grammar_refuses_what_the_schema_refuses(syntax: str) -> None:
    grammar = _grammar(_CITY, syntax)
    for good in _GOOD:
        assert takes(grammar, good), good
    for bad in _BAD[:7] if syntax == "llguidance" else _BAD:
        assert not takes(grammar, bad), bad


@pytest.mark.engines
def test_xgrammar_takes_what_write_writes_and_refuses_the_rest() -> None:
    python = need("engines python", "tests/run sets it up", env="XTML_ENGINES_PYTHON")
    rng = random.Random(7)
    cases: list[tuple[str, str, bool]] = [(G.grammar(_CITY, "xgrammar", "args"), t, good)
                                          for good, texts in ((True, _GOOD), (False, _BAD)) for t in texts]

    @settings(max_examples=300, deadline=None, database=None)
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        s = data.draw(objects())
        cases.append((G.grammar(s, "xgrammar", "args"), G.write(data.draw(values(s)), s), True))

    draw()
    assert len(cases) == len(_GOOD) + len(_BAD) + 300
    rng.shuffle(cases)
    script = ("import json, sys, xgrammar as x\n"
              "out = [x.testing._is_grammar_accept_string(x.Grammar.from_ebnf('root ::= args\\n' + g), t)"
              " for g, t, _ in json.load(sys.stdin)]\n"
              "json.dump(out, sys.stdout)")
    run = subprocess.run([python, "-I", "-c", script], input=json.dumps(cases), capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    wrong = [(t, good) for (_, t, good), got in zip(cases, json.loads(run.stdout), strict=True) if got != good]
    assert not wrong, wrong


@pytest.mark.parametrize("syntax", ["gbnf", "xgrammar"])
def test_a_literal_that_spells_a_token_is_left_out(syntax: str) -> None:
    # llama.cpp would match the token's text there, and a parse read the token.
    s = {"type": "object", "properties": {"a": {"enum": ["x<turn|>", "y"]}}, "required": ["a"],
         "additionalProperties": False}
    g = G.grammar(s, syntax, "args", tokens={QUOTE: "<[9]>", "<turn|>": "<[8]>"})
    assert '"y"' in g and "turn" not in g
    assert "x<turn|>" in G.grammar(s, syntax, "args")


def test_grammar_errors_say_what_and_where() -> None:
    with pytest.raises(NoOperation) as e:
        G.grammar({"type": "object"}, syntax="peg")
    assert "'peg'" in str(e.value) and "llguidance, gbnf, xgrammar" in str(e.value)
    with pytest.raises(RequestError) as e1:
        G.grammar({"type": "object"}, syntax="gbnf", rule="args_t0")
    assert e1.value.location == "grammar(rule=...)"
    with pytest.raises(RequestError) as e2:
        G.grammar({"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}})
    assert e2.value.location == "parameters.properties.a" and "'pattern'" in e2.value.msg


# -- the door -------------------------------------------------------------------------------------


def test_found_by_its_entry_point() -> None:
    assert "gemma" in xtml.plugins.value_syntaxes()
    assert isinstance(G, ValueSyntax) and G.name == "gemma"
    assert G.operations == {"declare", "write", "read", "grammar", "reader", "jinja"}
    with pytest.raises(xtml.TemplateError) as e:
        load_value_syntax("no-such-syntax")
    assert e.value.location == "entry point xtml.value_syntaxes:no-such-syntax"


def test_the_core_names_no_value_syntax() -> None:
    """The plugins are found by entry point: no module of xtml but their own
    imports them, and they import nothing of xtml but the plugin API and the
    errors."""
    root = Path(xtml.plugins.__file__).parent.parent
    plugins = {"gemma_values", "gemma_read", "gemma_write", "gemma_jinja", "gemma_ebnf", "typescript",
               "typescript_jinja"}
    for f in root.rglob("*.py"):
        own = f.parent.name == "plugins" and f.stem in plugins
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(a.name for a in node.names)]
                if own and node.level:
                    assert node.module in ("api", "errors", *plugins), \
                        f"{f}: from {'.' * node.level}{node.module}"
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if not own:
                assert not any(n.split(".")[-1] in plugins for n in names), f"{f} imports a value syntax"


def test_a_broken_entry_point_is_a_located_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    import xtml.plugins.values as values_module

    group = values_module.GROUP
    points = [EntryPoint("missing", "no_such_module_here:syntax", group), EntryPoint("other", "json:dumps", group),
              EntryPoint("twice", "json:a", group), EntryPoint("twice", "json:b", group)]
    monkeypatch.setattr(values_module, "entry_points", lambda group: [p for p in points if p.group == group])
    for name, words in [("missing", ["failed to load", "ModuleNotFoundError", "no_such_module_here:syntax"]),
                        ("other", ["'json:dumps'", "is not a ValueSyntax named 'other'"]),
                        ("twice", ["declared twice", "'json:a'", "'json:b'"])]:
        with pytest.raises(xtml.TemplateError) as e:
            load_value_syntax(name)
        assert e.value.location == f"entry point xtml.value_syntaxes:{name}"
        assert all(w in e.value.msg for w in words), e.value.msg
