"""gpt-oss against openai-harmony, OpenAI's own renderer and parser of the
format, run in the vLLM environment (tests/helpers/harmony_driver.py) on
the o200k vocabulary with gpt-oss's tokens at their ids: the prompt xtml
renders is harmony's, token for token; what harmony writes as an answer
xtml reads strictly; what xtml renders as an answer harmony's
StreamableParser reads as the same messages.

harmony's encoding and xtml's vocabulary read the o200k ranks from a file
(no network here): XTML_O200K_DIR names a folder holding
``o200k_base.tiktoken`` (sha256 ``446a9538…1a2d``; the llama-index-core
wheel ships it under ``llama_index/core/_static/tiktoken_cache`` as
``fb374d419588a4632f3f557e76b4b70aebbca790``)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import xtml
from xtml.vocab.tiktoken import TiktokenVocabulary, load_tiktoken

FILE = Path(xtml.__file__).resolve().parent / "dialects" / "gpt-oss.toml"
DRIVER = Path(__file__).resolve().parent / "helpers" / "harmony_driver.py"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
SPECIAL = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
           200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>",
           200018: "<|endofprompt|>"}
IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."


def _folder() -> Path:
    python, folder = os.environ.get("XTML_VLLM_PYTHON"), os.environ.get("XTML_O200K_DIR")
    if not python or not folder:
        _missing("openai-harmony runs in the vLLM environment (XTML_VLLM_PYTHON) on the o200k ranks "
                 "(XTML_O200K_DIR)")
    assert python and folder
    path = Path(folder) / "o200k_base.tiktoken"
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != O200K_SHA256:
        _missing(f"no o200k_base.tiktoken of sha256 {O200K_SHA256} in {folder}")
    return Path(folder)


def _missing(why: str) -> None:
    # tests/run sets both up: under CI=true a missing one is a broken set-up.
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why}; tests/run sets it up (with CI=true a missing tool is an error)", pytrace=False)
    pytest.skip(f"{why}; tests/run sets it up")


@cache
def vocabulary(folder: Path, tmp: Path) -> TiktokenVocabulary:
    """o200k with harmony's special tokens at their ids, split by o200k's
    own pattern (tiktoken reads it, the ranks from a cache it is given)."""
    import tiktoken

    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    cached = tmp / "tiktoken-cache"
    cached.mkdir(exist_ok=True)
    shutil.copy(folder / "o200k_base.tiktoken", cached / hashlib.sha1(url.encode()).hexdigest())
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cached)
    pattern = tiktoken.get_encoding("o200k_base")._pat_str
    decoder = {str(i): {"content": SPECIAL.get(i, f"<|reserved_{i}|>"), "special": True}
               for i in range(199998, 200019)}
    config = tmp / "tokenizer_config.json"
    config.write_text(json.dumps({"added_tokens_decoder": decoder}), encoding="utf-8")
    return load_tiktoken(folder / "o200k_base.tiktoken", config, pattern)


def harmony(folder: Path, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    env = {**os.environ, "TIKTOKEN_ENCODINGS_BASE": str(folder)}
    done = subprocess.run([os.environ["XTML_VLLM_PYTHON"], str(DRIVER)], input=json.dumps(jobs), text=True,
                          capture_output=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout)
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[xtml.Template, TiktokenVocabulary, Path]:
    folder = _folder()
    return xtml.load(str(FILE)), vocabulary(folder, tmp_path_factory.mktemp("o200k")), folder


def _system(effort: str, date: str) -> dict[str, Any]:
    return {"role": "system", "identity": IDENTITY, "effort": effort, "date": date}


CALL = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def test_the_prompt_is_harmonys(setup: tuple[xtml.Template, TiktokenVocabulary, Path]) -> None:
    """A conversation without tools, its answers' analysis dropped as
    harmony drops it, the generation prompt after the last user message:
    harmony's ids. With instructions, the template (which the dialect
    follows) writes a blank line after them, harmony none."""
    tpl, v, folder = setup
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "héllo 日本"},
                                  {"role": "assistant", "content": "Hi!", "reasoning_content": "greet"},
                                  {"role": "user", "content": "more"}]
    theirs = [_system("low", "2025-06-28"), {"role": "user", "text": "héllo 日本"},
              {"role": "assistant", "channel": "final", "text": "Hi!"}, {"role": "user", "text": "more"}]
    out = harmony(folder, [{"complete": True, "render": theirs}, {"complete": True, "render": [
        theirs[0], {"role": "developer", "instructions": "Be brief."}, *theirs[1:]]}])
    ours = tpl.encode({"messages": msgs}, v, date="2025-06-28", reasoning_effort="low")
    assert ours == out["results"][0]
    instructed = tpl.encode({"messages": [{"role": "system", "content": "Be brief."}, *msgs]}, v, date="2025-06-28",
                            reasoning_effort="low")
    assert instructed != out["results"][1]
    assert v.decode(instructed).replace("Be brief.\n\n<|end|>", "Be brief.<|end|>") == v.decode(out["results"][1])
    # harmony's stops for an answer are the format's ends: <|return|> and <|call|>.
    assert sorted(tpl.bind(v).stop_ids) == sorted(out["stop"])
    assert tpl.parse(ours, v)["messages"][-1] == {"role": "user", "content": "more"}


ANSWERS: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
    ([{"role": "assistant", "channel": "analysis", "text": "The user greets."},
      {"role": "assistant", "channel": "final", "text": "Hello there."}],
     {"role": "assistant", "content": "Hello there.", "reasoning_content": "The user greets."}),
    ([{"role": "assistant", "channel": "analysis", "text": "Need weather."},
      {"role": "assistant", "channel": "commentary", "recipient": "functions.get_weather",
       "content_type": "<|constrain|>json", "text": '{"city": "Paris"}'}],
     {"role": "assistant", "content": "", "reasoning_content": "Need weather.", "tool_calls": [CALL]}),
    ([{"role": "assistant", "channel": "commentary", "text": "Checking the weather."},
      {"role": "assistant", "channel": "commentary", "recipient": "functions.get_weather", "content_type": "json",
       "text": '{"city": "Paris"}'}],
     {"role": "assistant", "content": "Checking the weather.", "tool_calls": [CALL]}),
]


def test_answers_harmony_writes_read_strictly(setup: tuple[xtml.Template, TiktokenVocabulary, Path]) -> None:
    tpl, v, folder = setup
    head = [_system("medium", "2025-01-01"), {"role": "user", "text": "q"}]
    jobs = [{"complete": True, "render": head}] + [{"render": head + msgs, "keep_analysis": True}
                                                   for msgs, _ in ANSWERS]
    out = harmony(folder, jobs)["results"]
    prompt = out[0]
    for whole, (_, want) in zip(out[1:], ANSWERS, strict=True):
        assert whole[:len(prompt)] == prompt
        answer = whole[len(prompt):]
        assert tpl.parse(answer, v, completion=True) == want, v.decode(answer)


def test_harmony_reads_the_answers_xtml_writes(setup: tuple[xtml.Template, TiktokenVocabulary, Path]) -> None:
    tpl, v, folder = setup
    answers = [
        {"role": "assistant", "content": "Sunny, 21 °C.", "reasoning_content": "Read the result."},
        {"role": "assistant", "content": "", "reasoning_content": "Call it.", "tool_calls": [CALL]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]}]
    ask = [{"role": "user", "content": "Weather?"}]
    ids = []
    for a in answers:
        whole = tpl.encode({"messages": [*ask, a], "add_generation_prompt": False}, v, date="2025-01-01")
        prompt = tpl.encode({"messages": ask}, v, date="2025-01-01")
        assert whole[:len(prompt)] == prompt
        ids.append(whole[len(prompt):])
    read = harmony(folder, [{"parse": x} for x in ids])["results"]
    for x, messages in zip(ids, read, strict=True):
        ours = tpl.parse(x, v, completion=True)
        reasoning = [m["text"] for m in messages if m["channel"] == "analysis"]
        finals = [m["text"] for m in messages if m["channel"] == "final"]
        calls = [(m["recipient"], m["text"]) for m in messages if m["recipient"]]
        assert "\n\n".join(reasoning) == ours.get("reasoning_content", "") and "".join(finals) == ours["content"]
        # String arguments are written through tojson, as the template
        # writes them: harmony reads the JSON string, xtml the string in it.
        assert [(r, t if isinstance(t, str) else text) for r, text in calls for t in [json.loads(text)]] == [
            (f"functions.{c['function']['name']}", c["function"]["arguments"]) for c in ours.get("tool_calls", [])]
        assert all(m["role"] == "assistant" for m in messages)
