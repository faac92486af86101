"""The GBNF export (llama.cpp's own grammar syntax): its text (markers as
token ids, rule names GBNF takes, typed arguments, what it cannot express in
the header), and, against a real llama-server built without llguidance,
that the server takes it and that the ids it generates under it (a random
tiny model, nudged by logit biases toward the markers) are what the request
allows once xtml parses them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import xtml
from tests.helpers.llamacpp import K3, Engine, gateway, started
from tests.helpers.serve import CALC, REQUEST, SEARCH
from tests.helpers.tokenizers import tiny_tokenizer_json
from xtml.codec.completion import completion_plan

MARKERS = K3.markers


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> xtml.Vocabulary:
    return xtml.load_tokenizer(tiny_tokenizer_json(str(tmp_path_factory.mktemp("tok"))),
                               add_special_tokens=MARKERS.all())


def _grammar(vocab: xtml.Vocabulary, **extra: Any) -> str:
    return K3.completion_grammar({**REQUEST, **extra}, vocab, format="gbnf")


def _rules(g: str) -> dict[str, str]:
    return dict(line.split(" ::= ", 1) for line in g.splitlines() if line and not line.startswith("#"))


def _literals(body: str) -> list[str]:
    return [json.loads(x) for x in re.findall(r'"(?:[^"\\]|\\.)*"', body) if "\\x" not in x]


def test_markers_are_token_ids_and_rule_names_are_gbnfs(vocab: xtml.Vocabulary) -> None:
    g = _grammar(vocab, tool_choice="required")
    ids = K3.bind(vocab).marker_ids
    rules = _rules(g)
    # llama-grammar.cpp's names: letters, digits and "-".
    assert all(re.fullmatch(r"[A-Za-z0-9-]+", name) for name in rules)
    assert rules["root"].endswith(f'<[{ids[MARKERS.close]}]> "message" <[{ids[MARKERS.sep]}]> '
                                  f"(<[{ids[MARKERS.end]}]>)?")
    for m in MARKERS.all():
        assert all(m not in lit for body in rules.values() for lit in _literals(body)), m
    refs = {int(x) for x in re.findall(r"<\[(\d+)\]>", g)}
    assert refs == {ids[MARKERS.open], ids[MARKERS.close], ids[MARKERS.sep], ids[MARKERS.end]}
    assert "Token(" not in g and "ExcludeToken" not in g
    # A key the schema does not list ("search" allows them) is attribute
    # text that spells no marker either.
    free = next(body for name, body in rules.items() if name.startswith("arg-t0-x"))
    assert "attr-0" in free and '[^"&]' not in g


def test_text_spells_no_marker(vocab: xtml.Vocabulary) -> None:
    # The automaton's states: from the start only "<" leads on, and each
    # marker's last character is missing where the rest of it was read.
    rules = _rules(_grammar(vocab))
    assert rules["text-s0"] == '"" | "<" text-s1 | [^<] text-s0'
    prefixes = sorted({m[:k] for m in MARKERS.all() for k in range(len(m))}, key=lambda p: (len(p), p))
    for m in MARKERS.all():
        state = f"text-s{prefixes.index(m[:-1])}"
        assert f'"{m[-1]}"' not in rules[state]
        assert "[^" in rules[state] and m[-1] in rules[state].rsplit("[^", 1)[1].split("]")[0]


def test_tool_choice_and_arguments(vocab: xtml.Vocabulary) -> None:
    g = _grammar(vocab, tool_choice={"type": "function", "function": {"name": "calc"}})
    assert '"calc\\" index=\\"1\\""' in g and "search" not in g.split("\n", 1)[1].replace("'search'", "")
    none = _grammar(vocab, tool_choice="none")
    assert "ch-tools" not in none and "tools none" in none.splitlines()[0]
    # An enum is its values; a required key is in every way to close the call.
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "n": {"type": "integer"}},
        "required": ["unit"], "additionalProperties": False}}}
    rules = _rules(K3.completion_grammar({"messages": [{"role": "user", "content": "hi"}], "tools": [tool],
                                          "tool_choice": "required"}, vocab, format="gbnf", json_fallback=False))
    assert rules["arg-t0-0"].startswith(f"<[{K3.bind(vocab).marker_ids[MARKERS.open]}]> ")
    assert '("c" | "f")' in rules["arg-t0-0"] and 'unit\\" type=\\"" "string' in rules["arg-t0-0"]
    # args-t0-MASK: the keys given so far (bit 0: "unit", required); the
    # call closes only once "unit" was given.
    close = f'<[{K3.bind(vocab).marker_ids[MARKERS.close]}]> "call"'
    assert [close in rules[f"args-t0-{mask}"] for mask in range(4)] == [False, True, False, True]
    assert "arg-t0-0" not in rules["args-t0-1"] and "arg-t0-1" not in rules["args-t0-2"]


def test_what_gbnf_cannot_express_is_in_the_header(vocab: xtml.Vocabulary) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "pattern": "^x"}},
                                         **{f"k{i}": {"type": "integer"} for i in range(8)}}}}}
    g = K3.completion_grammar({"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}, vocab,
                              format="gbnf")
    limits = [line for line in g.splitlines() if line.startswith("# limit: ")]
    assert "# limit: pattern in JSON values is not enforced" in limits
    assert any("9 arguments are more than 6" in x for x in limits)
    assert g.startswith("# xtml completion grammar (gbnf)") and "GBNF cannot express" in g


def test_gbnf_needs_the_tokenizer_and_its_own_plan(vocab: xtml.Vocabulary) -> None:
    from xtml.codec.completion import gbnf

    with pytest.raises(xtml.TokenizerError, match="pass the tokenizer"):
        K3.completion_grammar(REQUEST, format="gbnf")
    with pytest.raises(xtml.OptionError, match="spelled for xgrammar, not gbnf"):
        gbnf.write(completion_plan(K3.dialect, K3.bind(vocab), REQUEST, format="xgrammar"))


def test_export_grammar_gbnf(tmp_path: Path, vocab: xtml.Vocabulary) -> None:
    from tests.helpers.cli import run

    path = tmp_path / "req.json"
    path.write_text(json.dumps({**REQUEST, "tool_choice": "required"}))
    code, _, err = run(["export", "grammar", str(path), "--format", "gbnf"])
    assert code == 2 and "needs --tokenizer" in err
    tok = tmp_path / "tok.json"
    vocab.tokenizer.save(str(tok))
    code, out, err = run(["export", "grammar", str(path), "--format", "gbnf", "--tokenizer", str(tok)])
    assert code == 0, err
    assert out == _grammar(vocab, tool_choice="required")


# -- a real llama-server -----------------------------------------------------------------

MAX_TOKENS = 160


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    yield from started(tmp_path_factory, "llamacpp-gbnf")


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[openai.OpenAI]:
    yield from gateway(engine)


def _bias(engine: Engine, weights: dict[str, int]) -> dict[str, int]:
    """Logit biases by marker (open, close) or byte: a random model then
    closes what it may close, or opens what it may open, soon."""
    ids = K3.bind(engine.vocab).marker_ids
    byte_id = {b: i for i, b in enumerate(engine.vocab.byte_table()) if b is not None and len(b) == 1}
    return {str(ids[getattr(MARKERS, k)] if k in ("open", "close") else byte_id[k.encode()]): w
            for k, w in weights.items()}


# JSON ends soon: no whitespace, and its strings and objects close.
JSON_SOON = {'"': 50, "}": 40, " ": -100, "\n": -100, "\t": -100, "\r": -100}
def _closed(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    return {**tool, "function": {**fn, "parameters": {**fn["parameters"], "additionalProperties": False}}}


# Keys the schemas do not list are refused, so that a key is one of the
# listed ones (a random model would write an unlisted key on and on).
TOOLS = [_closed(SEARCH), _closed(CALC)]
CASES: dict[str, tuple[dict[str, Any], dict[str, int]]] = {
    "required": ({"tools": TOOLS, "tool_choice": "required"}, {"close": 100, **JSON_SOON}),
    "named": ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "calc"}}},
              {"close": 100, **JSON_SOON}),
    # Opening is preferred: wherever a tools channel may open, it would.
    "none": ({"tool_choice": "none"}, {"open": 100, "close": 60}),
    "json_object": ({"tools": [], "response_format": {"type": "json_object"}}, {"close": 100, **JSON_SOON}),
}


@pytest.mark.engines
@pytest.mark.parametrize("case", list(CASES))
def test_the_server_runs_the_grammar_and_its_ids_parse(engine: Engine, client: openai.OpenAI, case: str) -> None:
    extra, weights = CASES[case]
    request = {**REQUEST, **extra}
    if not request["tools"]:
        del request["tools"]
    bias = _bias(engine, weights)
    # The engine's own answer under the grammar, parsed strictly.
    grammar = K3.completion_grammar(request, engine.vocab, format="gbnf")
    d = engine.complete(K3.encode(request, engine.vocab), grammar=grammar, n_predict=MAX_TOKENS,
                        logit_bias=[[int(k), v] for k, v in bias.items()], temperature=0, seed=7)
    ids = list(d["tokens"])
    assert ids and ids[-1] == engine.end, "the answer did not end within the token limit"
    message = K3.parse(ids, engine.vocab, completion=True)
    # The gateway sends the same grammar (no 400) and its answer says the same.
    r = client.chat.completions.create(model="kimi-k3", max_tokens=MAX_TOKENS, logit_bias=bias, temperature=0,
                                       seed=7, **request)
    got = r.choices[0].message
    names = [c["function"]["name"] for c in message.get("tool_calls", ())]
    got_names = [c.function.name for c in got.tool_calls or () if c.type == "function"]
    if case == "required":
        assert names and set(names) <= {"search", "calc"}
    elif case == "named":
        assert names and set(names) == {"calc"}
    else:
        assert names == []
    if case == "none":
        # The same biases under the grammar of "auto" do open the tools
        # channel: without the grammar of "none", a call would be made.
        auto = K3.completion_grammar(REQUEST, engine.vocab, format="gbnf")
        d = engine.complete(K3.encode(REQUEST, engine.vocab), grammar=auto, n_predict=40,
                            logit_bias=[[int(k), v] for k, v in bias.items()], temperature=0, seed=7)
        table = engine.vocab.byte_table()
        assert (MARKERS.open + "tools").encode() in b"".join(table[t] for t in d["tokens"])
    if case == "json_object":
        assert isinstance(json.loads(message["content"]), dict)
        assert isinstance(json.loads(got.content or ""), dict)
    assert got_names == names


def test_gbnf_is_for_llamacpp_only(vocab: xtml.Vocabulary) -> None:
    from tests.helpers.cli import run
    from xtml.serving.gateway import Gateway

    for kind in ("vllm", "sglang"):
        with pytest.raises(xtml.OptionError, match="grammar format must be llguidance for the") as e:
            Gateway(K3, vocab, "http://127.0.0.1:1", kind=kind, grammar_format="gbnf")
        assert e.value.option == "grammar_format"
        code, _, err = run(["serve", "--backend", "http://127.0.0.1:1", "--tokenizer", "t.json", "--backend-kind",
                            kind, "--grammar-format", "gbnf"])
        assert code == 2 and "--grammar-format gbnf is llama.cpp's syntax" in err
    assert Gateway(K3, vocab, "http://127.0.0.1:1", kind="llamacpp").grammar_format == "gbnf"
    assert Gateway(K3, vocab, "http://127.0.0.1:1", kind="vllm").grammar_format == "llguidance"
    assert Gateway(K3, vocab, "http://127.0.0.1:1", kind="llamacpp",
                   grammar_format="llguidance").grammar_format == "llguidance"
