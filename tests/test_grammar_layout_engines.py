"""The layout dialects' xgrammar grammars (EBNF and structural tag),
compiled and matched by xgrammar itself in the engines venv
(``XTML_ENGINES_PYTHON``, one run of tests/helpers/xgrammar_driver.py), on
the answers of tests/test_grammar_layout.py: each rendered answer the
request allows is taken id by id to a terminated matcher, each one it does
not allow is refused before its stop token. Two vocabularies: every token
of Qwen3's format one id, and the ChatML tokens alone (Qwen3's added
tokens are then text); the Kimi formats (calls in a section with ids of
their spelling, Kimi K2 Thinking's reasoning block) over a vocabulary with
every token of theirs one id; Llama 3.1 and DeepSeek V3.1 on the answers
of tests/test_grammar_bare.py, over vocabularies with every token of
theirs one id; GLM-4.6 on the answers of tests/test_grammar_glm46.py (its
calls' key/value pairs in any order); Mistral Small 3.1 on those of
tests/test_grammar_mistral31.py (its calls one JSON array); Gemma 4 on the answers without calls of
tests/test_grammar_gemma4.py (its value syntax writes no EBNF: the grammar of an answer that may call a
tool is refused); gpt-oss on those of tests/test_grammar_gptoss.py (its answer as several messages,
each closed by its own token). The GBNF grammar goes to a real llama-server in
tests/test_family_smollm2_engine.py."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.gemma_grammar import NO_CALLS
from tests.helpers.gemma_grammar import answer_texts as gemma_texts
from tests.helpers.gptoss_grammar import answer_texts as gptoss_texts
from tests.helpers.layout_grammar import (
    ANSWERS,
    BARE,
    BARE_ANSWERS,
    GEMMA,
    GLM,
    GLM_ANSWERS,
    GPTOSS,
    KIMI,
    MISTRAL,
    QWEN3,
    answer_ids,
    bare_request,
    kimi_answers,
    token_ids,
    vocab,
)
from tests.helpers.mistral_grammar import answer_texts
from tests.helpers.need import need

pytestmark = pytest.mark.engines

DRIVER = Path(__file__).parent / "helpers" / "xgrammar_driver.py"
FORMATS = ("xgrammar", "xgrammar-tag")


Answers = list[tuple[dict[str, Any], dict[str, Any], bool]]


def _match(tpl: Any, kind: str, answers: Answers | list[tuple[dict[str, Any], str, bool]]) -> tuple[
        str, list[tuple[str, int, bool, dict[str, Any]]]]:
    """Each answer (a message, or text with the format's tokens spelled)
    matched by xgrammar under the grammar of its request, in each format."""
    python = need("engines python", "tests/run sets it up", env="XTML_ENGINES_PYTHON")
    v = vocab(kind)
    grammars: dict[str, int] = {}
    cases: list[dict[str, Any]] = []
    keys: list[tuple[str, int, bool]] = []
    for fmt in FORMATS:
        for k, case in enumerate(answers):
            extra, good = case[0], case[2]
            answer: Any = case[1]
            request = bare_request(extra)
            g = tpl.completion_grammar(request, v, format=fmt)
            entry = {"structural_tag": g} if fmt == "xgrammar-tag" else {"ebnf": g}
            index = grammars.setdefault(json.dumps(entry), len(grammars))
            ids = token_ids(tpl, v, answer) if isinstance(answer, str) else answer_ids(tpl, request, answer, v)
            cases.append({"grammar": index, "ids": ids})
            keys.append((fmt, k, good))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tokenizer.json"
        v.tokenizer.save(str(path))
        b = tpl.bind(v)
        job = {"tokenizer": str(path), "special_ids": sorted(v.special_ids()),
               "stop_ids": list(b.stop_ids), "grammars": [json.loads(g) for g in grammars],
               "cases": cases}
        run = subprocess.run([python, "-I", str(DRIVER)], input=json.dumps(job), capture_output=True, text=True,
                             timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    answer = json.loads(run.stdout)
    return answer["xgrammar"], [(*key, r) for key, r in zip(keys, answer["results"], strict=True)]


def _wrong_stop(text: str) -> bool:
    return text.endswith("</tool_call><|user|>") or (text.endswith("<|observation|>") and "<tool_call>" not in text)


@pytest.mark.parametrize(("name", "kind"), [("qwen3", "qwen3"), ("qwen3", "chatml"), ("kimi-k2", "kimi-k2"),
                                           ("kimi-k2-thinking", "kimi-k2-thinking"), ("llama-3.1", "llama-3.1"),
                                           ("deepseek-v3.1", "deepseek-v3.1"), ("glm-4.6", "glm-4.6"),
                                           ("mistral-small-3.1", "mistral-small-3.1"), ("gemma-4", "gemma-4"),
                                           ("gpt-oss", "gpt-oss")])
def test_xgrammar_takes_the_rendered_answers_and_refuses_the_others(name: str, kind: str) -> None:
    answers: Any
    if name in BARE:
        # xgrammar ends where the engine's stop ids come (all of the
        # format's stops): content that ends with <|eom_id|>, which only the
        # llguidance grammar, holding the stop itself, refuses, is left out.
        tpl, answers = BARE[name], [a for a in BARE_ANSWERS[name] if a[1] != "It is sunny.<|eom_id|>"]
    elif name == "glm-4.6":
        # Likewise an answer refused for its stop alone (calls that end
        # with <|user|>, content with <|observation|>) is left out.
        tpl, answers = GLM, [a for a in GLM_ANSWERS if not _wrong_stop(a[1])]
    elif name == MISTRAL.name:
        tpl, answers = MISTRAL, answer_texts()
    elif name == GEMMA.name:
        tpl, answers = GEMMA, gemma_texts(NO_CALLS)
    elif name == GPTOSS.name:
        tpl, answers = GPTOSS, gptoss_texts()
    else:
        tpl, answers = (QWEN3, ANSWERS) if name == "qwen3" else (KIMI[name], kimi_answers())
    version, results = _match(tpl, kind, answers)
    wrong = []
    for fmt, k, good, r in results:
        taken = r["refused"] is None and r["terminated"]
        if taken != good:
            wrong.append((fmt, answers[k][0], answers[k][1], r))
    assert not wrong, f"xgrammar {version}: {wrong}"
