"""Mistral Small 3.1's ids with a real Tekken vocabulary: mistral-common's
``tekken_240911.json`` (the 131k Tekken vocabulary, v3 config, 1000
special-token slots: the format's tokens at the ids mistral-common gives
them), converted to a tokenizer.json by transformers in vLLM's venv
(tests/helpers/tekken_driver.py). ``Template.encode_request`` of each
committed reference case the official template renders, where no content
spells a token of the format, equals mistral-common's own ids of the
official text: its special tokens as their ids, the text between as
``Tekkenizer.encode`` writes it.

The vocabulary is the one mistral-common ships, not the model's own
tekken.json (the tests run with no network); its special ids and its text
ranks are those the model's tokenizer builds on."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.family_cases import reference_cases
from tests.helpers.need import need
from tests.helpers.vllm_families import MISTRAL, tpl

pytestmark = pytest.mark.engines

ROOT = Path(__file__).parent.parent
DRIVER = Path(__file__).parent / "helpers" / "tekken_driver.py"
VOCABULARY = "tekken_240911.json"
# mistral-common's ids of the format's tokens in every Tekken vocabulary
# (Tekkenizer's first special slots), written down so a change shows.
SPECIAL_IDS = {"<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4, "[AVAILABLE_TOOLS]": 5, "[/AVAILABLE_TOOLS]": 6,
               "[TOOL_RESULTS]": 7, "[/TOOL_RESULTS]": 8, "[TOOL_CALLS]": 9, "[IMG]": 10, "[SYSTEM_PROMPT]": 17,
               "[/SYSTEM_PROMPT]": 18}


def _spells_a_token(request: dict[str, Any], tokens: tuple[str, ...]) -> bool:
    text = json.dumps(request, ensure_ascii=False)
    return any(t in text for t in tokens)


@cache
def reference() -> tuple[xtml.Vocabulary, list[tuple[dict[str, Any], list[int]]], dict[str, Any]]:
    """The vocabulary as xtml loads it, each checked case with
    mistral-common's ids of its official text, and the driver's answer."""
    python = need("vLLM python", "tests/run sets it up", env="XTML_VLLM_PYTHON")
    specials = tpl(MISTRAL).layout.special
    cases = [(case, text) for case, text, raises in reference_cases(MISTRAL)
             if text is not None and not _spells_a_token(case["request"], specials)]
    with tempfile.TemporaryDirectory(prefix="xtml-tekken-") as tmp:
        job = {"vocabulary": VOCABULARY, "out": tmp, "specials": list(specials), "texts": [t for _, t in cases]}
        run = subprocess.run([python, "-P", str(DRIVER)], input=json.dumps(job), capture_output=True, text=True,
                             timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp)
        assert run.returncode == 0, run.stderr[-4000:]
        answer: dict[str, Any] = json.loads(run.stdout)
        vocab = xtml.load_tokenizer(Path(tmp) / "tokenizer.json")
    return vocab, [(case, ids) for (case, _), ids in zip(cases, answer["ids"], strict=True)], answer


def test_the_vocabulary_is_mistral_commons_tekken() -> None:
    vocab, _, answer = reference()
    assert Path(answer["vocabulary"]).name == VOCABULARY
    assert answer["config"]["version"] == "v3" and answer["config"]["default_num_special_tokens"] == 1000
    assert vocab.size == answer["config"]["default_vocab_size"] == 131072
    assert answer["special_ids"] == SPECIAL_IDS
    assert {t: vocab.special_id(t) for t in SPECIAL_IDS} == SPECIAL_IDS


def test_encode_request_is_mistral_commons_ids_of_the_official_text() -> None:
    vocab, cases, _ = reference()
    t = tpl(MISTRAL)
    assert len(cases) >= 250, len(cases)
    tools = calls = 0
    for case, want in cases:
        got = t.encode_request(case["request"], vocab, **case["options"]).ids
        assert got == want, (case, vocab.decode(got), vocab.decode(want))
        tools += bool(case["request"].get("tools"))
        calls += any(m.get("tool_calls") for m in case["request"]["messages"])
    print(f"{len(cases)} cases equal, {tools} with tools, {calls} with calls in the history")
    assert tools >= 50 and calls >= 30, (tools, calls)
