"""The reference data the ``llama-3.1``, ``deepseek-v3.1``, ``kimi-k2`` and
``kimi-k2-thinking`` dialects are checked against: the committed renders of
the two templates the sdist does not carry as the dialects mirror them, the
sdist's own templates, and the seeded generator of the requests."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.families import llama_template
from tests.helpers.family_requests import (
    N_REQUESTS,
    REFERENCES,
    SEED,
    family_requests,
    features,
    hf_render,
)

DATA = Path(__file__).parent / "data" / "families"
COMMITTED = ("deepseek-v3.1", "kimi-k2-thinking")
SDIST = ("llama-3.1", "kimi-k2")
MIN_RENDERED = 300

PINNED = {
    "deepseek-v3.1": "7fe7159748925dc7d9e2aaeb11e4bd3121c311d8d0e3a0d6377fb8550e64c560",
    "kimi-k2-thinking": "833d0c375531149a922a0f2addf9a66cce8e4503c500fe4ca6a95e9d1ed3c75a",
    "llama-3.1": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
    "kimi-k2": "9fcc72b7c248a72020c81f70bb652f3094d18a750c93ca35dfcb3cf5fe23ff53",
}
OPTIONS = {
    "deepseek-v3.1": {"thinking", "enable_thinking"},
    "kimi-k2-thinking": set(),
    "llama-3.1": {"date_string", "tools_in_user_message", "builtin_tools"},
    "kimi-k2": set(),
}
# What every dialect's requests must cover, at least this many times each.
COVERAGE = {"tools": 50, "tool_call": 50, "parallel_calls": 40, "tool_result": 50, "tool_results_in_a_row": 30,
            "reasoning": 50, "system": 100, "no_system": 100, "text": 300, "text_parts": 20, "marker_text": 40,
            "ends:assistant": 100, "ends:user": 100, "ends:tool": 5, "generation_prompt": 100,
            "no_generation_prompt": 100}
# Llama 3.1 takes one call per message and has no reasoning: it is given a
# few parallel calls (to record the raise) and no reasoning at all.
EXCEPT = {"llama-3.1": {"parallel_calls": 5, "tool_results_in_a_row": 5, "reasoning": 0}}


def _read(dialect: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = (DATA / f"{dialect}.jsonl").read_text(encoding="utf-8").splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def test_the_pins_agree() -> None:
    assert {d: r.sha256 for d, r in REFERENCES.items()} == PINNED


@pytest.mark.parametrize("dialect", COMMITTED)
def test_data_header_pins_the_template(dialect: str) -> None:
    header, _ = _read(dialect)
    ref = REFERENCES[dialect]
    assert set(header) == {"template", "commit", "sha256", "transformers", "dialect", "seed", "special_tokens"}
    assert header["sha256"] == PINNED[dialect]
    assert (header["template"], header["commit"], header["dialect"]) == (ref.source, ref.commit, dialect)
    assert len(header["commit"]) == 40 and int(header["commit"], 16) >= 0
    assert header["special_tokens"] == dict(ref.special_tokens)
    assert isinstance(header["transformers"], str) and header["transformers"][0].isdigit()


@pytest.mark.parametrize("dialect", SDIST)
def test_sdist_template_is_the_pinned_one(dialect: str) -> None:
    text = llama_template(REFERENCES[dialect].source, PINNED[dialect])  # fails on another sha256
    assert text


def _check_request(dialect: str, case: dict[str, Any]) -> None:
    req, opts = case["request"], case["options"]
    assert set(req) <= {"messages", "tools", "add_generation_prompt"}
    assert isinstance(req["add_generation_prompt"], bool)
    assert isinstance(req["messages"], list) and req["messages"]
    for m in req["messages"]:
        assert isinstance(m, dict) and isinstance(m["role"], str)
        assert m.get("content") is None or isinstance(m["content"], (str, list))
    if "tools" in req:
        assert all(t["type"] == "function" and t["function"]["name"] for t in req["tools"])
    assert isinstance(opts, dict) and set(opts) <= OPTIONS[dialect]


@pytest.mark.parametrize("dialect", COMMITTED)
def test_data_lines_are_well_formed(dialect: str) -> None:
    _, lines = _read(dialect)
    assert len(lines) == N_REQUESTS
    counts: Counter[str] = Counter()
    for line in lines:
        assert set(line) in ({"request", "options", "text"}, {"request", "options", "raises"}), set(line)
        _check_request(dialect, line)
        if "text" in line:
            assert isinstance(line["text"], str) and line["text"]
            counts["rendered"] += 1
        else:
            assert line["raises"] in REFERENCES[dialect].raises, line["raises"]
            counts[line["raises"]] += 1
    print(dialect, dict(counts))
    assert counts["rendered"] >= MIN_RENDERED


@pytest.mark.parametrize("dialect", COMMITTED)
def test_data_requests_are_the_generators(dialect: str) -> None:
    header, lines = _read(dialect)
    assert header["seed"] == SEED
    assert [{"request": x["request"], "options": x["options"]} for x in lines] == family_requests(dialect, seed=SEED)


@pytest.mark.parametrize("dialect", sorted(REFERENCES))
def test_the_generator_is_seeded(dialect: str) -> None:
    first = family_requests(dialect, n=50, seed=7)
    assert first == family_requests(dialect, n=50, seed=7)
    assert first != family_requests(dialect, n=50, seed=8)
    # What is generated survives the JSON round trip of the data files.
    assert json.loads(json.dumps(first)) == first


@pytest.mark.parametrize("dialect", sorted(REFERENCES))
def test_the_generator_covers_the_shapes(dialect: str) -> None:
    counts: Counter[str] = Counter()
    for case in family_requests(dialect):
        _check_request(dialect, case)
        counts.update(features(dialect, case))
    want = {**COVERAGE, **EXCEPT.get(dialect, {})}
    want.update({f"option:{o}": 30 for o in OPTIONS[dialect]})
    short = {k: (counts[k], n) for k, n in want.items() if counts[k] < n}
    assert not short, short
    if not want["reasoning"]:
        assert counts["reasoning"] == 0


@pytest.mark.parametrize("dialect", SDIST)
def test_sdist_template_renders_the_generated_requests(dialect: str) -> None:
    ref = REFERENCES[dialect]
    template = llama_template(ref.source, PINNED[dialect])
    counts: Counter[str] = Counter()
    for case in family_requests(dialect):
        try:
            hf_render(dialect, template, case)
        except Exception as e:
            # Any other exception is a request the template cannot be asked.
            assert str(e) in ref.raises, (str(e), case)
            counts[str(e)] += 1
        else:
            counts["rendered"] += 1
    print(dialect, dict(counts))
    assert counts["rendered"] >= MIN_RENDERED
