"""The reference data the ``llama-3.1``, ``deepseek-v3.1``, ``kimi-k2``,
``kimi-k2-thinking``, ``glm-4.6``, ``gpt-oss``, ``gemma-4`` and
``mistral-small-3.1`` dialects are checked against: the committed renders of
the three templates the sdist does not carry as the dialects mirror them
(never rendered again here: those templates are not committed), the sdist's
own templates, the clock pinned for the templates that read it, and the
seeded generator of the requests."""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import date
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
    pinned_clock,
)

DATA = Path(__file__).parent / "data" / "families"
COMMITTED = ("deepseek-v3.1", "kimi-k2-thinking", "mistral-small-3.1")
SDIST = ("llama-3.1", "kimi-k2", "glm-4.6", "gpt-oss", "gemma-4")
MIN_RENDERED = 300

PINNED = {
    "deepseek-v3.1": "7fe7159748925dc7d9e2aaeb11e4bd3121c311d8d0e3a0d6377fb8550e64c560",
    "kimi-k2-thinking": "833d0c375531149a922a0f2addf9a66cce8e4503c500fe4ca6a95e9d1ed3c75a",
    "llama-3.1": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
    "kimi-k2": "9fcc72b7c248a72020c81f70bb652f3094d18a750c93ca35dfcb3cf5fe23ff53",
    "glm-4.6": "8804f445c761b9f259e3c1126a579d481a22ca09b2a3d32bcc4eb91bc36e0301",
    "gpt-oss": "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146",
    "gemma-4": "85a08664d16d8f3be4416c92427b3ac10df1024ac566cc0b4bc3bab409393f98",
    "mistral-small-3.1": "773c8c8c2ffb59c8d1069fe423733d2007a88c52d0a838d89e6aae6693b97427",
}
OPTIONS = {
    "deepseek-v3.1": {"thinking", "enable_thinking"},
    "kimi-k2-thinking": set(),
    "llama-3.1": {"date_string", "tools_in_user_message", "builtin_tools"},
    "kimi-k2": set(),
    "glm-4.6": {"enable_thinking"},
    "gpt-oss": {"reasoning_effort", "model_identity", "builtin_tools", "date"},
    "gemma-4": {"enable_thinking"},
    "mistral-small-3.1": {"date"},
}
# What the clock reads in a render of the templates that read it, for the
# requests it is read in.
CLOCK = {"gpt-oss": r"Current date: (\d{4}-\d{2}-\d{2})\n",
         "mistral-small-3.1": r"The current date is (\d{4}-\d{2}-\d{2})\."}
# What every dialect's requests must cover, at least this many times each.
COVERAGE = {"tools": 50, "tool_call": 50, "parallel_calls": 40, "tool_result": 50, "tool_results_in_a_row": 30,
            "reasoning": 50, "system": 100, "no_system": 100, "text": 300, "text_parts": 20, "marker_text": 40,
            "ends:assistant": 100, "ends:user": 100, "ends:tool": 5, "generation_prompt": 100,
            "no_generation_prompt": 100}
# Llama 3.1 takes one call per message and has no reasoning: it is given a
# few parallel calls (to record the raise) and no reasoning at all; nor has
# Mistral Small 3.1, which keeps the last 9 characters of a call id and
# raises on fewer. gpt-oss reads reasoning as `thinking`; it and Gemma 4 read
# a first `developer` message as the system one.
EXCEPT = {"llama-3.1": {"parallel_calls": 5, "tool_results_in_a_row": 5, "reasoning": 0},
          "mistral-small-3.1": {"reasoning": 0, "call_id:9": 50, "call_id:long": 10, "call_id:short": 5,
                                "call_id:none": 3},
          "gpt-oss": {"developer": 30, "reasoning_as:thinking": 30},
          "gemma-4": {"developer": 30}}


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
            assert REFERENCES[dialect].raised(line["raises"]), line["raises"]
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
            assert ref.raised(str(e)), (str(e), case)
            counts[str(e)] += 1
        else:
            counts["rendered"] += 1
    print(dialect, dict(counts))
    assert counts["rendered"] >= MIN_RENDERED


def _clock_read(dialect: str, case: dict[str, Any], text: str) -> None:
    """The day ``text`` was rendered on is the case's ``date``, never today."""
    day = case["options"]["date"]
    assert re.findall(CLOCK[dialect], text) == [day], (day, text[:400])
    assert date.today().isoformat() not in text


def test_the_clock_is_pinned_to_the_date_option() -> None:
    template = "{{ date is defined }} {{ strftime_now('%Y-%m-%d %H') }}"
    case = {"request": {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True},
            "options": {"date": "2024-02-29"}}
    assert hf_render("gpt-oss", template, case) == "False 2024-02-29 12"
    with pinned_clock("2019-12-31"):
        assert hf_render("kimi-k2", template, {**case, "options": {}}) == "False 2019-12-31 12"
    # Outside the block the clock is the machine's again.
    assert hf_render("kimi-k2", template, {**case, "options": {}}).split()[1] >= date.today().isoformat()


def test_the_days_are_the_clock_readers_only() -> None:
    for dialect, ref in REFERENCES.items():
        days = {c["options"].get("date") for c in family_requests(dialect)}
        if ref.clock:
            assert None not in days and len(days) >= 3 and date.today().isoformat() not in days, dialect
            assert all(date.fromisoformat(d) < date.today() for d in days)
        else:
            assert days == {None}, dialect
    assert {d for d, r in REFERENCES.items() if r.clock} == set(CLOCK)


def test_committed_renders_read_the_pinned_clock() -> None:
    dialect = "mistral-small-3.1"
    _, lines = _read(dialect)
    read = 0
    for line in lines:
        # The default system prompt (no system message of the request's) is
        # where the template reads the clock.
        if "text" in line and line["request"]["messages"][0]["role"] != "system":
            _clock_read(dialect, line, line["text"])
            read += 1
        elif "text" in line:
            assert not re.findall(CLOCK[dialect], line["text"])
    assert read >= 150


def test_sdist_renders_read_the_pinned_clock() -> None:
    dialect = "gpt-oss"
    template = llama_template(REFERENCES[dialect].source, PINNED[dialect])
    read = 0
    for case in family_requests(dialect):
        try:
            text = hf_render(dialect, template, case)
        except Exception as e:
            assert REFERENCES[dialect].raised(str(e))
            continue
        _clock_read(dialect, case, text)
        read += 1
    assert read >= MIN_RENDERED
