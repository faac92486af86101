"""``xtml serve``'s Responses API: what writing a stream as Responses events
costs per chunk, beside writing the same chunks as chat-completion events.

    .venv/bin/python bench/bench_responses.py [--quick]

A long answer (reasoning, text and a call, as K3 ids) is parsed once by a
StreamParser into chat.completion.chunk objects, as the gateway makes them
one engine event at a time; then, each the median of several rounds, the
time per chunk of the gateway's chat encoding (``gateway.SSE``) and of the
Responses translation (``responses.Exchange.events``, typed events with
their sequence numbers) is printed. Both run in the gateway's event loop
for every streamed token, so this is the part of the per-token cost that
differs between the two endpoints.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers.serve import K3, answer_of
from tests.helpers.tokenizers import k3_vocab
from xtml.serving.gateway import SSE
from xtml.serving.openai import ChunkStream
from xtml.serving.responses import ResponseStore, translate


def _batches(words: int) -> tuple[ChunkStream, list[list[dict[str, Any]]], int]:
    message = {"role": "assistant", "reasoning_content": "step " * words, "content": "word é " * words,
               "tool_calls": [{"type": "function", "function": {"name": "search",
                                                                "arguments": json.dumps({"q": "x " * words})}}]}
    ids = answer_of(message)
    vocab = k3_vocab()
    parser = K3.stream(vocab, thinking=True)
    chunks = ChunkStream(model="kimi-k3", include_usage=True, template=K3)
    out = [chunks.feed(())]
    out += [chunks.feed(parser.feed(t)) for t in ids]
    out.append(chunks.feed(parser.close()))
    out.append(chunks.close(prompt_tokens=1, completion_tokens=len(ids)))
    return chunks, out, len(ids)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a shorter answer and fewer rounds")
    args = ap.parse_args(argv)
    words, rounds = (500, 5) if args.quick else (3000, 15)
    chunks, batches, n_ids = _batches(words)
    n = sum(map(len, batches))
    chat, resp = [], []
    for _ in range(rounds):
        sse = SSE(chunks)
        t = time.perf_counter()
        for b in batches:
            for c in b:
                sse(c)
        chat.append(time.perf_counter() - t)
        _, exchange = translate({"input": "hi"}, ResponseStore())
        t = time.perf_counter()
        for b in batches:
            exchange.events(b)
        resp.append(time.perf_counter() - t)
    c, r = statistics.median(chat) / n * 1e6, statistics.median(resp) / n * 1e6
    print(f"{n_ids:,} ids, {n:,} chunks, median of {rounds} rounds")
    print(f"chat.completion.chunk events: {c:.2f} us per chunk")
    print(f"Responses events:             {r:.2f} us per chunk ({r / c:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
