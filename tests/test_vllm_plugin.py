"""xtml's parsers inside vLLM (``--tool-call-parser xtml --reasoning-parser
xtml``), run in vLLM itself: the venv tests/run makes (``XTML_VLLM_PYTHON``)
runs tests/helpers/vllm_driver.py over completions rendered here, and each
must come back as ``Template.parse(ids, completion=True, lenient=True)``
gives it, whole and streamed however the ids are grouped."""

from __future__ import annotations

import codecs
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
from xtml.vllm.plugin import PARSE_SHAPE, hook_problem
from xtml.vocab.vocabulary import byte_to_char

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
def all_cases() -> list[tuple[list[int], dict[str, Any], bool]]:
    return [*collect(CASES), *hostile()]


@cache
def outcomes() -> tuple[dict[str, Any], list[tuple[list[int], dict[str, Any], bool]]]:
    return run_driver(all_cases(), builtin=True)


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


Case = tuple[list[int], dict[str, Any], bool]


def run_driver(cases: list[Case], grammar_cases: list[dict[str, Any]] = (), builtin: bool = False,
               **more: Any) -> tuple[dict[str, Any], list[Case]]:
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
               "grammar_cases": list(grammar_cases), "builtin": builtin, **more}
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
    # vLLM 0.33 is the vLLM the whole-answer hook was written for: no warning.
    assert answer["hands_ids"] is True and answer["plugin_warnings"] == []


def warned(ids: list[int], thinking: bool) -> int:
    """The warnings the tool parser gives a whole answer it reads as ``ids``
    (docs/vllm.md): one where Template.parse of them repaired or withheld
    something, none where it did not; none for an answer cut off while
    reasoning, which leaves the tool parser nothing to read."""
    k3, vocab = xtml.load("kimi-k3"), k3_vocab()
    close = k3.completion_ids(f"{k3.markers.close}think{k3.markers.sep}", vocab)
    if thinking and not any(ids[k:k + len(close)] == close for k in range(len(ids))):
        return 0
    return int(bool(k3.parse(ids, vocab, completion=True, lenient=True, thinking=thinking).get("diagnostics")))


def test_whole_answers_are_read_on_their_ids() -> None:
    """vLLM 0.33's DelegatingParser.parse drops the generated ids its server
    hands it; the plugin hands them on to xtml's parsers (docs/vllm.md), so
    every whole answer is Template.parse's message of the generated ids,
    marker text in an argument value and a quoted tools channel included;
    what the parse repaired or withheld (an id past the vocabulary, a call
    after an answer left open) is one warning, and a clean answer none."""
    answer, cases = outcomes()
    assert len(cases) >= 40
    repaired = 0
    for (ids, _, thinking), got in zip(cases, answer["results"], strict=True):
        assert shaped(got["whole"]) == whole_answer(expected(ids, thinking))
        assert got["whole_ambiguous_at"] is None and got["whole_warnings"] == warned(ids, thinking)
        repaired += warned(ids, thinking)
    assert 0 < repaired < len(cases)
    hostile_args = shaped(answer["results"][first_hostile()]["whole"])["tool_calls"]
    assert hostile_args == [["f", {"q": "os<|close|>argument<|sep|>sify"}]]
    quoted = shaped(answer["results"][first_hostile() + 1]["whole"])
    assert quoted["tool_calls"] == [] and "tools" in quoted["content"]


@pytest.mark.parametrize("vllm_as", ["other-version", "other-signature"])
def test_a_vllm_the_hook_was_not_written_for_reads_whole_answers_from_text(vllm_as: str) -> None:
    """Where vLLM is not the one the hook was written for (a version outside
    the ``vllm`` extra's range, or a DelegatingParser.parse of another
    signature), the plugin leaves vLLM's code alone and says why, once, at
    start-up; whole answers are then read from their text (below)."""
    answer, cases = run_driver(all_cases(), whole_only=True, vllm_as=vllm_as)
    assert answer["hands_ids"] is False
    (warning,) = answer["plugin_warnings"]
    assert "read from their decoded text" in warning
    assert ("0.34.0 is outside the range" if vllm_as == "other-version" else "not the signature") in warning
    check_read_from_text(answer, cases)


def test_the_upstream_patch_reads_whole_answers_on_their_ids() -> None:
    """docs/vllm-delegating-parser-ids.patch, applied to vLLM 0.33's
    DelegatingParser.parse, hands xtml's parsers the ids with no hook of
    xtml's (the plugin declines it in a vLLM of another version): every
    whole answer is the ids' message."""
    patch = (ROOT / "docs" / "vllm-delegating-parser-ids.patch").read_text(encoding="utf-8")
    answer, cases = run_driver(all_cases(), whole_only=True, vllm_as="patched", patch=patch)
    assert answer["hands_ids"] is False
    for (ids, _, thinking), got in zip(cases, answer["results"], strict=True):
        assert shaped(got["whole"]) == whole_answer(expected(ids, thinking))
        assert got["whole_warnings"] == warned(ids, thinking)


def test_hook_problem_names_what_differs() -> None:
    def parse(self: Any, model_output: str, request: Any, enable_auto_tools: bool = False,
              model_output_token_ids: Any = ()) -> None:
        pass

    def other(self: Any, model_output: str, request: Any, enable_auto_tools: bool = False) -> None:
        pass

    assert [p[0] for p in PARSE_SHAPE][-1] == "model_output_token_ids"
    assert hook_problem("0.33.0", parse) is None
    assert hook_problem("0.33.2.dev4+gabc", parse) is None
    for version in ("0.32.9", "0.34.0", "1.0.0", "nightly"):
        assert f"vLLM {version} is outside the range" in str(hook_problem(version, parse))
    assert "not the signature" in str(hook_problem("0.33.0", other))
    # The range is the vllm extra's pin.
    import tomllib
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    assert pins == ["vllm>=0.33,<0.34"]


def check_read_from_text(answer: dict[str, Any], cases: list[tuple[list[int], dict[str, Any], bool]]) -> None:
    """vLLM hands a parser the decoded text only (the stop token's text left
    out): read back to ids, it is the generated ids unless the model spelled
    a marker with ordinary tokens, which text cannot tell from the marker
    (docs/vllm.md). Every answer parses as xtml parses the ids its text
    reads back to, and as xtml parses the generated ids whenever its text
    spells no marker; when it does, the parser says so (one warning, with
    the first token that differs) as soon as vLLM hands it the ids, and only
    then, besides the warning of what the parse of the read-back ids
    repaired."""
    k3, vocab = xtml.load("kimi-k3"), k3_vocab()
    end = k3.bind(vocab).marker_ids[k3.markers.end]
    assert len(cases) >= 40
    spelled = 0
    for (ids, _, thinking), got in zip(cases, answer["results"], strict=True):
        generated = ids[:-1] if ids and ids[-1] == end else ids
        read_back = k3.completion_ids(vocab.decode(generated), vocab)
        assert shaped(got["whole"]) == whole_answer(expected(read_back, thinking))
        # (The repairs are of the ids read back from the text.)
        if read_back == generated:
            assert shaped(got["whole"]) == whole_answer(expected(ids, thinking))
            assert got["whole_ambiguous_at"] is None and got["whole_warnings"] == warned(read_back, thinking)
        else:
            spelled += 1
            assert any(m in vocab.decode(ids) for m in k3.markers.all())
            at = next(k for k, (a, b) in enumerate(zip(read_back, ids)) if a != b)
            assert got["whole_ambiguous_at"] == at
            assert got["whole_warnings"] == 1 + warned(read_back, thinking)
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
    for (ids, _, thinking), got in zip(cases, answer["results"], strict=True):
        want = expected(ids, thinking)
        want["tool_calls"] = []
        assert shaped(got["plain_stream"]) == want
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
    first hostile answer), whole and streamed; xtml's, on the ids whole and
    streamed, loses none."""
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
    assert xtml_stream == n and xtml_whole == n
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


def test_a_second_reasoning_channel_after_the_answer_keeps_the_answer() -> None:
    """The reasoning ends at its channel's first close, whole as streamed: a
    second reasoning channel after the answer and a call leaves the answer
    and the call where Template.parse reads them, on the ids handed on and
    on text read back alike."""
    k3, vocab = xtml.load("kimi-k3"), k3_vocab()
    m = k3.markers
    call = {"type": "function", "function": {"name": "f", "arguments": {"q": "x"}}}
    message = {"role": "assistant", "reasoning_content": "first", "content": "the answer", "tool_calls": [call]}
    case = xt.completion_case(k3, {"messages": [{"role": "user", "content": "q"}, message], "thinking": True}, vocab)
    assert case is not None
    ids = case[0]
    tail = k3.completion_ids(f"{m.close}message{m.sep}{m.end}", vocab)
    assert ids[-len(tail):] == tail
    second = k3.completion_ids(f"{m.open}think{m.sep}second thoughts{m.close}think{m.sep}", vocab)
    ids = [*ids[:-len(tail)], *second, *tail]
    want = expected(ids, True)
    assert want == {"reasoning": "first", "content": "the answer", "tool_calls": [["f", {"q": "x"}]]}
    answer, _ = run_driver([(ids, message, True)])
    (got,) = answer["results"]
    assert shaped(got["whole"]) == want
    assert [shaped(s) for s in got["streams"]] == [want] * len(GROUPINGS)
    from_text, _ = run_driver([(ids, message, True)], whole_only=True, vllm_as="other-signature")
    assert shaped(from_text["results"][0]["whole"]) == want


def byte_ids(data: bytes) -> list[int]:
    """One id a byte: the byte-level vocabulary's id of each byte alone."""
    alphabet = byte_to_char()
    ids = [k3_vocab().tokenizer.token_to_id(alphabet[b]) for b in data]
    assert None not in ids
    return ids


def reasoning_stream(reasoning_ids: list[int]) -> tuple[list[int], dict[str, Any]]:
    """A completion whose reasoning is ``reasoning_ids``, followed by a short
    answer, and the driver's job to feed it one id a step."""
    k3, vocab = xtml.load("kimi-k3"), k3_vocab()
    m = k3.markers
    rest = k3.completion_ids(f"{m.close}think{m.sep}{m.open}response{m.sep}fine{m.close}response{m.sep}"
                             f"{m.close}message{m.sep}{m.end}", vocab)
    ids = [*reasoning_ids, *rest]
    return ids, {"prompt": k3.encode({"messages": [], "thinking": True}, vocab), "completion": ids}


def test_reasoning_streams_each_character_as_soon_as_it_is_whole() -> None:
    """Fed one id a step through vLLM's composed parser, the reasoning
    streamed so far is, at every step, the UTF-8 of its bytes so far less
    only an incomplete last character: a character cut across ids waits for
    its last byte and no longer, and invalid bytes stream at once (as
    U+FFFD) instead of holding back what follows."""
    vocab = k3_vocab()
    table = vocab.byte_table()
    parts = [vocab.ids_of(["ok "])[0], byte_ids("中".encode()), byte_ids(b"\xe4"), vocab.ids_of(["x"])[0],
             byte_ids(b"\xff\xf0\x9f"), byte_ids("🎉".encode()), byte_ids(b"\xe4\xb8"), vocab.ids_of([" done"])[0]]
    reasoning_ids = [i for part in parts for i in part]
    ids, job = reasoning_stream(reasoning_ids)
    answer, _ = run_driver([], reasoning_steps=[job])
    (got,) = answer["reasoning_steps"]
    # Step by step, against an incremental UTF-8 decoder of the same bytes.
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    streamed, whole = "", ""
    for k, t in enumerate(reasoning_ids):
        streamed += got["reasoning"][k]
        whole += decoder.decode(table[t])
        assert streamed == whole, (k, streamed, whole)
    assert "".join(got["reasoning"]) == expected(ids, True)["reasoning"]
    assert "中" in streamed and "🎉" in streamed and "\ufffd" in streamed


def test_reasoning_of_bytes_that_never_make_a_character_costs_what_it_adds() -> None:
    """A reasoning of lone lead bytes (each cut off by the next, so the text
    decoded so far always ends in U+FFFD): each step decodes what it adds
    and at most three held ids, so the ids decoded grow as the steps do (1x
    and 4x in the same run), and each U+FFFD streams as soon as the next
    byte settles it."""
    sizes = (500, 2000)
    jobs = [reasoning_stream(byte_ids(b"\xe4" * n)) for n in sizes]
    answer, _ = run_driver([], reasoning_steps=[job for _, job in jobs])
    small, large = answer["reasoning_steps"]
    print(f"\nids decoded over {sizes[0]} and {sizes[1]} steps: {small['decoded']}, {large['decoded']} "
          f"(x{large['decoded'] / small['decoded']:.2f})")
    for n, got in zip(sizes, (small, large), strict=True):
        assert got["decoded"] <= 2 * n + 50
        assert "".join(got["reasoning"][:n]) == "\ufffd" * (n - 1)
        assert "".join(got["reasoning"]) == expected(jobs[sizes.index(n)][0], True)["reasoning"]
    assert large["decoded"] <= 4.5 * small["decoded"]
