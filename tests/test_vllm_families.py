"""xtml's vLLM parsers with each round-one layout dialect
(``XTML_TEMPLATE=llama-3.1``, ``deepseek-v3.1``, ``kimi-k2``,
``kimi-k2-thinking``), beside vLLM's own parsers for the same family
(``llama3_json``; ``deepseek_v31`` with the ``deepseek_v3`` reasoning
parser; ``kimi_k2``, with its reasoning parser for the thinking model),
all inside vLLM 0.33 in one run. Generated answers (the last assistant turn
of the family's seeded requests, as the dialect renders it) read whole and
streamed as ``Template.parse`` reads their ids; hostile answers (marker text
and marker tokens in arguments, cuts inside a call or the reasoning, text
around calls, unknown tools, malformed JSON): the losses each parser makes
without a report, counted, and none for xtml."""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.family_requests import family_requests
from tests.helpers.need import need
from tests.helpers.tokenizers import deepseek_path
from tests.helpers.vllm import as_json, dist_folder, parsed_message
from xtml.template import LayoutTemplate

pytestmark = pytest.mark.engines

ROOT = Path(__file__).parent.parent
DRIVER = Path(__file__).parent / "helpers" / "vllm_families_driver.py"
GROUPINGS = [[1], [4], [random.Random(k).randint(1, 16) for k in range(50)]]
XTML = "xtml+xtml"
N_GENERATED = 24


@dataclass(frozen=True)
class Family:
    """How one family's answers are spelled, for the hostile ones."""

    name: str
    vllm: str
    """vLLM's own parsers for it: ``tool+reasoning``."""
    call: Callable[[str, str, int], str]
    """One call's text: name, arguments' JSON text, its index."""
    section: str
    """The calls' section, ``%s`` the calls (``%s`` alone: none)."""
    end: str
    marker: str
    """A token of the format that is not a stop: the one a call's arguments
    are ended by, where the format has one."""
    think: tuple[str, str] | None = None
    """How an answer opens and closes its reasoning (the prompt may open it)."""
    bare: bool = False
    """A call is the whole answer, with no marker around it (Llama 3.1's
    JSON): a call between text is text (the JSON an answer shows, say)."""
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def pair(self) -> list[str | None]:
        tool, reasoning = self.vllm.split("+")
        return [tool, None if reasoning == "None" else reasoning]


def _kimi_call(name: str, args: str, k: int) -> str:
    return f"<|tool_call_begin|>functions.{name}:{k}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


FAMILIES = [
    Family("llama-3.1", "llama3_json+None", lambda n, a, k: f'{{"name": "{n}", "parameters": {a}}}', "%s",
           "<|eot_id|>", "<|python_tag|>", bare=True),
    Family("deepseek-v3.1", "deepseek_v31+deepseek_v3",
           lambda n, a, k: f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{a}<｜tool▁call▁end｜>",
           "<｜tool▁calls▁begin｜>%s<｜tool▁calls▁end｜>", "<｜end▁of▁sentence｜>", "<｜tool▁call▁end｜>",
           think=("", "</think>"), options={"thinking": True}),
    Family("kimi-k2", "kimi_k2+None", _kimi_call, "<|tool_calls_section_begin|>%s<|tool_calls_section_end|>",
           "<|im_end|>", "<|tool_call_end|>"),
    Family("kimi-k2-thinking", "kimi_k2+kimi_k2", _kimi_call,
           "<|tool_calls_section_begin|>%s<|tool_calls_section_end|>", "<|im_end|>", "<|tool_call_end|>",
           think=("<think>", "</think>")),
]
BY_NAME = {f.name: f for f in FAMILIES}


def tpl(name: str) -> LayoutTemplate:
    t = xtml.load(name)
    assert isinstance(t, LayoutTemplate)
    return t


@cache
def tokenizer_json(name: str) -> str:
    """A byte-level BPE vocabulary with the dialect's tokens as its model's
    tokenizer has them: the special ones special, the added ones added (one
    id each, not special)."""
    from tokenizers import AddedToken, Tokenizer

    d = tpl(name).layout
    tok = Tokenizer.from_file(deepseek_path())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in d.special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in d.added])
    return str(tok.to_str())


@cache
def vocab(name: str) -> xtml.Vocabulary:
    from tokenizers import Tokenizer

    return xtml.Vocabulary(Tokenizer.from_str(tokenizer_json(name)))


@cache
def plain() -> xtml.Vocabulary:
    """The same ids without any format's tokens: what a model spelling a
    marker with ordinary tokens writes."""
    return xtml.load_tokenizer(deepseek_path())


def ids(name: str, text: str) -> list[int]:
    """An answer's ids: each of the format's token strings its id."""
    return tpl(name).completion_ids(text, vocab(name))


def spelled(text: str) -> list[int]:
    """Text in ordinary ids only, a marker string included: a character at
    a time, as the base vocabulary holds some formats' markers (DeepSeek's)
    as tokens of its own."""
    return [i for ch in text for i in plain().ids_of([ch])[0]]


def stops(name: str) -> list[int]:
    return list(tpl(name).bind(vocab(name)).stop_ids)


Case = dict[str, Any]


@cache
def generated(name: str) -> list[Case]:
    """Answers the official template renders as an assistant turn of the
    family's seeded requests (each the last of the conversation up to it):
    the ids after the prompt of the conversation before it, up to and with
    its last stop id; half with calls where there are enough."""
    t, v = tpl(name), vocab(name)
    end = set(stops(name))
    found: list[Case] = []
    for case, k in ((c, k) for c in family_requests(name, n=120) for k in range(1, len(c["request"]["messages"]))):
        opts = case["options"]
        msgs = case["request"]["messages"][:k + 1]
        req = {**case["request"], "messages": msgs}
        if msgs[-1]["role"] != "assistant" or all(m["role"] == "system" for m in msgs[:-1]):
            continue
        try:
            whole = t.encode({**req, "add_generation_prompt": False}, v, **opts)
            prompt = t.encode({**req, "messages": msgs[:-1], "add_generation_prompt": True}, v, **opts)
        except xtml.XtmlError:
            continue
        if whole[:len(prompt)] != prompt or not end.intersection(whole[len(prompt):]):
            continue  # the last message changes how the history is written
        last = max(k for k, i in enumerate(whole) if i in end)
        found.append({"prompt": prompt, "completion": whole[len(prompt):last + 1], "kwargs": dict(opts)})
    # The few that hold reasoning first, then as many with calls as without.
    thought = [c for c in found if expected(name, c)["reasoning"]][:N_GENERATED // 4]
    rest = [c for c in found if c not in thought]
    with_calls = [c for c in rest if expected(name, c)["tool_calls"]]
    without = [c for c in rest if not expected(name, c)["tool_calls"]]
    half = (N_GENERATED - len(thought)) // 2
    return [*thought, *with_calls[:max(half, N_GENERATED - len(thought) - len(without))],
            *without[:max(half, N_GENERATED - len(thought) - len(with_calls))]][:N_GENERATED]


def meant(content: str = "", calls: list[Any] | tuple[Any, ...] = (), reasoning: str = "") -> dict[str, Any]:
    return {"reasoning": reasoning, "content": content, "tool_calls": list(calls)}


PARIS = ["get_weather", {"city": "Paris"}]


@cache
def hostile(name: str) -> list[tuple[str, Case, dict[str, Any]]]:
    """Answers that break a parser on text, each with what the model meant
    (reasoning, content, calls): a loss is a difference from it. A family
    whose answers open with reasoning opens each with a short one."""
    f, t, v = BY_NAME[name], tpl(name), vocab(name)
    prompt = t.encode({"messages": [{"role": "user", "content": "Weather?"}], "add_generation_prompt": True,
                       **f.options}, v)

    def case(completion: list[int]) -> Case:
        return {"prompt": prompt, "completion": completion, "kwargs": dict(f.options)}

    think = "Hmm." if f.think else ""
    opened = f"{f.think[0]}{think}{f.think[1]}" if f.think else ""

    def say(content: str = "", calls: list[Any] | tuple[Any, ...] = ()) -> dict[str, Any]:
        return meant(content, calls, think)

    def calls(*each: tuple[str, str]) -> str:
        return f.section % "".join(f.call(n, a, k) for k, (n, a) in enumerate(each))

    good = calls(("get_weather", '{"city": "Paris"}'))
    marker_args = {"city": f"a {f.marker} b"}
    head, tail = (opened + calls(("get_weather", '{"city": "a @@ b"}')) + f.end).split("@@")
    cut = opened + "Let me check." + good[:good.index("Paris") + 2]
    out = [
        ("marker text in arguments (ordinary ids)", case([*ids(name, head), *spelled(f.marker), *ids(name, tail)]),
         say(calls=[["get_weather", marker_args]])),
        ("marker token in arguments", case(ids(name, head + f.marker + tail)),
         say(calls=[["get_weather", marker_args]])),
        ("a marker in the content (ordinary ids)",
         case([*ids(name, opened + "I could use "), *spelled(f.marker), *ids(name, " here." + f.end)]),
         say(f"I could use {f.marker} here.")),
        ("truncation inside a call", case(ids(name, cut)), say("Let me check.")),
        ("a call, then text", case(ids(name, opened + good + "\nIt is sunny there." + f.end)),
         say("It is sunny there.", [PARIS])),
        ("text, a call, text", case(ids(name, opened + "Checking.\n" + good + "\nDone." + f.end)),
         say(f"Checking.\n{good}\nDone.") if f.bare else say("Checking.\nDone.", [PARIS])),
        ("an unknown tool", case(ids(name, opened + calls(("launch", '{"n": 1}')) + f.end)),
         say(calls=[["launch", {"n": 1}]])),
        ("malformed JSON", case(ids(name, opened + calls(("get_weather", "{city: Paris}")) + f.end)), say()),
        ("malformed JSON, then a good call",
         case(ids(name, opened + calls(("get_weather", "{city: Oslo}"), ("get_weather", '{"city": "Paris"}'))
                  + f.end)), say(calls=[PARIS])),
        ("two calls", case(ids(name, opened + calls(("get_weather", '{"city": "Paris"}'),
                                                    ("get_weather", '{"city": "Oslo"}')) + f.end)),
         say(calls=[PARIS, ["get_weather", {"city": "Oslo"}]])),
    ]
    if f.think is not None:
        start, close = f.think
        out += [
            ("a marker in the reasoning (ordinary ids)",
             case([*ids(name, start + "I could use "), *spelled(close),
                   *ids(name, f" here{close}It is sunny.{f.end}")]),
             meant("It is sunny.", reasoning=f"I could use {close} here")),
            ("truncation inside the reasoning", case(ids(name, start + "First, the city")),
             meant(reasoning="First, the city")),
        ]
    return out


@cache
def cases(name: str) -> list[Case]:
    return [*generated(name), *(c for _, c, _ in hostile(name))]


@cache
def outcome() -> dict[str, Any]:
    python = need("vLLM python", "tests/run sets it up", env="XTML_VLLM_PYTHON")
    with tempfile.TemporaryDirectory(prefix="xtml-vllm-families-") as tmp:
        families = []
        for f in FAMILIES:
            path = Path(tmp) / f"{f.name}.json"
            path.write_text(tokenizer_json(f.name), encoding="utf-8")
            families.append({"template": f.name, "tokenizer": str(path), "stop": stops(f.name),
                             "pairs": [["xtml", "xtml"], f.pair],
                             "cases": [{**c, "groupings": GROUPINGS} for c in cases(f.name)]})
        job = {"dist": str(dist_folder(Path(tmp) / "dist")), "families": families}
        env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_PLUGINS": "xtml"}
        run = subprocess.run([python, "-P", str(DRIVER)], input=json.dumps(job), capture_output=True, text=True,
                             timeout=1800, env=env, cwd=tmp)
    assert run.returncode == 0, run.stderr[-4000:]
    answer: dict[str, Any] = json.loads(run.stdout)
    return answer


def expected(name: str, case: Case) -> dict[str, Any]:
    return parsed_message(tpl(name), vocab(name), case["completion"], True)


def shaped(got: dict[str, Any]) -> dict[str, Any]:
    return {"reasoning": got["reasoning"] or "", "content": got["content"] or "",
            "tool_calls": [[name, as_json(args)] for name, args in got["tool_calls"]]}


def whole_answer(message: dict[str, Any]) -> dict[str, Any]:
    """As vLLM 0.33's whole path returns a message: content that is only
    white space beside tool calls is no content."""
    if message["tool_calls"] and not message["content"].strip():
        return {**message, "content": ""}
    return message


def losses(got: dict[str, Any], want: dict[str, Any]) -> int:
    """Calls missing or changed, and text changed, against what was meant."""
    n = int(got["reasoning"].strip() != want["reasoning"].strip())
    n += int(got["content"].strip() != want["content"].strip())
    have = Counter(json.dumps(c, sort_keys=True) for c in got["tool_calls"])
    meant_calls = Counter(json.dumps(c, sort_keys=True) for c in want["tool_calls"])
    return n + sum((meant_calls - have).values()) + sum((have - meant_calls).values())


def test_every_family_is_read_with_its_own_template() -> None:
    answer = outcome()
    assert answer["vllm"].startswith("0.33.")
    assert "xtml" in answer["registered"]["tool"] and "xtml" in answer["registered"]["reasoning"]
    for f in FAMILIES:
        got = answer["families"][f.name]
        assert got["classes"][XTML] == ["XtmlLayoutToolParser", "XtmlLayoutReasoningParser"], f.name
        assert got["templates"][XTML] == f.name
        assert all("error" not in row for row in got["results"][XTML]), f.name


@pytest.mark.parametrize("name", [f.name for f in FAMILIES])
def test_whole_and_streamed_answers_are_template_parse(name: str) -> None:
    """Every generated answer, whole and in every grouping of its ids, with
    tools and without, is Template.parse's message of the generated ids;
    the reasoning tokens are the template's count."""
    rows = outcome()["families"][name]["results"][XTML]
    assert len(rows) == len(cases(name)) and len(generated(name)) >= N_GENERATED * 3 // 4
    kinds: Counter[str] = Counter()
    t, v = tpl(name), vocab(name)
    for case, row in zip(cases(name), rows, strict=True):
        want = expected(name, case)
        kinds.update(k for k in ("reasoning", "content", "tool_calls") if want[k])
        assert shaped(row["whole"]) == whole_answer(want), case
        assert [shaped(s) for s in row["streams"]] == [want] * len(GROUPINGS), case
        assert shaped(row["plain_whole"]) == whole_answer({**want, "tool_calls": []}), case
        assert shaped(row["plain_stream"]) == {**want, "tool_calls": []}, case
        assert row["reasoning_tokens"] == t.reasoning_tokens(case["completion"], v), case
    assert kinds["tool_calls"] >= 5 and kinds["content"] >= 5, kinds
    if BY_NAME[name].think is not None:
        assert kinds["reasoning"] >= 1, kinds


def test_silent_losses_on_hostile_answers() -> None:
    """Each hostile answer, whole and one id a delta, through xtml's parsers
    and vLLM's own: the losses (a call, an argument or text lost or
    changed), and those made without a report (no warning in the log for
    that answer). xtml loses only what it reports; vLLM's counts are
    measured and printed."""
    answer = outcome()
    table: list[tuple[str, str, Counter[str]]] = []
    lines = []
    for f in FAMILIES:
        first = len(generated(f.name))
        for pair in (XTML, f.vllm):
            counts: Counter[str] = Counter()
            rows = answer["families"][f.name]["results"][pair]
            for k, (what, _, want) in enumerate(hostile(f.name)):
                row = rows[first + k]
                counts["answers"] += 1
                if "error" in row:
                    counts["raised"] += 1
                    lines.append(f"  {f.name} {pair} {what}: raised {row['error'][:80]}")
                    continue
                whole, stream = losses(shaped(row["whole"]), want), losses(shaped(row["streams"][0]), want)
                silent_whole = whole if row["whole_reports"] == 0 else 0
                silent_stream = stream if row["stream_reports"][0] == 0 else 0
                counts.update({"lost whole": whole, "lost streamed": stream, "silent whole": silent_whole,
                               "silent streamed": silent_stream})
                if silent_whole or silent_stream:
                    lines.append(f"  {f.name} {pair} {what}: silent {silent_whole}/{silent_stream}")
            table.append((f.name, pair, counts))
    head = f"{'family':<18}{'parsers':<26}{'answers':>8}{'silent whole':>14}{'silent streamed':>17}" \
           f"{'lost whole':>12}{'lost streamed':>15}{'raised':>8}"
    body = [f"{n:<18}{p:<26}{c['answers']:>8}{c['silent whole']:>14}{c['silent streamed']:>17}"
            f"{c['lost whole']:>12}{c['lost streamed']:>15}{c['raised']:>8}" for n, p, c in table]
    print("\nhostile answers, silent losses per family (xtml vs vLLM 0.33's own):\n" + "\n".join([head, *body]))
    print("silent losses:\n" + "\n".join(lines))
    for name, pair, c in table:
        if pair == XTML:
            assert c["silent whole"] == 0 and c["silent streamed"] == 0 and c["raised"] == 0, name
        else:
            assert c["answers"] == len(hostile(name))  # measured: every answer went through


def test_beside_vllms_own_parsers_on_generated_answers() -> None:
    """For the record: how many generated answers each pair reads as
    Template.parse reads their ids, whole and one id a delta."""
    answer = outcome()
    lines = []
    for f in FAMILIES:
        n = len(generated(f.name))
        for pair in (XTML, f.vllm):
            rows = answer["families"][f.name]["results"][pair][:n]
            pairs = list(zip(generated(f.name), rows, strict=True))
            whole = sum("whole" in r and shaped(r["whole"]) == whole_answer(expected(f.name, c)) for c, r in pairs)
            stream = sum("streams" in r and shaped(r["streams"][0]) == expected(f.name, c) for c, r in pairs)
            lines.append(f"  {f.name:<18}{pair:<26}{whole:>4}/{n} whole {stream:>4}/{n} streamed")
            if pair == XTML:
                assert (whole, stream) == (n, n), f.name
    print("\ngenerated answers equal to Template.parse on their ids:\n" + "\n".join(lines))
