"""xtml's vLLM parsers with a layout template (``XTML_TEMPLATE=qwen3``), run
inside vLLM itself as tests/test_vllm_plugin.py runs them: whole answers
read on their ids, streamed ones in every grouping of the ids, the
reasoning split off, each as ``Template.parse(ids, completion=True,
lenient=True)`` reads the answer. Then hostile answers through xtml's
parsers and through vLLM's own for Qwen3 (``hermes`` with the ``qwen3``
reasoning parser): the calls, arguments and text each loses without a
report, counted."""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.families import chatml_requests
from tests.helpers.need import need
from tests.helpers.tokenizers import deepseek_path
from tests.helpers.vllm import dist_folder, parsed_message
from tests.helpers.vllm_families import losses, shaped, whole_answer

pytestmark = pytest.mark.engines

ROOT = Path(__file__).parent.parent
DRIVER = Path(__file__).parent / "helpers" / "vllm_layout_driver.py"
GROUPINGS = [[1], [2], [3], [16], [random.Random(k).randint(1, 16) for k in range(50)]]
PAIRS = [["xtml", "xtml"], ["hermes", "qwen3"]]
XTML, VLLM = "xtml+xtml", "hermes+qwen3"
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


@cache
def tokenizer_json() -> str:
    """A byte-level BPE vocabulary with Qwen3's tokens as Qwen's tokenizer
    has them: three special ones, six added ones that are not special."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(deepseek_path())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    return str(tok.to_str())


@cache
def vocab() -> xtml.Vocabulary:
    from tokenizers import Tokenizer

    return xtml.Vocabulary(Tokenizer.from_str(tokenizer_json()))


@cache
def plain() -> xtml.Vocabulary:
    """The same ids without Qwen3's tokens: what a model spelling a marker
    with ordinary tokens writes."""
    return xtml.load_tokenizer(deepseek_path())


def tpl() -> xtml.Template:
    return xtml.load("qwen3")


def ids(text: str) -> list[int]:
    """An answer's ids: each of the format's token strings its id."""
    return tpl().completion_ids(text, vocab())


def spelled(text: str) -> list[int]:
    """Text in ordinary ids only, a marker string included."""
    return plain().ids_of([text])[0]


Case = dict[str, Any]


def generated(n: int) -> list[Case]:
    """Answers the official template would render as the last assistant
    turn: the ids after the prompt of the request without it, up to and with
    the stop token."""
    t, v = tpl(), vocab()
    end = v.special_id("<|im_end|>")
    assert end is not None
    out: list[Case] = []
    for req in chatml_requests(5, 8 * n, roles=("system", "user", "assistant", "tool"), thinking=True):
        msgs = req["messages"]
        if len(msgs) < 2 or msgs[-1]["role"] != "assistant":
            continue
        try:
            whole = t.encode({**req, "add_generation_prompt": False}, v)
            prompt = t.encode({**req, "messages": msgs[:-1], "add_generation_prompt": True}, v)
        except xtml.XtmlError:
            continue
        if whole[:len(prompt)] != prompt:
            continue  # the last message changes how the history is written
        last = len(whole) - 1 - whole[::-1].index(end)
        kwargs = {"enable_thinking": req.get("enable_thinking", True)}
        out.append({"prompt": prompt, "completion": whole[len(prompt):last + 1], "kwargs": kwargs})
        if len(out) == n:
            break
    return out


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
PARIS = ["get_weather", {"city": "Paris"}]


def hostile() -> list[tuple[str, Case, dict[str, Any]]]:
    """Answers that break a parser on text, each with what the model meant
    (reasoning, content, calls): a loss is a difference from it."""
    def case(completion: list[int]) -> Case:
        return {"prompt": tpl().encode([{"role": "user", "content": "Weather?"}], vocab()), "completion": completion,
                "kwargs": {"enable_thinking": True}}

    def meant(content: str = "", calls: tuple[Any, ...] | list[Any] = (), reasoning: str = "") -> dict[str, Any]:
        return {"reasoning": reasoning, "content": content, "tool_calls": list(calls)}

    marker_args = '{"city": "a </tool_call> b"}'
    head = ids('<tool_call>\n{"name": "get_weather", "arguments": {"city": "a ')
    tail = ids(' b"}}\n</tool_call><|im_end|>')
    return [
        ("marker text in arguments (ordinary ids)",
         case([*head, *spelled("</tool_call>"), *tail]), meant(calls=[["get_weather", json.loads(marker_args)]])),
        ("marker token in arguments", case([*head, *ids("</tool_call>"), *tail]),
         meant(calls=[["get_weather", json.loads(marker_args)]])),
        ("a marker in the reasoning (ordinary ids)",
         case([*ids("<think>\nI could use "), *spelled("<tool_call>"),
               *ids(" here\n</think>\n\nIt is sunny.<|im_end|>")]),
         meant("It is sunny.", reasoning="I could use <tool_call> here")),
        ("truncation inside a call", case(ids("Let me check.\n" + CALL[:45])), meant("Let me check.")),
        ("truncation inside the reasoning", case(ids("<think>\nFirst, the city")), meant(reasoning="First, the city")),
        ("a call, then text", case(ids(CALL + "\nIt is sunny there.<|im_end|>")),
         meant("It is sunny there.", [PARIS])),
        ("text, a call, text", case(ids("Checking.\n" + CALL + "\nDone.<|im_end|>")),
         meant("Checking.\nDone.", [PARIS])),
        ("an unknown tool", case(ids('<tool_call>\n{"name": "launch", "arguments": {"n": 1}}\n</tool_call><|im_end|>')),
         meant(calls=[["launch", {"n": 1}]])),
        ("malformed JSON", case(ids('<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n'
                                    '</tool_call><|im_end|>')), meant()),
        ("malformed JSON, then a good call",
         case(ids('<tool_call>\n{"name": "get_weather", "arguments": {city: Oslo}}\n</tool_call>\n' + CALL
                  + "<|im_end|>")), meant(calls=[PARIS])),
    ]


@cache
def cases() -> list[Case]:
    return [*generated(60), *(c for _, c, _ in hostile())]


@cache
def outcome() -> dict[str, Any]:
    python = need("vLLM python", "tests/run sets it up", env="XTML_VLLM_PYTHON")
    v = vocab()
    with tempfile.TemporaryDirectory(prefix="xtml-vllm-layout-") as tmp:
        path = Path(tmp) / "tokenizer.json"
        path.write_text(tokenizer_json(), encoding="utf-8")
        job = {"tokenizer": str(path), "dist": str(dist_folder(Path(tmp) / "dist")),
               "stop": [v.special_id("<|im_end|>")], "pairs": PAIRS,
               "cases": [{**c, "groupings": GROUPINGS} for c in cases()], "grammar_cases": grammar_cases()}
        env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_PLUGINS": "xtml", "XTML_TEMPLATE": "qwen3"}
        run = subprocess.run([python, "-P", str(DRIVER)], input=json.dumps(job), capture_output=True, text=True,
                             timeout=900, env=env, cwd=tmp)
    assert run.returncode == 0, run.stderr[-4000:]
    answer: dict[str, Any] = json.loads(run.stdout)
    return answer


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": False}}}]
ANSWERS = ["<think>\nThe tool.\n</think>\n\n" + CALL + "<|im_end|>", CALL + "<|im_end|>", "No call.<|im_end|>"]


def grammar_cases() -> list[dict[str, Any]]:
    stop = [vocab().special_id("<|im_end|>")]
    return [{"request": {"tools": TOOLS, "tool_choice": choice, "chat_template_kwargs": {"enable_thinking": True}},
             "stop": stop, "answers": [ids(a) for a in ANSWERS]} for choice in ("required", "auto")]


def expected(case: Case) -> dict[str, Any]:
    return parsed_message(tpl(), vocab(), case["completion"], case["kwargs"]["enable_thinking"])


def test_the_plugin_registers_the_layout_parsers() -> None:
    answer = outcome()
    assert answer["vllm"].startswith("0.33.")
    assert "xtml" in answer["registered"]["tool"] and "xtml" in answer["registered"]["reasoning"]
    assert answer["classes"][XTML] == ["XtmlLayoutToolParser", "XtmlLayoutReasoningParser"]
    assert all("error" not in row for row in answer["results"][XTML])


def test_whole_and_streamed_answers_are_read_on_their_ids() -> None:
    """Every answer, whole and in every grouping of its ids, with tools and
    without, is Template.parse's message of the generated ids, reasoning
    split off; the reasoning tokens are the block's."""
    answer = outcome()
    rows = answer["results"][XTML]
    assert len(rows) == len(cases()) and len(generated(60)) >= 50
    kinds: Counter[str] = Counter()
    for case, row in zip(cases(), rows, strict=True):
        want = expected(case)
        kinds.update(k for k in ("reasoning", "content", "tool_calls") if want[k])
        assert shaped(row["whole"]) == whole_answer(want), case
        assert [shaped(s) for s in row["streams"]] == [want] * len(GROUPINGS), case
        assert shaped(row["plain_whole"]) == whole_answer({**want, "tool_calls": []})
        assert shaped(row["plain_stream"]) == {**want, "tool_calls": []}
        assert row["reasoning_tokens"] == tpl().reasoning_tokens(case["completion"], vocab())
        assert row["ended_at_prompt"] is True  # the answer opens its own reasoning block
    assert min(kinds.values()) >= 10, kinds


def test_without_the_ids_whole_answers_are_read_from_their_text() -> None:
    """Where vLLM hands the parsers the text only (a vLLM the hook was not
    written for): each answer reads as xtml reads the ids its text reads
    back to, the reasoning split where the ids would split it; that is the
    generated ids' message unless the model spelled a marker with ordinary
    ids."""
    answer = outcome()
    t, v = tpl(), vocab()
    end = v.special_id("<|im_end|>")
    same = 0
    for case, row in zip(cases(), answer["results"][XTML], strict=True):
        generated = case["completion"]
        text_ids = generated[:-1] if generated and generated[-1] == end else generated
        back = t.completion_ids(v.decode(text_ids), v)
        want = parsed_message(t, v, back, True)
        assert shaped(row["text_whole"]) == whole_answer(want), case
        same += back == text_ids
    assert 0 < same < len(cases())


def test_tool_choice_required_hands_vllm_the_grammar() -> None:
    """tool_choice required: the tool parser hands vLLM's structured outputs
    the completion grammar, from the first generated id (the answer may open
    its reasoning block first); vLLM's xgrammar takes an answer with a call
    to its end, with or without reasoning, and refuses one without a call;
    auto hands nothing."""
    required, auto = outcome()["grammars"]
    assert required["structural_tag"] and not auto["structural_tag"]
    lengths = [len(ids(a)) for a in ANSWERS]
    thought, bare, prose = required["results"]
    assert thought == {"taken": lengths[0], "terminated": True}
    assert bare == {"taken": lengths[1], "terminated": True}
    assert prose["taken"] < lengths[2]


def test_silent_losses_on_hostile_answers() -> None:
    """Each hostile answer, whole and one id a delta: the losses (a call,
    an argument or text lost or changed) each parser makes, and those it
    makes without a report (no warning in the log for that answer). xtml
    loses only what it reports (an answer not written as the format writes
    one is repaired and said); vLLM's parsers read decoded text."""
    answer = outcome()
    first = len(cases()) - len(hostile())
    table: dict[str, Counter[str]] = {XTML: Counter(), VLLM: Counter()}
    lines = []
    for k, (name, _, meant) in enumerate(hostile()):
        cells = []
        for pair in (XTML, VLLM):
            row = answer["results"][pair][first + k]
            if "error" in row:
                table[pair]["raised"] += 1
                cells.append(f"{pair}: raised {row['error'][:60]}")
                continue
            whole, stream = losses(shaped(row["whole"]), meant), losses(shaped(row["streams"][0]), meant)
            silent_whole = whole if row["whole_reports"] == 0 else 0
            silent_stream = stream if row["stream_reports"][0] == 0 else 0
            table[pair].update({"whole": whole, "stream": stream, "silent whole": silent_whole,
                                "silent stream": silent_stream})
            cells.append(f"{pair}: lost {whole}/{stream}, silent {silent_whole}/{silent_stream}")
        lines.append(f"  {name}: " + "; ".join(cells))
    print("\nhostile answers (losses whole/streamed):\n" + "\n".join(lines))
    print("totals: " + "; ".join(f"{pair} {dict(c)}" for pair, c in table.items()))
    assert table[XTML]["silent whole"] == 0 and table[XTML]["silent stream"] == 0 and table[XTML]["raised"] == 0
    # The first two: xtml reads marker text in an argument on its ids; its
    # token there is a malformed call, withheld and reported.
    row = answer["results"][XTML][first]
    assert shaped(row["whole"])["tool_calls"] == hostile()[0][2]["tool_calls"] and row["whole_reports"] == 0
    assert table[VLLM]["silent whole"] + table[VLLM]["silent stream"] > 0


def test_beside_vllms_own_qwen3_parsers() -> None:
    """For the record (docs/vllm.md): how many generated answers each pair
    reads as Template.parse reads their ids, whole and one id a delta.
    vLLM's qwen3 reasoning parser reads an answer without a reasoning block
    as reasoning, and keeps the format's newlines in both fields."""
    answer = outcome()
    n = len(generated(60))
    counts = {}
    for pair in (XTML, VLLM):
        rows = answer["results"][pair][:n]
        whole = sum("whole" in r and shaped(r["whole"]) == whole_answer(expected(c)) for c, r in zip(cases(), rows))
        stream = sum("streams" in r and shaped(r["streams"][0]) == expected(c) for c, r in zip(cases(), rows))
        counts[pair] = (whole, stream)
    print(f"\nequal to Template.parse on the ids, of {n} generated answers (whole, streamed): {counts}")
    assert counts[XTML] == (n, n)
    no_block = [k for k, c in enumerate(cases()[:n]) if not expected(c)["reasoning"] and expected(c)["content"]
                and vocab().special_id("<|im_end|>") in c["completion"] and tpl().reasoning_tokens(
                    c["completion"], vocab()) == 0]
    assert no_block and any(shaped(answer["results"][VLLM][k]["whole"])["reasoning"] for k in no_block)
