"""llama.cpp's server as a parser of each family's answers (what
bench/bench_llamacpp_families.py counts), on a few of them: a real
llama-server per family running SmolLM2 with the family's official chat
template, each answer handed over as the assistant message to continue and
the model held to adding nothing (tests/helpers/llamacpp_families.py).

Checked: the server reads each answer as written (its prompt is its own
generation prompt followed by exactly the answer's text, and the model
added no token), or, where its template wraps an answer that opens no
reasoning in a message of its own (gpt-oss), the answer is counted as
refused; xtml's own parse of the same ids loses nothing without a
diagnostic; and a loss of llama.cpp's on a cut call is counted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import llamacpp_families as lf
from tests.helpers import vllm_families as vf
from tests.helpers.families import smollm2_gguf
from tests.helpers.need import need

pytestmark = pytest.mark.engines

N_GENERATED = 1
HOSTILE = ("a marker in the content (ordinary ids)", "truncation inside a call")
# llama.cpp's Kimi parser writes an empty reasoning before a continued
# message (K2 and K2 Thinking share it); every other family's parse input
# is the generation prompt and the answer alone.
BETWEEN = {"kimi-k2": "<think></think>"}
# Where the content follows the answer's last header rather than a closed
# reasoning block (harmony's messages).
CONTENT_AFTER = {"gpt-oss": "<|message|>"}
# Families whose template writes something of its own before a continued
# answer that opens no reasoning (with thinking on): what it writes, and
# whether the answer is then read as written. One such answer is read too.
UNOPENED = {"gemma-4": ("<|channel>thought\n<channel|>", True),
            "gpt-oss": ("<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>", False)}

Rows = list[tuple[lf.Case, dict[str, Any]]]


@pytest.fixture(scope="module", params=lf.FAMILIES)
def read(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Rows]]:
    name: str = request.param
    binary = need("llama-server", "tests/run (builds it once), or set XTML_LLAMA_SERVER", env="XTML_LLAMA_SERVER")
    model = smollm2_gguf()
    cases = [c for c in lf.cases(name, N_GENERATED) if c.kind == "generated" or c.what in HOSTILE]
    assert len(cases) == N_GENERATED + len(HOSTILE)
    if name in UNOPENED:
        opening = lf.OPENS.get(name) or (vf.BY_NAME[name].think or ("",))[0]
        cases.append(next(c for c in lf.cases(name, None, 0) if c.text and not c.text.startswith(opening)
                          and c.kwargs.get("enable_thinking", True)))
    rows: Rows = []
    for server in lf.started(binary, model, name, tmp_path_factory.mktemp(f"llamacpp-{name}")):
        rows = [(c, server.read(c)) for c in cases]
        # Its parse is on text: a marker token of the family is text in
        # SmolLM2's vocabulary, and the log names the parser built for it
        # (``peg-native``, or one of a family's own: ``peg-gemma4``).
        assert "peg-" in server.picked()
    yield name, rows


def test_the_server_reads_each_answer_as_written(read: tuple[str, Rows]) -> None:
    name, rows = read
    if name in UNOPENED:
        # The answer that opens no reasoning: llama.cpp writes its own
        # opening before it, a closed empty block (read on) or a message
        # header around the answer (counted as refused, never as read).
        (case, row), rows = rows[-1], rows[:-1]
        between, readable = UNOPENED[name]
        assert row["inserted"] == between, case.what
        assert ("unforced" not in row) is readable, row
        counted = lf.count(name, [(case, row)])
        assert counted["llamacpp"]["generated"]["refused"] == (0 if readable else 1)
        assert counted["unforced"] == ([] if readable else [case.what])
    for case, row in rows:
        # An error answer (llama.cpp refusing what its parser cannot
        # match) is a report, and a result too; a 200 one came from a
        # model that added nothing.
        assert row["inserted"] == BETWEEN.get(name, ""), case.what
        if "error" in row:
            continue
        assert row["completion_tokens"] == 1 and row["finish_reason"] != "length", case.what
    # Content with no markers around it comes back as it was written.
    case, row = next((c, r) for c, r in rows if c.what == HOSTILE[0])
    # (Where llama.cpp writes a closed reasoning block of its own first, the
    # answer's own block is content to it.)
    close = "" if BETWEEN.get(name) else CONTENT_AFTER.get(name) or (vf.BY_NAME[name].think or ("", ""))[1]
    assert row["got"]["content"] == (case.text.split(close)[-1] if close else case.text)


def test_xtml_loses_nothing_silently(read: tuple[str, Rows]) -> None:
    name, rows = read
    counted = lf.count(name, rows)
    assert counted["xtml"]["generated"] == {"lost": 0, "silent": 0}
    assert counted["xtml"]["hostile"]["silent"] == 0
    # (Only the answer that opens no reasoning may be one llama.cpp cannot read as written.)
    readable = UNOPENED.get(name, ("", True))[1]
    assert counted["unforced"] == ([] if readable else [rows[-1][0].what])


def test_a_cut_call_llamacpp_returns_is_counted(read: tuple[str, Rows]) -> None:
    # Every family's parser in llama.cpp hands back a call cut inside its
    # arguments as a call, with the cut text as its arguments, and says
    # nothing: one silent loss, which the count must find.
    name, rows = read
    case, row = next((c, r) for c, r in rows if c.what == HOSTILE[1])
    assert case.want["tool_calls"] == []  # the cut call was never made
    assert "error" not in row, row
    [(called, arguments)] = row["got"]["tool_calls"]
    # (The cut text itself, or, where arguments are pairs, an object of it.)
    assert called == "get_weather" and isinstance(arguments, str) and arguments.endswith("Pa")
    assert case.text.endswith(arguments) or arguments == '{"city":"Pa'
    counted = lf.count(name, rows)
    # (One loss, the call; where the format writes reasoning first, llama.cpp
    # may read other text of the answer otherwise too.)
    lost = [int(x.rsplit(": ", 1)[1]) for x in counted["lost"] if x.startswith(f"hostile: {case.what}: ")]
    assert lost and lost[0] >= 1, counted["lost"]
    assert counted["llamacpp"]["hostile"]["silent"] >= 1
