"""Soundness of the llguidance completion grammar, by sampling: random walks
under the real matcher, each a completion the grammar admits, must parse
strictly and give tool calls whose arguments fit their tools' schemas.

A walk picks, at each step, uniformly among the tokens the matcher allows
(``compute_logit_bias``), now and then only among the tokens of digits and
exponents (so that numbers grow long and exponents large, where a bound on
them is missing); past a step budget it prefers the tokens that end things
(special tokens, quotes, closing brackets), so every walk ends in a bounded
number of steps. Walks per run: ``WALKS`` per example, so at least 200 under
the ``ci`` profile (100 examples) and 10,000 under ``fuzz`` (5,000). What the
grammar's header states it admits beyond a strict parse is told apart
(:func:`stated`) and allowed; anything else fails.

The vocabulary is small (a BPE trained here, the K3 markers added as special
tokens) so that masks are cheap; the ``load`` run repeats it on the real
129k-id vocabulary.
"""

from __future__ import annotations

import json
import os
import random
import re
import tempfile
from dataclasses import dataclass
from functools import cache
from typing import Any

import jsonschema
import llguidance
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xtml
from tests.helpers.json_schemas import objects
from tests.helpers.tokenizers import k3_vocab

K3 = xtml.load("kimi-k3")
WALKS = 2
BUDGET = 120
"""Steps a walk takes at random before it prefers ending tokens."""
MAX_STEPS = 3000
ENDING = set('"}]')
NUMERIC = re.compile(r"[0-9eE+.-]+")


@cache
def tiny_vocab() -> xtml.Vocabulary:
    """A byte-level BPE trained on markup and JSON, with the K3 markers as
    special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<unk>"])
    names = " ".join(K3.dialect.names.values())
    corpus = [names, 'argument key="a" type="number"', 'call tool="f" index="1"', 'json type="object"',
              '{"x": 1.5e-07, "y": [true, false, null], "z": "\\u00e9"}', "-0.25E+300 12345678901234567890",
              "hello world, the quick brown fox"] * 40
    tok.train_from_iterator(corpus, trainer)
    path = os.path.join(tempfile.mkdtemp(), "tokenizer.json")
    tok.save(path)
    return xtml.load_tokenizer(path, add_special_tokens=K3.markers.all())


@cache
def lltok(big: bool) -> llguidance.LLTokenizer:
    v = k3_vocab() if big else tiny_vocab()
    end = K3.bind(v).marker_ids[K3.markers.end]
    return llguidance.LLTokenizer(v.tokenizer.to_str(), eos_token=end)


@cache
def numerals(big: bool) -> frozenset[int]:
    """Ids spelled by digits, signs, points and exponent letters only."""
    v = k3_vocab() if big else tiny_vocab()
    special = v.special_ids()
    return frozenset(i for i in range(v.tokenizer.get_vocab_size())
                     if i not in special and NUMERIC.fullmatch(v.decode([i])))


@cache
def enders(big: bool) -> frozenset[int]:
    """Ids that end a piece of the completion: the special tokens but the
    open marker, and tokens spelled by one character that closes a string,
    an array or an object."""
    v = k3_vocab() if big else tiny_vocab()
    # Not the open marker: it starts another call or argument.
    out = set(v.special_ids()) - {K3.bind(v).marker_ids[K3.markers.open]}
    size = v.tokenizer.get_vocab_size()
    for i in range(size):
        s = v.decode([i])
        if len(s) == 1 and s in ENDING:
            out.add(i)
    return frozenset(out)


# -- requests ---------------------------------------------------------------------------


@dataclass
class Case:
    request: dict[str, Any]
    schemas: dict[str, Any]
    thinking: bool


@st.composite
def cases(draw: st.DrawFn) -> Case:
    tools = draw(st.dictionaries(st.sampled_from(["f", "g_1", "h"]), objects(), min_size=1, max_size=2))
    thinking = draw(st.booleans())
    request: dict[str, Any] = {
        "messages": [{"role": "user", "content": "go"}], "thinking": thinking,
        "tools": [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in tools.items()],
        "tool_choice": draw(st.sampled_from(["auto", "required"]))}
    if draw(st.integers(0, 3)) == 0:
        request["response_format"] = {"type": "json_schema", "json_schema": {"name": "r", "schema": draw(objects())}}
    return Case(request, tools, thinking)


# -- walks ------------------------------------------------------------------------------


def walk(m: llguidance.LLMatcher, rng: random.Random, eos: int, ending: frozenset[int],
         numeric: frozenset[int] = frozenset()) -> list[int]:
    """A completion the matcher admits, token by token."""
    ids: list[int] = []
    for step in range(MAX_STEPS):
        bias = m.compute_logit_bias()
        allowed = [i for i, b in enumerate(bias) if b]
        assert allowed, f"nothing allowed after {ids}: {m.get_error()}"
        r = rng.random()
        if step >= BUDGET or r < 0.2:
            closing = [i for i in allowed if i in ending]
            allowed = closing or allowed
        elif r < 0.5:
            digits = [i for i in allowed if i in numeric]
            allowed = digits or allowed
        t = rng.choice(allowed)
        if t == eos and m.is_accepting():
            return [*ids, t]
        assert m.consume_token(t), f"the matcher refused the token it allowed, {t}, after {ids}: {m.get_error()}"
        ids.append(t)
        if m.is_stopped():
            return ids
    raise AssertionError(f"a walk did not end within {MAX_STEPS} steps: {ids[-60:]}")


def stated(case: Case, error: str) -> bool:
    """Whether a strict parse refused what the grammar's header states it
    admits: a key the schema does not list given twice (no context-free
    grammar keeps any number of keys apart)."""
    twice = re.search(r"argument '(.*)' given twice", error)
    if twice:
        listed = {k for s in case.schemas.values() for k in s.get("properties", {})}
        return twice.group(1) not in listed
    return False


def unsound(case: Case, ids: list[int], v: xtml.Vocabulary) -> str | None:
    """Why the completion is not one xtml reads strictly with arguments of
    the tools' schemas; None when it is."""
    try:
        msg = K3.parse(ids, v, completion=True, thinking=case.thinking)
    except xtml.ParseError as e:
        return None if stated(case, str(e)) else f"strict parse: {e}"
    for call in msg.get("tool_calls") or []:
        fn = call["function"]
        args = fn["arguments"]
        if isinstance(args, str):
            args = json.loads(args)
        try:
            jsonschema.validate(args, case.schemas[fn["name"]])
        except jsonschema.ValidationError as e:
            return f"arguments of {fn['name']!r}: {e.message}"
    return None


def run_walks(case: Case, seed: int, big: bool) -> int:
    """Walks the case's grammar from ``seed``; how many walks ended."""
    v = k3_vocab() if big else tiny_vocab()
    grammar = K3.completion_grammar(case.request, v)
    eos = K3.bind(v).marker_ids[K3.markers.end]
    for k in range(WALKS):
        m = llguidance.LLMatcher(lltok(big), grammar, log_level=0)
        assert not m.is_error(), m.get_error()
        ids = walk(m, random.Random(seed * WALKS + k), eos, enders(big), numerals(big))
        why = unsound(case, ids, v)
        assert why is None, f"{why}\ncompletion: {v.decode(ids)!r}\nrequest: {json.dumps(case.request)}"
    return WALKS


def sample(big: bool, examples: int) -> None:
    walks = 0

    @settings(max_examples=examples)
    @given(cases(), st.integers(0, 2**32))
    def run(case: Case, seed: int) -> None:
        nonlocal walks
        walks += run_walks(case, seed, big)

    run()
    assert walks >= WALKS * examples, f"only {walks} walks"


def test_sampled_completions_parse_and_fit_the_schemas() -> None:
    sample(False, settings().max_examples)


@pytest.mark.load
def test_sampled_completions_on_the_real_vocabulary() -> None:
    sample(True, 50)


# -- walks found before numbers were bounded ------------------------------------------

CALL = ('<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|>{body}<|close|>call<|sep|>'
        "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>")
BLOCK = '<|open|>json type="object"<|sep|>{json}<|close|>json<|sep|>'
ARG = '<|open|>argument key="{key}" type="object"<|sep|>{json}<|close|>argument<|sep|>'
ANY_AND_NULL = {"type": "object", "properties": {"a_": {}, "b__": {"type": "null"}}, "required": ["b__"],
                "additionalProperties": False}
NESTED = {"type": "object", "properties": {"_k": {"type": "object", "properties": {"aak": {"type": "number"}, "_": {}},
                                                  "required": ["aak", "_"]}}, "additionalProperties": False}
BOUNDED = {"type": "object", "properties": {"aka": {"type": "number", "minimum": -3},
                                            "i": {"type": "array", "items": {"type": "integer", "maximum": 9}}}}


@pytest.mark.parametrize(("params", "body", "good", "bad"), [
    # Walks of random sampling that a strict parse refused (shortened).
    (ANY_AND_NULL, BLOCK, '{"a_"\t :1278,"b__": null}', '{"a_"\t :12783001234123407257E0734556,"b__": null}'),
    (NESTED, ARG.replace("{key}", "_k"), '{"aak":3.456e37,"_":[]}', '{"aak":345678400e3490079009676425,"_":[]}'),
    (BOUNDED, BLOCK, '{"aka": 9.0123456789034E+25}', '{"aka": 90123456789034E12345678}'),
    # What else Python's JSON reads as an infinity or does not convert.
    (ANY_AND_NULL, BLOCK, '{"a_": [1e-400], "b__": null}', '{"a_": [1e400], "b__": null}'),
    (ANY_AND_NULL, BLOCK, '{"a_": {"x": -1' + "0" * 4299 + '}, "b__": null}',
     '{"a_": {"x": -1' + "0" * 4300 + '}, "b__": null}'),
    (BOUNDED, BLOCK, '{"aka": ' + "9" * 308 + '.5}', '{"aka": ' + "9" * 309 + ".5}"),
    (BOUNDED, BLOCK, '{"i": [-1' + "0" * 4299 + "]}", '{"i": [-1' + "0" * 4300 + "]}"),
])
def test_completions_a_strict_parse_refuses_are_refused(params: dict[str, Any], body: str, good: str,
                                                         bad: str) -> None:
    """The JSON of a json block, or of an object argument, whose schema has
    constraints of its own: a number Python's JSON reads as an infinity or
    does not convert is refused by the grammar, where the same completion
    with a number it reads back is taken."""
    v = tiny_vocab()
    request = {"messages": [{"role": "user", "content": "go"}], "thinking": False, "tool_choice": "required",
               "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}]}
    grammar = K3.completion_grammar(request, v)
    for text, ok in ((good, True), (bad, False)):
        ids = spelled(CALL.replace("{body}", body.replace("{json}", text)), v)
        m = llguidance.LLMatcher(lltok(False), grammar, log_level=0)
        taken = m.try_consume_tokens(ids)
        if ok:
            K3.parse(ids, v, completion=True, thinking=False)
            assert taken == len(ids) and m.is_accepting(), m.get_error()
        else:
            with pytest.raises(xtml.ParseError, match="not standard"):
                K3.parse(ids, v, completion=True, thinking=False)
            assert taken < len(ids), "the grammar took a completion a strict parse refuses"


def spelled(text: str, v: xtml.Vocabulary) -> list[int]:
    """Ids of ``text``: its marker spellings as the markers' tokens."""
    markers = re.compile("|".join(re.escape(m) for m in K3.markers.all()))
    ids: list[int] = []
    pos = 0
    for mt in markers.finditer(text):
        if mt.start() > pos:
            ids += v.ids_of([text[pos:mt.start()]])[0]
        marker = v.special_id(mt.group())
        assert marker is not None
        ids.append(marker)
        pos = mt.end()
    return ids + (v.ids_of([text[pos:]])[0] if pos < len(text) else [])
