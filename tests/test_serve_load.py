"""``xtml serve`` under load, against a stand-in vLLM. The engine
(tests/helpers/engines.py) and the gateway (the command line) each run in a process
of their own, so that the clients do not share their interpreter.

* **Streams**: 64 clients stream at once for ``XTML_LOAD_SECONDS`` (default
  60): 56 with httpx (each with a client and a connection of its own) and 8
  with the openai SDK.
* **Memory**: the gateway's resident size (from /proc) after the first
  1,000 requests and after ``XTML_LOAD_REQUESTS`` (default 10,000). Two
  cores stream about 120 to 170 short completions a second (the clients,
  gateway and engine each take about a third of the CPU), so 10,000 do not
  always fit in the minute: the requests still missing after it are whole
  (not streamed) completions from the same 64 clients, which cost the three
  processes about half as much, up to ``XTML_LOAD_MAX_SECONDS`` (default
  600) in all; then the count is checked.

Every streamed response must be a 200 whose joined deltas are exactly the
message xtml's batch parse gives for the ids the engine sent (nothing lost,
nothing twice, no stream getting another's ids), with one finish reason,
usage counting exactly those ids (httpx clients ask for it), ending with
``data: [DONE]``; every whole one the same message and usage. The gateway's
resident size after the last request must be within a few MiB of what it
was after the warm-up. This is a leak check, not a timing: nothing here is
timed."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.helpers.engines import closed_port
from tests.helpers.serve import K3, REQUEST, THINKING, answer_of, got_stream, vocab
from tests.helpers.tokenizers import deepseek_path
from xtml.serving.openai import shape_message

pytestmark = pytest.mark.load

ROOT = Path(__file__).parent.parent
SECONDS = float(os.environ.get("XTML_LOAD_SECONDS", "60"))
REQUESTS = int(os.environ.get("XTML_LOAD_REQUESTS", "10000"))
MAX_SECONDS = float(os.environ.get("XTML_LOAD_MAX_SECONDS", "600"))
CLIENTS = 64
SDK_CLIENTS = 8
WARMUP = 1000
GROWTH = 8 << 20
"""Resident memory the gateway may gain between the end of the warm-up and
the last request: allocator noise, not a leak (a leak of even 1 kB per
request would be 9 MB over 9,000)."""

# Short completions, so that 10,000 fit in a minute on a small machine:
# text, reasoning, calls, and marker literals inside a value.
MESSAGES: list[dict[str, Any]] = [
    {"role": "assistant", "reasoning_content": "Easy.", "content": "Four."},
    {"role": "assistant", "content": "Hello <|open|>there<|sep|>, \"friend\"."},
    {"role": "assistant", "reasoning_content": "Search.", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": json.dumps({"q": "xtml"})}}]},
    {"role": "assistant", "content": "Two calls.",
     "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": json.dumps({"expr": "2+2"})}},
                    {"type": "function", "function": {"name": "search",
                                                      "arguments": json.dumps({"q": "<|close|>call<|sep|>"})}}]},
]


def expected(ids: list[int]) -> dict[str, Any]:
    m = shape_message(K3.parse(ids, vocab(), completion=True, lenient=True, thinking=THINKING)).message
    return {"content": m["content"] or "", "reasoning_content": m.get("reasoning_content", ""),
            "calls": [[c["function"]["name"], c["function"]["arguments"]] for c in m.get("tool_calls", ())],
            "completion_tokens": len(ids)}


def assemble(events: list[str]) -> dict[str, Any]:
    """The message a client joins from the events of one stream, and the
    usage it was told; raises on anything out of place."""
    if events[-1] != "data: [DONE]" or events.count("data: [DONE]") != 1:
        raise AssertionError("the stream does not end with one data: [DONE]")
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str]] = {}
    finish = 0
    usage = None
    for e in events[:-1]:
        chunk = json.loads(e.removeprefix("data: "))
        if "error" in chunk:
            raise AssertionError(f"an error event: {chunk['error']}")
        if chunk.get("usage") is not None:
            if usage is not None or chunk["choices"]:
                raise AssertionError("usage twice, or with a choice")
            usage = chunk["usage"]
        for ch in chunk["choices"]:
            if usage is not None or finish:
                raise AssertionError("a chunk after the one with finish_reason or the usage")
            d = ch["delta"]
            content.append(d.get("content") or "")
            reasoning.append(d.get("reasoning_content") or "")
            for tc in d.get("tool_calls", ()):
                if "id" in tc:
                    if tc["index"] in calls:
                        raise AssertionError("a call started twice")
                    calls[tc["index"]] = [tc["function"]["name"], ""]
                calls[tc["index"]][1] += tc["function"].get("arguments", "")
            finish += ch["finish_reason"] is not None
    if finish != 1 or usage is None:
        raise AssertionError(f"{finish} chunks with a finish_reason, usage {usage}")
    return {"content": "".join(content), "reasoning_content": "".join(reasoning),
            "calls": [calls[k] for k in sorted(calls)], "completion_tokens": usage["completion_tokens"]}


def whole(completion: dict[str, Any]) -> dict[str, Any]:
    """The same from a whole chat.completion."""
    m = completion["choices"][0]["message"]
    return {"content": m["content"] or "", "reasoning_content": m.get("reasoning_content", ""),
            "calls": [[c["function"]["name"], c["function"]["arguments"]] for c in m.get("tool_calls") or ()],
            "completion_tokens": completion["usage"]["completion_tokens"]}


def sdk_assemble(chunks: list[Any]) -> dict[str, Any]:
    """The same from the openai SDK's chunk objects (no usage asked)."""
    got = got_stream(chunks)
    return {"content": got["content"], "reasoning_content": got["reasoning_content"],
            "calls": [list(c) for c in got["calls"]]}


def rss(pid: int) -> int:
    """Resident set size of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    # The log goes to a file: a pipe nobody reads would stop the server once full.
    with open(log, "w") as f:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=f, text=True)


def _stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, list[dict[str, Any]]]]:
    """(gateway URL, gateway pid, expected message per seed)."""
    answers = [answer_of(m) for m in MESSAGES]
    want = [expected(a) for a in answers]
    tmp = tmp_path_factory.mktemp("load")
    path = tmp / "answers.json"
    path.write_text(json.dumps(answers))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    engine = _start([sys.executable, "-m", "tests.helpers.engines", "--kind", "vllm", "--answers", str(path)], env,
                    tmp / "engine.log")
    gateway = None
    try:
        assert engine.stdout is not None
        line = engine.stdout.readline()
        assert line.startswith("port "), (line, (tmp / "engine.log").read_text())
        backend = f"http://127.0.0.1:{int(line.split()[1])}"
        port = closed_port()
        gateway = _start([sys.executable, "-m", "xtml", "serve", "--backend", backend, "--tokenizer", deepseek_path(),
                          "--add-markers", "--port", str(port), "--log-level", "warning"], env, tmp / "gateway.log")
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            if gateway.poll() is not None:
                raise RuntimeError(f"xtml serve exited: {(tmp / 'gateway.log').read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("xtml serve did not start in 60 s")
            time.sleep(0.1)
        yield url, gateway.pid, want
        for name in ("gateway", "engine"):
            log = (tmp / f"{name}.log").read_text()
            if log:
                print(f"{name} log:", log[-3000:])
    finally:
        if gateway is not None:
            _stop(gateway)
        _stop(engine)


def test_64_streaming_clients(servers: tuple[str, int, list[dict[str, Any]]]) -> None:
    url, pid, want = servers
    body = {**REQUEST, "stream": True, "stream_options": {"include_usage": True}}
    done = 0
    counts = {"httpx": 0, "sdk": 0, "whole": 0}
    errors: list[str] = []
    memory: dict[str, int] = {}
    took: dict[str, float] = {}
    counter = iter(range(10**9))

    def streaming(start: float) -> bool:
        return time.monotonic() < start + min(SECONDS, MAX_SECONDS)

    def more(start: float) -> bool:
        return done < REQUESTS and time.monotonic() < start + MAX_SECONDS

    def count(k: int, got: dict[str, Any], how: str) -> None:
        nonlocal done
        w = want[k % len(want)]
        if how == "sdk":
            w = {key: v for key, v in w.items() if key != "completion_tokens"}
        if got != w:
            raise AssertionError(f"request {k} ({how}): {got} != {w}")
        done += 1
        counts[how] += 1
        if done == WARMUP:
            memory["start"] = rss(pid)

    def failed(e: Exception) -> None:
        errors.append(f"{type(e).__name__}: {e}")
        if len(errors) > 20:
            raise e

    async def client(start: float) -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            while streaming(start):
                k = next(counter)
                try:
                    async with http.stream("POST", url + "/v1/chat/completions", json={**body, "seed": k}) as r:
                        if r.status_code != 200:
                            raise AssertionError(f"status {r.status_code}: {(await r.aread())[:300]!r}")
                        text = (await r.aread()).decode()
                    count(k, assemble([e for e in text.split("\n\n") if e]), "httpx")
                except Exception as e:
                    failed(e)
            while more(start):
                k = next(counter)
                try:
                    r = await http.post(url + "/v1/chat/completions", json={**REQUEST, "seed": k})
                    if r.status_code != 200:
                        raise AssertionError(f"status {r.status_code}: {r.content[:300]!r}")
                    count(k, whole(r.json()), "whole")
                except Exception as e:
                    failed(e)

    async def sdk_client(start: float) -> None:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60) as sdk:
            while streaming(start):
                k = next(counter)
                try:
                    stream = await sdk.chat.completions.create(model="kimi-k3", stream=True, seed=k, **REQUEST)
                    count(k, sdk_assemble([c async for c in stream]), "sdk")
                except Exception as e:
                    failed(e)

    async def run() -> None:
        start = time.monotonic()
        await asyncio.gather(*(client(start) for _ in range(CLIENTS - SDK_CLIENTS)),
                             *(sdk_client(start) for _ in range(SDK_CLIENTS)))
        took["seconds"] = time.monotonic() - start

    asyncio.run(run())
    memory["end"] = rss(pid)
    assert not errors, f"{len(errors)} errors, the first: {errors[:3]}"
    assert done >= REQUESTS, f"only {done} requests in the time allowed"
    assert counts["sdk"] >= SDK_CLIENTS, "the SDK's clients hardly got a request through"
    growth = memory["end"] - memory["start"]
    print(f"\n{done} requests in {took['seconds']:.0f} s: streamed {counts['httpx']} with httpx and "
          f"{counts['sdk']} with the openai SDK in the first {min(SECONDS, took['seconds']):.0f} s, then "
          f"{counts['whole']} whole; gateway RSS {memory['start'] / 2**20:.1f} MiB after {WARMUP}, "
          f"{memory['end'] / 2**20:.1f} MiB at the end")
    assert growth < GROWTH, f"the gateway grew by {growth / 2**20:.1f} MiB over {done - WARMUP} requests"
