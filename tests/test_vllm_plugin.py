"""xtml's parsers inside vLLM (``--tool-call-parser xtml --reasoning-parser
xtml``), run in vLLM itself: the venv tests/run makes (``XTML_VLLM_PYTHON``)
runs tests/helpers/vllm_driver.py over completions rendered here, and each
must come back as ``Template.parse(ids, completion=True, lenient=True)``
gives it, whole and streamed however the ids are grouped."""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import xtml
from tests.helpers.need import need
from tests.helpers.tokenizers import k3_vocab
from tests.helpers.vllm import as_json, dist_folder, parsed_message
from xtml import testing as xt
from xtml.testing.strategies import assistant_messages

pytestmark = pytest.mark.engines

ROOT = Path(__file__).parent.parent
DRIVER = Path(__file__).parent / "helpers" / "vllm_driver.py"
CASES = 80
# Ids per delta: one at a time, a few, as speculative decoding and
# stream_interval deliver them, and random sizes from 1 to 16.
GROUPINGS = [[1], [2], [3], [16], [random.Random(k).randint(1, 16) for k in range(50)]]


def collect(n: int) -> list[tuple[list[int], dict[str, Any], bool]]:
    k3 = xtml.load("kimi-k3")
    vocab = k3_vocab()
    out: list[tuple[list[int], dict[str, Any], bool]] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(xt.requests(k3, images=False), assistant_messages(k3, images=False, name=False))
    def draw(request: dict[str, Any], answer: dict[str, Any]) -> None:
        body = {**request, "messages": [*request["messages"], answer]}
        try:
            case = xt.completion_case(k3, body, vocab)
        except xtml.XtmlError:
            return
        if case is not None:
            out.append(case)

    draw()
    return out


@cache
def outcomes() -> tuple[dict[str, Any], list[tuple[list[int], dict[str, Any], bool]]]:
    return run_driver([*collect(CASES), *hostile()], builtin=True)


def hostile() -> list[tuple[list[int], dict[str, Any], bool]]:
    """Answers that break parsers on text: marker text inside an argument
    value (vLLM's own K3 parser cuts it there), a quoted tools channel in
    the answer, a call after an answer left open, a character split across
    ids, and an id past the vocabulary."""
    k3, vocab = xtml.load("kimi-k3"), k3_vocab()
    m = k3.markers
    out = []
    for message in (
            {"role": "assistant", "content": "ok", "tool_calls": [{"type": "function", "function": {
                "name": "f", "arguments": {"q": f"os{m.close}argument{m.sep}sify"}}}]},
            {"role": "assistant", "content": f"quoted: {m.open}tools{m.sep} is markup", "reasoning_content": "hm"},
            {"role": "assistant", "content": "emoji 🎉 and 中文 split across ids", "reasoning_content": "ünï"}):
        thinking = "reasoning_content" in message
        case = xt.completion_case(k3, {"messages": [{"role": "user", "content": "q"}, message],
                                       "thinking": thinking}, vocab)
        assert case is not None
        out.append(case)
    open_answer = (f'hi{m.open}tools{m.sep}{m.open}call tool="f" index="1"{m.sep}{m.close}call{m.sep}'
                   f"{m.close}tools{m.sep}{m.close}message{m.sep}{m.end}")
    out.append((k3.completion_ids(open_answer, vocab), {}, False))
    ids, message, thinking = out[0]
    past = vocab.size + 5
    out.append(([*ids[:3], past, *ids[3:]], message, thinking))
    return out


def run_driver(cases: list[tuple[list[int], dict[str, Any], bool]], grammar_cases: list[dict[str, Any]] = (),
               builtin: bool = False) -> tuple[dict[str, Any], list[tuple[list[int], dict[str, Any], bool]]]:
    python = need("vLLM python", "tests/run sets it up", env="XTML_VLLM_PYTHON")
    k3 = xtml.load("kimi-k3")
    vocab = k3_vocab()
    with tempfile.TemporaryDirectory(prefix="xtml-vllm-") as tmp:
        tokenizer = Path(tmp) / "tokenizer.json"
        tokenizer.write_text(vocab.tokenizer.to_str(), encoding="utf-8")
        job = {"tokenizer": str(tokenizer), "dist": str(dist_folder(Path(tmp) / "dist")),
               "stop": [k3.bind(vocab).marker_ids[k3.markers.end]],
               "cases": [{"prompt": k3.encode({"messages": [], "thinking": thinking}, vocab),
                          "completion": ids, "thinking": thinking, "groupings": GROUPINGS}
                         for ids, _, thinking in cases],
               "grammar_cases": list(grammar_cases), "builtin": builtin}
        env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_PLUGINS": "xtml", "XTML_TEMPLATE": "kimi-k3"}
        # -P: the script's folder (tests/helpers, with its tokenizers.py)
        # must not shadow the tokenizers package; PYTHONPATH still counts.
        run = subprocess.run([python, "-P", str(DRIVER)], input=json.dumps(job), capture_output=True, text=True,
                             timeout=600, env=env, cwd=tmp)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout), cases


def expected(ids: list[int], thinking: bool) -> dict[str, Any]:
    return parsed_message(xtml.load("kimi-k3"), k3_vocab(), ids, thinking)


def shaped(got: dict[str, Any]) -> dict[str, Any]:
    return {"reasoning": got["reasoning"] or "", "content": got["content"] or "",
            "tool_calls": [[name, as_json(args)] for name, args in got["tool_calls"]]}


def test_the_plugin_registers_both_parsers() -> None:
    answer, _ = outcomes()
    assert answer["vllm"].startswith("0.33.")
    assert answer["registered"] == {"tool": True, "reasoning": True}


def test_whole_answers_parse_as_xtml_parses_them() -> None:
    """vLLM 0.33 hands a legacy parser the decoded text only (the stop
    token's text left out): read back to ids, it is the generated ids unless
    the model spelled a marker with ordinary tokens, which text cannot tell
    from the marker (docs/vllm.md). Every answer parses as xtml parses the
    ids its text reads back to, and as xtml parses the generated ids
    whenever its text spells no marker; when it does, the parser says so
    (one warning, with the first token that differs) as soon as vLLM hands
    it the ids, and only then."""
    answer, cases = outcomes()
    k3, vocab = xtml.load("kimi-k3"), k3_vocab()
    end = k3.bind(vocab).marker_ids[k3.markers.end]
    assert len(cases) >= 40
    spelled = 0
    for (ids, _, thinking), got in zip(cases, answer["results"], strict=True):
        generated = ids[:-1] if ids and ids[-1] == end else ids
        read_back = k3.completion_ids(vocab.decode(generated), vocab)
        assert shaped(got["whole"]) == whole_answer(expected(read_back, thinking))
        if read_back == generated:
            assert shaped(got["whole"]) == whole_answer(expected(ids, thinking))
            assert got["whole_ambiguous_at"] is None and got["whole_warnings"] == 0
        else:
            spelled += 1
            assert any(m in vocab.decode(ids) for m in k3.markers.all())
            at = next(k for k, (a, b) in enumerate(zip(read_back, ids)) if a != b)
            assert got["whole_ambiguous_at"] == at and got["whole_warnings"] == 1
    assert 0 < spelled < len(cases)


def whole_answer(message: dict[str, Any]) -> dict[str, Any]:
    """A message as vLLM's whole path returns it: beside tool calls, content
    that is only white space is no content (vLLM 0.33,
    ``DelegatingParser._extract_tool_calls``: ``if content and
    content.strip() == "": content = None``); a stream keeps it."""
    if message["tool_calls"] and not message["content"].strip():
        return {**message, "content": ""}
    return message


def test_streamed_answers_join_to_the_same_whatever_the_grouping() -> None:
    answer, cases = outcomes()
    for (ids, _, thinking), got in zip(cases, answer["results"], strict=True):
        want = expected(ids, thinking)
        for sizes, stream, announced in zip(GROUPINGS, got["streams"], got["announced"], strict=True):
            assert shaped(stream) == want, sizes
            # Each call announced once, in order.
            assert announced == list(range(len(want["tool_calls"]))), sizes


def test_without_tools_the_answer_comes_without_markup() -> None:
    """A request without tools has tool_choice "none" in vLLM, where a
    parser that is not engine-based gets no say: the answer and reasoning
    still come as xtml reads them, whole and streamed, and no call."""
    answer, cases = outcomes()
    k3, vocab = xtml.load("kimi-k3"), k3_vocab()
    for (ids, _, thinking), got in zip(cases, answer["results"], strict=True):
        want = expected(ids, thinking)
        want["tool_calls"] = []
        assert shaped(got["plain_stream"]) == want
        read_back = k3.completion_ids(vocab.decode(ids), vocab)
        if read_back == ids:
            assert shaped(got["plain_whole"]) == want


def test_a_call_the_answer_was_cut_off_in_is_withheld() -> None:
    """An answer cut off by max_tokens inside its second call: the first
    call comes back, whole and streamed; the second is withheld (the cut may
    have fallen inside it), as xtml serve withholds it."""
    k3, vocab = xtml.load("kimi-k3"), k3_vocab()
    calls = [{"type": "function", "function": {"name": "f", "arguments": {"a": "xyz", "b": 2}}},
             {"type": "function", "function": {"name": "g", "arguments": {"c": "a long value, cut here"}}}]
    body = {"messages": [{"role": "user", "content": "q"},
                         {"role": "assistant", "content": "On it.", "tool_calls": calls}], "thinking": False}
    case = xt.completion_case(k3, body, vocab)
    assert case is not None
    ids, message, thinking = case
    cut = ids[:len(ids) - 12]
    answer, _ = run_driver([(cut, message, thinking)])
    (got,) = answer["results"]
    want = {"reasoning": "", "content": "On it.", "tool_calls": [["f", {"a": "xyz", "b": 2}]]}
    assert shaped(got["whole"]) == want
    for stream in got["streams"]:
        assert shaped(stream) == want


def test_the_reasoning_ends_where_the_channel_closes() -> None:
    """What the engine asks to start structured output after the reasoning:
    a prompt that opened the reasoning has not ended it, one that did not
    has; a finished answer has; and the request keeps special tokens, which
    the parsers read."""
    answer, cases = outcomes()
    k3, vocab = xtml.load("kimi-k3"), k3_vocab()
    end = k3.bind(vocab).marker_ids[k3.markers.close]
    for (ids, _, thinking), got in zip(cases, answer["results"], strict=True):
        assert got["ended_at_prompt"] is (not thinking)
        if thinking and end in ids:
            assert got["ended_at_completion"] is True
        assert got["keeps_special_tokens"] is True


def test_a_bad_template_stops_vllm_at_start_up(tmp_path: Path) -> None:
    python = need("vLLM python", "tests/run sets it up", env="XTML_VLLM_PYTHON")
    dist = dist_folder(tmp_path / "dist")
    code = (f"import sys; sys.path.insert(0, {str(dist)!r})\n"
            "from vllm.plugins import load_general_plugins\nload_general_plugins()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_PLUGINS": "xtml", "XTML_TEMPLATE": "no-such-template"}
    run = subprocess.run([python, "-P", "-c", code], capture_output=True, text=True, timeout=300, env=env,
                         cwd=tmp_path)
    assert run.returncode != 0
    assert "XTML_TEMPLATE='no-such-template'" in run.stderr.splitlines()[-1], run.stderr[-2000:]


TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"],
    "additionalProperties": False}}}]


def after_reasoning(ids: list[int], thinking: bool) -> list[int]:
    """The ids vLLM's structured output constrains: those after the
    reasoning channel's close (all of them with thinking off)."""
    if not thinking:
        return ids
    k3, vocab = xtml.load("kimi-k3"), k3_vocab()
    marks = k3.bind(vocab).marker_ids
    end = [marks[k3.markers.close], *vocab.ids_of(["think"])[0], marks[k3.markers.sep]]
    k = next(i for i in range(len(ids)) if ids[i:i + len(end)] == end)
    return ids[k + len(end):]


@pytest.mark.parametrize("thinking", [True, False])
def test_tool_choice_required_hands_vllm_the_grammar(thinking: bool) -> None:
    """tool_choice required: the parser hands vLLM's structured outputs the
    completion grammar as an xgrammar structural tag, starting after the
    reasoning; vLLM's xgrammar takes an answer with a call to its end and
    refuses one without; tool_choice auto hands nothing."""
    k3, vocab = xtml.load("kimi-k3"), k3_vocab()
    history = {"messages": [{"role": "user", "content": "look it up"}], "tools": TOOLS, "thinking": thinking}
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"q": "rain", "n": 2}}}
    answers = []
    for message in ({"role": "assistant", "reasoning_content": "hm", "content": "Looking.", "tool_calls": [call]},
                    {"role": "assistant", "reasoning_content": "hm", "content": "No call."}):
        case = xt.completion_case(k3, {**history, "messages": [*history["messages"], message]}, vocab)
        assert case is not None
        answers.append(after_reasoning(case[0], thinking))
    end = k3.bind(vocab).marker_ids[k3.markers.end]
    kwargs = {"thinking": thinking}
    grammar_cases = [{"request": {"tools": TOOLS, "tool_choice": choice, "chat_template_kwargs": kwargs},
                      "stop": [end], "answers": answers} for choice in ("required", "auto")]
    answer, _ = run_driver([], grammar_cases)
    required, auto = answer["grammars"]
    assert required["structural_tag"] and not auto["structural_tag"]
    good, bad = required["results"]
    assert good == {"taken": len(answers[0]), "terminated": True}
    assert bad["taken"] < len(answers[1])


def test_a_json_response_format_hands_vllm_the_grammar() -> None:
    """response_format json_schema: the answer's grammar (a JSON answer of
    the schema in the response channel) goes to vLLM's structured outputs;
    an answer in prose is refused."""
    k3, vocab = xtml.load("kimi-k3"), k3_vocab()
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
              "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    history = {"messages": [{"role": "user", "content": "answer in JSON"}], "thinking": True}
    answers = []
    for content in (json.dumps({"answer": "yes"}), "yes"):
        case = xt.completion_case(k3, {**history, "messages": [*history["messages"], {
            "role": "assistant", "reasoning_content": "hm", "content": content}]}, vocab)
        assert case is not None
        answers.append(after_reasoning(case[0], True))
    end = k3.bind(vocab).marker_ids[k3.markers.end]
    answer, _ = run_driver([], [{"request": {"response_format": rf, "chat_template_kwargs": {"thinking": True}},
                                 "stop": [end], "answers": answers}])
    (got,) = answer["grammars"]
    assert got["structural_tag"]
    good, bad = got["results"]
    assert good == {"taken": len(answers[0]), "terminated": True}
    assert bad["taken"] < len(answers[1])


def test_beside_vllms_own_k3_parser() -> None:
    """The same answers through vLLM's built-in ``kimi_k3`` parsers, for the
    record (docs/vllm.md): how many come back as xtml reads the ids, whole
    and one id a delta. vLLM's parser reads decoded text with regular
    expressions: it cuts the argument value that holds marker text (the
    first hostile answer), whole and streamed; xtml's, streamed, loses none.
    Whole answers are text to both (see above), where neither can tell a
    marker from its spelling."""
    answer, cases = outcomes()
    n = len(cases)
    xtml_whole = sum(shaped(got["whole"]) == whole_answer(expected(ids, thinking))
                     for (ids, _, thinking), got in zip(cases, answer["results"], strict=True))
    xtml_stream = sum(shaped(got["streams"][0]) == expected(ids, thinking)
                      for (ids, _, thinking), got in zip(cases, answer["results"], strict=True))
    builtin_whole = sum("whole" in got and shaped(got["whole"]) == whole_answer(expected(ids, thinking))
                        for (ids, _, thinking), got in zip(cases, answer["builtin"], strict=True))
    builtin_stream = sum("stream" in got and shaped(got["stream"]) == expected(ids, thinking)
                         for (ids, _, thinking), got in zip(cases, answer["builtin"], strict=True))
    print(f"\nequal to Template.parse on the ids, of {n}: xtml whole {xtml_whole}, streamed {xtml_stream}; "
          f"kimi_k3 whole {builtin_whole}, streamed {builtin_stream}")
    assert xtml_stream == n
    # The first hostile answer: "os<|close|>argument<|sep|>sify" as an argument value.
    (ids, _, thinking), got = cases[first_hostile()], answer["builtin"][first_hostile()]
    want = expected(ids, thinking)
    assert want["tool_calls"] == [["f", {"q": "os<|close|>argument<|sep|>sify"}]]
    assert shaped(answer["results"][first_hostile()]["streams"][0]) == want
    assert "whole" not in got or shaped(got["whole"]) != want
    assert "stream" not in got or shaped(got["stream"]) != want


def first_hostile() -> int:
    """Where the hostile answers start among the cases: after the generated ones."""
    return len(outcomes()[1]) - len(hostile())
